"""DistributedContext and DistributedDataFrame: the public entry points.

They mirror DataFusion's ``SessionContext`` and ``DataFrame`` so a DataFusion
user feels at home::

    from distfusion import DistributedContext, LocalRuntime
    ctx = DistributedContext(runtime=LocalRuntime(workers=4))
    ctx.register_parquet("lineitem", "data/tpch-sf1/lineitem/")
    df = ctx.sql("SELECT l_returnflag, count(*) FROM lineitem GROUP BY 1")
    print(df.explain())        # the stages, tasks and boundaries
    table = df.to_arrow_table()

The coordinator keeps a DataFusion ``SessionContext`` with every table
registered as in DataFusion: SQL is parsed, checked and optimized there (so
errors keep DataFusion's wording and arrive before any task starts), the
optimized logical plan goes to Substrait, and the distributed planner cuts it
into a :class:`~distfusion.stages.StageGraph` that the runtime runs.

This module holds the public API; what runs a query between it and the runtimes is
:mod:`distfusion.coordinator` (statements and DDL, the checks before planning, the
in-place path, the run, explain rendering), whose mixins these classes are.
"""

from __future__ import annotations

import datetime
import html
import os
from collections.abc import Callable

import pyarrow as pa
from datafusion import AggregateUDF, DataFrame, ScalarUDF, SessionConfig, SessionContext, WindowUDF
from datafusion.catalog import Table

from distfusion import udfs
from distfusion.coordinator.adaptive import AdaptiveReport
from distfusion.coordinator.catalog import TableCatalog, check_path, parquet_register_error
from distfusion.coordinator.checks import check_open
from distfusion.coordinator.execution import QueryExecution
from distfusion.coordinator.explain import (
    EXPLAIN,
    EXPLAIN_FORMATS,
    EXPLAIN_SCHEMA,
    FORMATS,
    ExplainRendering,
    explain_rows,
)
from distfusion.coordinator.query_run import Runtime
from distfusion.coordinator.results import ResultStream
from distfusion.coordinator.statements import (
    StatementRouting,
    plan_statements,
    split_statements,
    table_name,
)
from distfusion.dataframe import Readers, Transformations, mark_session, plan_label
from distfusion.dataframe.actions import datafusion_repr
from distfusion.display import show_table
from distfusion.errors import DistfusionError, NotDistributableError, PlanningError
from distfusion.io import object_store
from distfusion.io.iceberg import IcebergTable
from distfusion.io.sources import (
    TableSource,
    csv_source,
    feed_source,
    memory_source,
    parquet_source,
)
from distfusion.io.write import WrittenFile
from distfusion.metrics.query import QueryMetrics
from distfusion.planner.config import DistributedConfig
from distfusion.runtime.registry import runtime_from_name
from distfusion.spark_sql import PARSER_SETTINGS as SPARK_PARSER_SETTINGS
from distfusion.spark_sql import translate as translate_spark_sql
from distfusion.stages import StageGraph
from distfusion.substrait_plan import functions as substrait_functions
from distfusion.table_write import CatalogMounts, TableInserts, TableMerges, TableWrites
from distfusion.work_unit_feed.feed import FeedPartitionMetrics, lookup_feed
from distfusion.work_unit_feed.table import FeedTableSource

# DistributedConfig is defined with the planner settings derived from it
# (planner/config.py); it is public API here and in ``distfusion``.
__all__ = [
    "DistributedConfig",
    "DistributedContext",
    "DistributedDataFrame",
    "ResultStream",
    "plan_statements",
]


def _session_config(config: DistributedConfig) -> SessionConfig:
    """The coordinator's DataFusion settings: Spark SQL's parser settings for that dialect.

    ``information_schema`` is on, as in datafusion-python's ``SessionContext()``.
    """
    session = SessionConfig().with_information_schema(True)
    if config.sql_dialect == "spark":
        for key, value in SPARK_PARSER_SETTINGS.items():
            session = session.set(key, value)
    return session


def _default_runtime() -> Runtime:
    return runtime_from_name("spark")  # ImportError naming what to install without pyspark


class DistributedContext(
    StatementRouting, TableCatalog, Readers, TableInserts, TableMerges, CatalogMounts
):
    """Registers tables and plans SQL or DataFrames for distributed execution.

    Queries come as SQL (:meth:`sql`) or as DataFrames built with
    DataFusion's DataFrame API from :meth:`table`, :meth:`read_parquet`,
    :meth:`read_csv`, :meth:`from_arrow`, :meth:`from_pydict`,
    :meth:`from_pylist`, :meth:`from_pandas` or :meth:`from_datafusion`
    (:mod:`distfusion.dataframe`).

    Args:
        runtime: runs the stage graphs: a :class:`~distfusion.coordinator.query_run.Runtime`,
            or a zero-argument callable returning one, called on first use (so
            registering tables and SQL errors never wait for a cluster). Default:
            a :class:`~distfusion.runtime.spark.SparkRuntime` on an embedded
            ``local[*]`` SparkSession (or the active one), started on first use.
            Pass ``LocalRuntime()`` to run in-process without Spark.
        config: planner settings (:class:`DistributedConfig`).

    Attributes:
        functions: its Python UDFs (:class:`~distfusion.udfs.Functions`;
            :meth:`register_udf`, ...), and
        stores: its object stores (:class:`~distfusion.io.object_store.Stores`;
            :meth:`register_object_store`): its own, as a DataFusion
            ``SessionContext``'s, shipped with its queries' stages
            (:mod:`distfusion.session`); another context's never reach them.

    Raises:
        ImportError: (on first use) no ``runtime`` given and pyspark is not installed.
    """

    def __init__(
        self,
        runtime: Runtime | Callable[[], Runtime] | None = None,
        config: DistributedConfig | None = None,
    ):
        self._runtime: Runtime | None = None  # None: made by the factory on first use
        self._runtime_factory: Callable[[], Runtime] = _default_runtime
        if isinstance(runtime, Runtime) or not callable(runtime):
            self._runtime = runtime
        else:
            self._runtime_factory = runtime
        self.closed = False
        """Whether :meth:`close` ran: the context runs no more queries."""
        self.config = config or DistributedConfig()
        self.ctx = SessionContext(_session_config(self.config))
        self._marker = mark_session(self.ctx)  # tells this context's DataFrames apart
        # Its own UDFs and object stores, as a SessionContext's: shipped with its queries.
        self.functions = udfs.Functions()
        self.stores = object_store.Stores()
        self.sources: dict[str, TableSource] = {}
        self._written = False  # a write ran or may run: memory tables are read again
        self._feed_sources: dict[str, FeedTableSource] = {}
        self._held: dict[str, object] = {}  # table -> what its source needs (a Spark DataFrame)
        self._file_views: set[str] = set()  # tables of listed files: a view here (_register_files)
        # table -> why the coordinator's DataFusion cannot read it (only tasks can)
        self._not_on_coordinator: dict[str, str] = {}

    # ------------------------------------------------------------- registration
    def register_object_store(self, scheme: str, store, host: str | None = None) -> None:
        """Read and write ``scheme://host/...`` URLs through ``store``, here and on every worker.

        As DataFusion's ``SessionContext.register_object_store``, with its store
        classes as :mod:`distfusion.io.object_store` offers them (same names and
        arguments: ``AmazonS3``, ``GoogleCloud``, ``MicrosoftAzure``, ``Http``,
        ``LocalFileSystem``); they remember their arguments, so that each
        worker builds the store again before it decodes a task plan. Without
        explicit keys, every worker takes credentials from its own environment.
        A bucket with no store registered gets one from the environment when a
        table on it is registered (:func:`distfusion.io.object_store.spec_for`).

        Args:
            scheme: ``"s3://"``, ``"gs://"``, ``"az://"``, ``"abfss://"``, ``"https://"``, ...
            store: the store, e.g. ``AmazonS3(bucket_name="lake", region="eu-west-1")``.
            host: the bucket (container, host) it serves, as in DataFusion.

        Raises:
            TypeError: ``store`` is a plain ``datafusion.object_store`` store
                (use :mod:`distfusion.io.object_store`'s class of the same name).

        Example:
            >>> from distfusion import DistributedContext, LocalRuntime
            >>> from distfusion.io.object_store import AmazonS3
            >>> ctx = DistributedContext(runtime=LocalRuntime())
            >>> ctx.register_object_store("s3://", AmazonS3(bucket_name="lake"), "lake")
        """
        self.stores.register(scheme, store, host)
        object_store.register(scheme, store, host)  # the coordinator's listing and footer reads
        self.stores.add_to(self.ctx)

    def deregister_object_store(self, scheme: str, host: str | None = None) -> None:
        """Stop reading ``scheme://host/...`` through the store registered for it (DataFusion's)."""
        self.stores.deregister(scheme, host)
        object_store.deregister(scheme, host)
        try:
            self.ctx.deregister_object_store(scheme, host)
        except Exception:  # DataFusion's: none registered here
            pass

    def register_parquet(
        self,
        name: str,
        path: str | os.PathLike | list,
        schema: pa.Schema | None = None,
        table_partition_cols: list[tuple[str, str | pa.DataType]] | None = None,
    ) -> None:
        """Register the Parquet file, directory (recursively) or glob at ``path`` as ``name``.

        Each file becomes one work unit; its footer gives row counts and sizes.
        ``path`` may also be a list of files: exactly those (no partition
        columns then; without ``schema``, the first file's). It may be an object store URL (``s3://bucket/tpch/lineitem/``,
        ``gs://``, ``az://``, ``https://``): listed and its footers read through
        the store (:meth:`register_object_store`); every task reads its files
        from there. A glob in such a URL (``s3://bucket/t/*.parquet``, with
        ``table_partition_cols`` too) is listed through the store, as
        DataFusion lists globs in local paths only; the coordinator knows the
        table by its schema only, so its queries run in tasks
        (docs/object-stores.md).

        ``table_partition_cols`` (as DataFusion's ``register_parquet``): the table
        is partitioned by directory, Hive style, as Spark's ``partitionBy``
        writes it (``path/dt=2024-01-01/part-0.parquet``); each ``(column,
        Arrow type)`` is a column of the table, read from the directory names.
        A filter on those columns skips the other directories' files when the
        query is planned (``explain()`` says how many files remain).

        Raises:
            PlanningError: no Parquet file at ``path``, a file there is not
                Parquet (the message names it), DataFusion cannot read its
                schema, or a file is not below a ``column=value`` directory
                of every partition column.
        """
        if isinstance(path, list | tuple):
            if table_partition_cols:
                msg = "table_partition_cols needs a directory, not a list of files"
                raise ValueError(msg)
            self._register_files(name, "parquet", list(path), schema)
            return
        path = self._stores_for(os.fspath(path), ".parquet")
        cols = [(c, t) for c, t in (table_partition_cols or [])]
        if object_store.is_url(path) and object_store.is_glob(path):
            self._register_glob(name, "parquet", path, schema, partition_cols=cols)
            return
        check_path(name, path, ".parquet")
        try:
            self.ctx.register_parquet(name, path, schema=schema, table_partition_cols=cols or None)
            table_schema = self.ctx.table(name).schema()
            source = parquet_source(name, path, table_schema, tuple(c for c, _ in cols))
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            raise parquet_register_error(name, path, exc) from exc
        self._add(source)

    def register_csv(
        self,
        name: str,
        path: str | os.PathLike | list,
        schema: pa.Schema | None = None,
        has_header: bool = True,
        delimiter: str = ",",
    ) -> None:
        """Register the CSV file, directory or glob at ``path`` as ``name``.

        ``path`` may be an object store URL (a glob too) or a list of files,
        as for :meth:`register_parquet`.

        Raises:
            PlanningError: no CSV file at ``path``, or DataFusion cannot infer a schema.
        """
        options = {"has_header": has_header, "delimiter": delimiter}
        if isinstance(path, list | tuple):
            self._register_files(name, "csv", list(path), schema, options)
            return
        path = self._stores_for(os.fspath(path), ".csv")
        if object_store.is_url(path) and object_store.is_glob(path):
            self._register_glob(name, "csv", path, schema, options)
            return
        check_path(name, path, ".csv")
        try:
            self.ctx.register_csv(
                name, path, schema=schema, has_header=has_header, delimiter=delimiter
            )
            table_schema = self.ctx.table(name).schema()
        except Exception as exc:
            self._forget(name)
            raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from exc
        self._add(csv_source(name, path, table_schema, has_header, delimiter))

    def register_udf(self, udf: ScalarUDF) -> None:
        """Register a Python scalar UDF for SQL on this context and in every task.

        ``udf`` is a :class:`datafusion.ScalarUDF`. Local runtime: any, as
        DataFusion's ``udf()`` makes it. Spark: made by
        :func:`distfusion.udf` (DataFusion's arguments), so that its Python
        function travels with each Spark job. Flight: the workers load it at
        start (``distfusion worker --udf package.module:name``). See
        :mod:`distfusion.udfs`.

        Raises:
            TypeError: ``udf`` is not a ``datafusion.ScalarUDF``.
        """
        if not isinstance(udf, ScalarUDF):
            msg = f"register_udf takes a datafusion ScalarUDF (see distfusion.udf), got {udf!r}"
            raise TypeError(msg)
        self.ctx.register_udf(udf)
        self.functions.register(udf)

    def register_udaf(self, udaf: AggregateUDF) -> None:
        """Register a Python aggregate UDF for SQL on this context and in every task.

        ``udaf`` is a :class:`datafusion.AggregateUDF`; the runtimes get it as
        :meth:`register_udf`'s scalar UDFs do (Spark: made by
        :func:`distfusion.udaf`). It is planned as a non-decomposable
        aggregate (raw rows shuffled by the GROUP BY keys, or all rows to one
        task without keys) unless made by ``distfusion.udaf(...,
        mergeable=True)``: then partial aggregates run before the shuffle and
        only the accumulators' states cross it. See :mod:`distfusion.udfs`.

        Raises:
            TypeError: ``udaf`` is not a ``datafusion.AggregateUDF``.
        """
        if not isinstance(udaf, AggregateUDF):
            msg = (
                f"register_udaf takes a datafusion AggregateUDF (see distfusion.udaf), got {udaf!r}"
            )
            raise TypeError(msg)
        self.ctx.register_udaf(udaf)
        self.functions.register(udaf)

    def register_udwf(self, udwf: WindowUDF) -> None:
        """Register a Python window UDF for SQL on this context and in every task.

        ``udwf`` is a :class:`datafusion.WindowUDF`; the runtimes get it as
        :meth:`register_udf`'s scalar UDFs do (Spark: made by
        :func:`distfusion.udwf`). The window runs where the planner puts
        every window: rows shuffled by its PARTITION BY keys. See
        :mod:`distfusion.udfs`.

        Raises:
            TypeError: ``udwf`` is not a ``datafusion.WindowUDF``.
        """
        if not isinstance(udwf, WindowUDF):
            msg = f"register_udwf takes a datafusion WindowUDF (see distfusion.udwf), got {udwf!r}"
            raise TypeError(msg)
        self.ctx.register_udwf(udwf)
        self.functions.register(udwf)

    def register_record_batches(self, name: str, partitions: list[list[pa.RecordBatch]]) -> None:
        """Register in-memory batches as ``name``; each batch is one work unit.

        Raises:
            PlanningError: no batch, or batches with different schemas.
        """
        source = memory_source(name, partitions)
        self.ctx.register_record_batches(name, partitions)
        self._add(source)

    def register_table(
        self, name: str, table: pa.Table | Table, max_rows_per_unit: int = 65536
    ) -> None:
        """Register an Arrow table as ``name``, in units of at most ``max_rows_per_unit`` rows.

        A ``datafusion.catalog.Table`` (``df.into_view()``) is registered as
        DataFusion registers it (:meth:`register_view`).
        """
        if isinstance(table, Table):
            self._forget(name)
            self.ctx.register_table(name, table)
            return
        batches = table.to_batches(max_chunksize=max_rows_per_unit) or [
            pa.RecordBatch.from_pylist([], schema=table.schema)
        ]
        self.register_record_batches(name, [batches])

    def register_feed_table(self, name: str, source: FeedTableSource) -> None:
        """Register a feed-backed table: its work units are discovered while each query runs.

        ``source`` (a :class:`~distfusion.work_unit_feed.FeedTableSource`, e.g.
        a :class:`~distfusion.work_unit_feed.ListingFeed`) gives the schema,
        the :class:`~distfusion.work_unit_feed.WorkUnitFeed` whose provider
        runs here, on the coordinator, and ``read(unit)``, which runs on the
        workers. A leaf stage reading the table gets the source's desired
        task count (capped by the workers); task *i* reads feed partition *i*.
        The table is usable anywhere in SQL. Unlike :meth:`register_parquet`,
        nothing is listed now: files known at planning time are split between
        tasks by size before the query starts; a feed's units reach the tasks
        as the provider finds them.

        Raises:
            PlanningError: ``source`` has no Arrow schema or no feed, or asks
                for fewer than 1 task.
        """
        table = feed_source(name, source)
        self._forget(name)
        self._feed_sources[table_name(name)] = source  # the feed lives as long as its registration
        empty = pa.RecordBatch.from_pylist([], schema=table.schema)
        self.ctx.register_record_batches(name, [[empty]])
        self._add(table)

    def register_iceberg(
        self,
        name: str,
        table,
        snapshot_id: int | None = None,
        as_of: datetime.datetime | int | None = None,
        *,
        tasks: int | None = None,
    ) -> None:
        """Register a pyiceberg ``Table`` as ``name``: planned while each query runs, read natively.

        ``table`` comes from any pyiceberg catalog (REST, SQL, Glue, Hive) or
        is a ``StaticTable``. Its snapshot is fixed now: the current one,
        ``snapshot_id``, or the one current at ``as_of`` (time travel; the
        snapshot's schema is read, as pyiceberg and Spark read it). Each query
        plans the snapshot on the coordinator while it runs: manifests are
        read one by one, files pruned by partition and column bounds with the
        query's filters, and each data file streamed to a leaf task as soon as
        its manifest is read (a work unit feed, as Trino's split source). The
        tasks read the Parquet files natively with DataFusion through the
        object store of the table's location (one is made from the table's
        FileIO properties when none is registered), columns matched by
        Iceberg field id (renamed, added, promoted columns), position deletes
        applied; a table with equality deletes is refused. ``explain()``
        after a run says how many of the snapshot's data files were planned.
        docs/iceberg.md has the details.

        Args:
            name: the table name in SQL.
            table: a ``pyiceberg.table.Table``.
            snapshot_id: read this snapshot.
            as_of: read the snapshot current at this time: a ``datetime``
                (naive: local time) or milliseconds since the epoch.
            tasks: desired leaf tasks reading it (default: one per worker).

        Raises:
            ImportError: pyiceberg is not installed.
            PlanningError: both or an unknown ``snapshot_id`` / ``as_of``, a
                column type DataFusion cannot read, a manifest list that
                cannot be read (corrupt metadata; names its URL), equality
                delete files (named), a location no object store reads.
        """
        source = IcebergTable(table, snapshot_id, as_of, name=name, tasks=tasks)
        self._stores_for(table.location())  # the store its catalog's properties made
        self.register_feed_table(name, source)

    def deregister_table(self, name: str) -> None:
        """Forget table ``name`` (no error when unknown)."""
        self._forget(name)

    def table_names(self) -> list[str]:
        """Registered table names, sorted."""
        return sorted(self.sources)

    # ------------------------------------------------------------- queries
    def sql(self, query: str) -> DistributedDataFrame:
        """Plan ``query``; nothing runs until a result is asked for.

        ``query`` may hold several statements separated by semicolons. They are
        planned in order (:func:`plan_statements`); the result is the last
        statement that returns rows (a view it uses may be dropped by a later
        statement: the plan keeps the view's definition). With only DDL, the
        result is empty. DDL and DML follow DataFusion (:mod:`distfusion.coordinator.ddl`):

        - ``CREATE [OR REPLACE] TABLE t AS query`` (or ``AS VALUES``) runs
          ``query`` distributed, now, and keeps the result as memory table
          ``t``, split across tasks like :meth:`register_table`'s;
        - ``CREATE TABLE t (columns)`` makes an empty memory table;
        - ``CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'path'`` is
          :meth:`register_parquet` (``PARTITIONED BY`` columns as its
          ``table_partition_cols``); other formats or remote
          locations are read by DataFusion on the coordinator;
        - ``INSERT INTO`` a memory table (and ``UPDATE``/``DELETE`` where
          DataFusion supports them, ``COPY``) runs on the coordinator, when
          the result is collected (before the last statement: at once);
        - ``CREATE VIEW``, ``DROP TABLE``/``VIEW`` and ``SET`` act at once;
        - ``INSERT INTO``/``INSERT OVERWRITE`` a table registered with
          :meth:`register_delta` or :meth:`register_iceberg` runs at once,
          distributed, as one commit (:mod:`distfusion.table_write.sql`); so
          does ``MERGE INTO`` such a table (:mod:`distfusion.table_write.merge`).
        - ``lake.ns.t`` names a table of a catalog mounted by ``register_catalog`` (also in
          ``CREATE TABLE ... AS``, ``SHOW TABLES``; :mod:`distfusion.table_write.catalogs`).

        ``EXPLAIN [ANALYZE] [VERBOSE] [FORMAT TEXT|DOT|GRAPHVIZ|INDENT|TREE]
        query`` (the last statement) gives the distributed plan as rows
        ``(plan_type, plan)`` like DataFusion's EXPLAIN (see
        :func:`explain_rows`); with ``ANALYZE``, collecting the result runs
        ``query`` and the plan carries the metrics of that run.

        Raises:
            PlanningError: invalid SQL, an unknown table or column (the message
                is DataFusion's); ``INSERT INTO`` a table read from files (only
                memory tables take rows); an ``EXPLAIN`` format not listed
                above. Raised before any task starts.
            TaskError: a ``CREATE TABLE ... AS`` query failed in a task.
        """
        if self.config.sql_dialect == "spark":
            query = self._from_spark_sql(query)
        statements = split_statements(query)
        explain = EXPLAIN.match(statements[-1]) if statements else None
        if explain is not None:
            if statements[:-1]:
                self.sql(";\n".join(statements[:-1]))
            analyze, verbose, fmt, inner = explain.groups()
            fmt = (fmt or "text").lower()
            if fmt not in EXPLAIN_FORMATS:
                msg = (
                    f"EXPLAIN FORMAT {fmt.upper()} is not supported here; use one of "
                    f"{', '.join(f.upper() for f in EXPLAIN_FORMATS)}"
                )
                raise PlanningError(msg)
            return _ExplainDataFrame(
                self, self.sql(inner), bool(analyze), bool(verbose), EXPLAIN_FORMATS[fmt]
            )
        try:
            df = plan_statements(self.ctx, query, self._statement)
        except DistfusionError:
            raise
        except Exception as exc:  # DataFusion's bare Exception, message kept
            raise PlanningError(str(exc)) from exc
        label = " ".join(statements[-1].split())[:80] if statements else ""
        return DistributedDataFrame(self, df, label)

    def _from_spark_sql(self, query: str) -> str:
        """``query`` (Spark SQL) as DataFusion SQL with Spark's semantics (:mod:`.spark_sql`).

        Raises:
            SparkSemanticsError: no Spark-equal translation, or SQL sqlglot's
                Spark parser rejects (the message says why).
        """

        def schema_of(name: str) -> pa.Schema | None:
            return self.ctx.table(name).schema() if self.ctx.table_exist(name) else None

        substrait_functions.add_to(self.ctx)  # what the translation calls by name
        udfs = self.functions.return_types()
        return translate_spark_sql(query, schema_of, self.config.spark, udfs)

    def _frame(self, df: DataFrame, label: str) -> DistributedDataFrame:
        """A distributed DataFrame of this context around DataFusion's ``df``."""
        return DistributedDataFrame(self, df, label)

    @property
    def runtime(self) -> Runtime:
        """The runtime, created now if it was given as a callable (or defaulted).

        Raises:
            ContextClosedError: the context was closed.
        """
        check_open(self.closed, self._runtime)
        if self._runtime is None:
            self._runtime = self._runtime_factory()
        return self._runtime

    def close(self) -> None:
        """Release the runtime (if it was ever started); closing again does nothing.

        Then a query of this context, or of a DataFrame made from it, raises
        :class:`~distfusion.errors.ContextClosedError`.
        """
        if not self.closed and self._runtime is not None:
            self._runtime.close()
        self.closed = True

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


HTML_ROWS = 10
"""Rows a notebook shows of a DistributedDataFrame (``_repr_html_``)."""


class DistributedDataFrame(ExplainRendering, QueryExecution, Transformations, TableWrites):
    """A planned query. Results are computed by the runtime on each call.

    Mirrors ``datafusion.DataFrame``: its transformations (``select``,
    ``filter``, ``aggregate``, ``join``, ``sort``, ... of
    :class:`~distfusion.dataframe.Transformations`) build a new plan on the
    coordinator; :meth:`explain`, :meth:`to_arrow_table`, :meth:`collect`,
    :meth:`to_pandas`, :meth:`execute_stream`, :meth:`show`, ``count``,
    :meth:`write_parquet` run it distributed. After a run, :meth:`metrics`
    tells what it did.
    """

    def __init__(self, context: DistributedContext, df: DataFrame, label: str = "") -> None:
        self.context = context
        self.df = df
        self.label = label
        """A short name of the query (its SQL on one line), shown in Spark's UI."""
        self._metrics: QueryMetrics | None = None
        self._graph: StageGraph | None = None
        self._plan_bytes: bytes | None = None
        self._coordinator_only: str | None = None
        self.last_run: AdaptiveReport | None = None
        """What adaptive execution did in the last run (None before a run)."""
        self._ran: list[str] | None = None  # feed tables of the last run
        self._small: tuple[bool, list[str], int, int] | None = None  # see _small_in_place
        self._in_place: DataFrame | None = None  # see _in_place_df

    def schema(self) -> pa.Schema:
        """The result's Arrow schema."""
        return self.df.schema()

    def _derive(self, df: DataFrame) -> DistributedDataFrame:
        """A DataFrame of this context around ``df`` (a transformation's result)."""
        return DistributedDataFrame(self.context, df, plan_label(df))

    def _is_query(self) -> bool:
        return len(self.df.schema()) > 0  # DDL has no columns

    def coordinator_only(self) -> str | None:
        """Why the query runs whole on the coordinator, or None when it is distributed.

        One fallback for everything the distributed planner cannot cut into
        stages although DataFusion plans it: DataFusion's Substrait producer
        cannot express the plan (``WITH RECURSIVE``, ``UNNEST``, ``LEFT JOIN
        ... USING``), a round trip through Substrait would change its meaning
        (:func:`lost_in_substrait`: ``IGNORE NULLS``), or the planner raises
        :class:`~distfusion.errors.NotDistributableError` (DataFusion's consumer
        rejects a fragment, as for ``> ANY (subquery)``; a table function such
        as ``generate_series`` has no distfusion source). Such a query is not
        cut into stages: single-node DataFusion runs its own plan on the
        coordinator, over the tables as registered there, rather than refuse
        the query or answer another question. :meth:`explain` starts with
        ``coordinator only`` and the reason.

        Deciding may plan the query (and so start the runtime, for its worker
        count) when nothing before planning rules it out.

        Returns:
            A sentence naming the cause, or None.

        Raises:
            PlanningError: the runtime has no worker.
        """
        self._substrait()
        if self._coordinator_only is None and self._graph is None:
            try:
                self._graph = self._plan(self._planner_config())
            except NotDistributableError as exc:
                self._coordinator_only = f"the distributed planner cannot cut it: {exc}"
        return self._coordinator_only

    def stage_graph(self) -> StageGraph:
        """The static distributed plan (planned once, on first use).

        With adaptive execution (the default) a run may change the plan of
        the stages not yet run; :meth:`explain` after a run shows what ran.

        Raises:
            PlanningError: the query runs on the coordinator only
                (:meth:`coordinator_only` says why), or the runtime has no worker.
        """
        reason = self.coordinator_only()
        if reason is not None:
            msg = f"the query runs on the coordinator, not as stages: {reason}"
            raise PlanningError(msg)
        assert self._graph is not None  # coordinator_only() planned it
        return self._graph

    def explain(self, verbose: bool = False, analyze: bool = False, format: str = "text") -> str:
        """The distributed plan as text, Graphviz DOT or HTML.

        The arguments come in DataFusion's order (``explain(verbose, analyze)``);
        unlike DataFusion's, the plan is returned, not printed.

        Stages head first, with task counts, boundaries, work units per task and
        each stage's fragment as DataFusion renders it. After an adaptive run,
        the plan that ran, the measured size of every stage run before the
        rest was planned, and each adaptive decision with the sizes it used.

        Args:
            analyze: run the query now (its result is dropped) and annotate the
                plan with what the run did (:meth:`metrics`): per stage, rows
                and bytes out, task seconds min / median / max and their skew,
                CPU and input-wait seconds, bytes read from sources; per
                boundary, rows and bytes moved.
            verbose: each stage also shows the physical plan its tasks ran
                (with ``analyze``: DataFusion's operator metrics summed over
                the tasks, and one line per task), else the physical plan
                DataFusion makes of task 0's fragment here.
            format: ``"text"``; ``"dot"``: Graphviz source, one box per stage
                with its task count and, after a run, its metrics, edges
                labelled with the boundary and the bytes moved;
                ``"html"``: a table of the stages and the text, for notebooks.

        Raises:
            ValueError: ``format`` is not one of :data:`FORMATS`.
            PlanningError, TaskError, TransportError: with ``analyze``, as
                :meth:`execute_stream`.
        """
        if format not in FORMATS:
            msg = f"explain(format=...) takes one of {', '.join(FORMATS)}; got {format!r}"
            raise ValueError(msg)
        if analyze:
            for _ in self.execute_stream():
                pass
            return self.explain_run(verbose, format)
        return self._rendered(verbose, format)

    def explain_run(self, verbose: bool = False, format: str = "text") -> str:
        """The plan of the last run annotated with its metrics, without running again.

        What ``explain(analyze=True, ...)`` shows after its run (see
        :meth:`explain` for ``verbose`` and ``format``); before any run, the
        plan alone.

        Raises:
            ValueError: ``format`` is not one of :data:`FORMATS`.
        """
        if format not in FORMATS:
            msg = f"explain_run(format=...) takes one of {', '.join(FORMATS)}; got {format!r}"
            raise ValueError(msg)
        return self._rendered_run(verbose, format)

    def metrics(self) -> QueryMetrics | None:
        """What the last run of this DataFrame did, or None before a run.

        Measured on every runtime and returned with the tasks' output (see
        docs/observability.md): per task (:class:`~distfusion.metrics.TaskMetrics`:
        worker, output rows and bytes, elapsed, CPU and input-wait seconds,
        bytes read from sources and spilled, DataFusion's operator metrics),
        per stage (:class:`~distfusion.metrics.StageMetrics`: sums and
        min / median / max over the tasks) and per network boundary
        (:class:`~distfusion.metrics.BoundaryMetrics`: rows and bytes moved).
        A run stopped early (a LIMIT, the iterator closed) has the metrics
        of the tasks that finished. A query run on the coordinator only has
        no stage.
        """
        return self._metrics

    def _repr_html_(self) -> str:
        """The first rows as an HTML table, for notebooks (as datafusion-python renders them).

        Runs the query with ``LIMIT`` :data:`HTML_ROWS`; the plan is shown by
        an explicit ``explain(format="html")``.
        """
        table = self._head(HTML_ROWS)
        header = "".join(f"<th>{html.escape(n)}</th>" for n in table.column_names)
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>"
            for row in table.to_pylist()
        )
        return f"<table><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>"

    def _head(self, num: int) -> pa.Table:
        """The first ``num`` rows: the query run with a ``LIMIT`` (only those rows are read)."""
        return DistributedDataFrame(self.context, self.df.limit(num), self.label).to_arrow_table()

    def feed_metrics(self) -> dict[str, list[FeedPartitionMetrics]]:
        """Per-partition metrics of every work unit feed the query read in its last run.

        Returns:
            Feed table name -> one :class:`~distfusion.work_unit_feed.FeedPartitionMetrics`
            per partition (units, bytes, consumer wait seconds, provider
            seconds, buffer high-water mark); empty before a run or without feeds.
        """
        if self._ran is None:
            return {}
        out = {}
        for name in self._ran:
            source = self.context.sources.get(name)
            if source is None or not source.is_feed:
                continue
            try:
                feed = lookup_feed(source.options["feed_id"])
            except KeyError:
                continue
            out[name] = feed.metrics()
        return out

    def execute_stream(self, progress: bool = False) -> ResultStream:
        """Run the query; yield result batches as the head stage produces them.

        Closing the iterator before its end cancels every task of the query,
        also from another thread than the one reading it (:class:`ResultStream`).
        Every run is measured: :meth:`metrics` afterwards.

        Args:
            progress: show a live status line on stderr while the query runs
                (stages and tasks done, rows, seconds), refreshed about once a
                second; it asks the workers for their finished tasks' metrics
                each time (local, Flight) or reads Spark's status tracker.

        Raises:
            PlanningError: see :meth:`stage_graph`.
            TaskError: a task failed; names the stage, the task and the worker.
            TransportError: a worker could not be reached.
            ContextClosedError: the DataFrame's context was closed.
        """
        return ResultStream(*self._run(progress))

    def write_parquet(
        self,
        path: str | os.PathLike,
        partition_by: list[str] | None = None,
        mode: str = "error",
    ) -> list[WrittenFile]:
        """Run the query and write its result as Parquet files into directory ``path``.

        Every part of the head stage writes one file where it runs, in
        parallel: a Spark executor (Spark runtime, Flight data plane), a
        Flight worker (the one holding the output the part reads), a worker
        thread (local). On Spark's shuffle data plane the head runs whole on
        the driver and writes one file. A head that is a projection or filter over its
        inputs is cut into one part per producer task (one file each); any
        other head (an aggregate without keys, ``ORDER BY``, ``LIMIT``) is
        one part, so one file, in the query's order (:mod:`distfusion.worker.head_parts`).
        The commit is Hadoop's ``FileOutputCommitter``'s (:mod:`distfusion.io.write`):
        tasks write under ``path/_temporary/<query>/``, a task's files are
        moved into ``path`` only once the job succeeded, then ``_SUCCESS``
        is written; a failed or retried task leaves no partial or duplicate
        file, a failed job no file at all (its temporary files are deleted).

        On an object store (``path`` is ``s3://bucket/prefix/``, ...) tasks
        upload their files below ``_temporary`` and the job commit copies them
        into place, then writes ``_SUCCESS`` (a manifest of the files) last:
        readers wait for it (:mod:`distfusion.io.write`).

        Args:
            path: the output directory (made if missing), or an object store URL.
            partition_by: columns written as Hive-style ``key=value/``
                directories (not kept in the files), as Spark's ``partitionBy``.
            mode: ``"error"``: ``path`` must be missing or empty;
                ``"overwrite"``: its contents are deleted first.

        Returns:
            The files written, paths relative to ``path``, with their rows.

        Raises:
            ValueError: unknown ``mode``; ``partition_by`` names no column of
                the result, or all of them.
            OutputExistsError: ``path`` has files and ``mode`` is ``"error"``
                (also a ``FileExistsError``).
            PlanningError, TaskError, TransportError, ContextClosedError: as
                :meth:`execute_stream`.
        """
        return self._write_files("parquet", path, partition_by, mode)

    def write_csv(self, path: str | os.PathLike, mode: str = "error") -> list[WrittenFile]:
        """Run the query and write its result as CSV files (with a header) into ``path``.

        As :meth:`write_parquet` (no ``partition_by``); every file has the header line.
        CSV files carry no row counts: :attr:`WrittenFile.rows` is -1.

        Raises:
            As :meth:`write_parquet`.
        """
        return self._write_files("csv", path, None, mode)

    def write_json(self, path: str | os.PathLike, mode: str = "error") -> list[WrittenFile]:
        """Run the query and write its result as newline-delimited JSON files into ``path``.

        As :meth:`write_parquet` (no ``partition_by``); each line is written
        by DataFusion's JSON writer, as its ``write_json``. Rows: -1 (not counted).

        Raises:
            As :meth:`write_parquet`.
        """
        return self._write_files("json", path, None, mode)

    def collect(self, progress: bool = False) -> list[pa.RecordBatch]:
        """All result batches (see :meth:`execute_stream` for ``progress`` and errors)."""
        # Read in this thread: the batches themselves, without ResultStream's frames in
        # the traceback of an error (its close from another thread is not needed here).
        return list(self.execute_stream(progress=progress).batches)

    def to_arrow_table(self, progress: bool = False) -> pa.Table:
        """The result as an Arrow table (see :meth:`execute_stream` for ``progress`` and errors)."""
        batches = self.collect(progress=progress)
        if not batches:
            return self.schema().empty_table()
        return pa.Table.from_batches(batches)

    def to_pandas(self):
        """The result as a pandas DataFrame.

        Raises:
            ImportError: pandas is not installed (no dependency of distfusion's
                core; ``distfusion[spark]`` brings it); checked before the
                query runs.
            PlanningError, TaskError, TransportError: as :meth:`execute_stream`.
        """
        try:  # optional dependency
            import pandas  # noqa: F401
        except ImportError as exc:
            msg = "to_pandas() needs pandas: pip install pandas (or use to_arrow_table())"
            raise ImportError(msg) from exc
        return self.to_arrow_table().to_pandas()

    def to_pylist(self) -> list[dict]:
        """The result as a list of row dicts."""
        return self.to_arrow_table().to_pylist()

    def show(self, num: int = 20) -> None:
        """Print the first ``num`` rows as DataFusion's ``show`` does (the query runs with a LIMIT).

        Off a terminal the text is DataFusion's own, every column and cell
        whole; on a terminal, a table fitted to its width
        (:func:`~distfusion.display.show_table`).
        """
        show_table(self._head(num), num)

    def __repr__(self) -> str:
        """The first rows as DataFusion's ``repr`` shows them: runs the query with a ``LIMIT``.

        DataFusion's own text (:func:`~distfusion.dataframe.actions.datafusion_repr`);
        ``explain()`` shows the plan, ``schema()`` the columns.

        Raises:
            PlanningError, TaskError, TransportError, ContextClosedError: as
                :meth:`execute_stream`.
        """
        return datafusion_repr(self._head)


class _ExplainDataFrame(DistributedDataFrame):
    """The result of ``EXPLAIN [ANALYZE] query``: rows ``(plan_type, plan)``, made on collect."""

    def __init__(
        self,
        context: DistributedContext,
        inner: DistributedDataFrame,
        analyze: bool,
        verbose: bool,
        format: str,
    ) -> None:
        super().__init__(context, inner.df, inner.label)
        self.inner = inner
        self.analyze = analyze
        self.verbose = verbose
        self.format = format

    def schema(self) -> pa.Schema:
        """``plan_type``, ``plan`` (both strings)."""
        return EXPLAIN_SCHEMA

    def _transformed(self, method: str, build: Callable[[], DataFrame]) -> _ExplainDataFrame:
        """Refused: the rows of an EXPLAIN are made on collect, they have no plan to extend.

        Raises:
            PlanningError: always.
        """
        msg = (
            "the result of EXPLAIN cannot be transformed; "
            "use ctx.from_arrow(df.to_arrow_table()) to query its rows"
        )
        raise PlanningError(msg)

    def coordinator_only(self) -> str | None:
        """The explained query's answer (see :meth:`DistributedDataFrame.coordinator_only`)."""
        return self.inner.coordinator_only()

    def runs_in_place(self) -> str | None:
        """The explained query's answer (see :meth:`DistributedDataFrame.runs_in_place`)."""
        return self.inner.runs_in_place()

    def explain(self, verbose: bool = False, analyze: bool = False, format: str = "text") -> str:
        """The explained query's plan (see :meth:`DistributedDataFrame.explain`)."""
        return self.inner.explain(verbose, analyze, format)

    def metrics(self) -> QueryMetrics | None:
        """The metrics of the explained query's last run (``EXPLAIN ANALYZE``)."""
        return self.inner.metrics()

    def execute_stream(self, progress: bool = False) -> ResultStream:
        """One batch of the rows ``(plan_type, plan)`` (runs the query with ANALYZE).

        ``progress`` is not shown for an EXPLAIN.
        """
        rows = explain_rows(self.inner, self.analyze, self.verbose, self.format)
        columns = [pa.array([r[i] for r in rows], pa.string()) for i in (0, 1)]
        batch = pa.RecordBatch.from_arrays(columns, schema=EXPLAIN_SCHEMA)
        return ResultStream(iter([batch]), lambda: None)

    def to_arrow_table(self, progress: bool = False) -> pa.Table:
        """The rows ``(plan_type, plan)`` as a table."""
        return pa.Table.from_batches(self.collect(progress=progress), schema=EXPLAIN_SCHEMA)

    def _head(self, num: int) -> pa.Table:
        """The first ``num`` rows ``(plan_type, plan)``: what :meth:`show` prints.

        The plan, as DataFusion's ``show()`` of an EXPLAIN prints it, never
        the explained query's rows (with ANALYZE, the query runs once, for
        its metrics).
        """
        return self.to_arrow_table().slice(0, num)
