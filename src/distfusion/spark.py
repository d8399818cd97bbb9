"""distfusion for PySpark users: run SQL over Spark's tables, get a Spark DataFrame back.

Swap ``spark.sql(q)`` for ``distfusion.spark.sql(spark, q)`` in a pipeline::

    import distfusion.spark

    spark.read.parquet("data/tpch-sf1/lineitem").createOrReplaceTempView("lineitem")
    df = distfusion.spark.sql(spark, "SELECT l_returnflag, count(*) AS n FROM lineitem GROUP BY 1")
    df.to_spark().write.parquet("out/")     # the pipeline goes on in Spark
    df.to_pandas()                          # or Arrow/pandas, as in the core API

or start from a Spark DataFrame and go on with DataFusion's DataFrame API
(:func:`from_spark`)::

    from datafusion import col, lit, functions as F

    df = (
        distfusion.spark.from_spark(spark.table("lineitem"))
        .filter(col("l_quantity") > lit(45))
        .aggregate([col("l_returnflag")], [F.sum(col("l_extendedprice")).alias("total")])
    )
    df.to_spark().show()

The query runs on the same SparkSession with the
:class:`~distfusion.runtime.spark.SparkRuntime`: every task executes natively
with DataFusion inside a Spark task. Table names resolve from Spark's catalog
(temp views and tables of the current database) and from ``tables=``
(DataFrames of the pipeline and Delta tables, by name). Each becomes one of
these sources:

- **native**: a table whose optimized plan is a plain scan of Parquet or CSV
  files (Parquet partitioned by directory too), local or on an object store
  (``s3a://`` read as ``s3://`` with the bucket's ``fs.s3a.*`` settings, ``gs://``,
  ``abfss://``), is read by DataFusion in the tasks, its files from Spark's
  relation and its schema from Spark.
- **Delta tables** given in ``tables=`` (a ``deltalake.DeltaTable`` or the
  path or URL of its root, local or on an object store) are read natively
  from their log, with no Spark job and no Delta connector in Spark
  (:meth:`~distfusion.context.DistributedContext.register_delta`).
- **through Spark**: anything else -- a view with a filter or a join, a
  DataFrame built with the DataFrame API, JSON, ORC, JDBC, Hive or any format
  Spark reads -- is computed by Spark: the leaf stage reading it runs over the
  DataFrame's own partitions (coalesced to the stage's task count, which
  follows Spark's size estimate, at least one task per worker), each task
  inside the Spark task computing its partition and fed that partition's
  Arrow batches
  (:mod:`distfusion.worker.spark_partitions`); Spark computes only the
  columns the query reads. Nothing is collected on the driver. It costs
  Spark's own work for the DataFrame plus its conversion to Arrow (as
  ``toArrow()`` pays, but per partition on the executors); a
  fragment that is linear in the table (filters, projections, partial
  aggregates) runs over each 64 MiB of batches as they come, anything else
  holds the task's partition in memory first. Only the Spark runtime runs
  such a query: another runtime raises :class:`~distfusion.errors.PlanningError`.

A pyiceberg ``Table`` given in ``tables=`` is neither: it is registered with
:meth:`~distfusion.context.DistributedContext.register_iceberg`, planned on
the driver while the query runs and read natively by the tasks, which pull
its data files from the driver's feed endpoint (docs/iceberg.md).

Names and types of tables read through Spark:

- Spark resolves names case-insensitively, DataFusion folds unquoted
  identifiers to lower case: table names and the columns of tables read
  through Spark are lower-cased, so unquoted names of any case resolve as in
  Spark (two columns differing only in case are refused). Native tables keep
  their files' column names (quote a mixed-case one).
- Spark types map to Arrow as PySpark's ``to_arrow_schema`` maps them (Spark's
  own Arrow conversion): ``TIMESTAMP`` becomes ``timestamp[us]`` in
  ``spark.sql.session.timeZone`` (the same instants; DataFusion then computes
  ``date_trunc``, ``extract`` and casts in that zone, as Spark does),
  ``TIMESTAMP_NTZ`` ``timestamp[us]`` without zone, ``STRING`` ``utf8``,
  ``DECIMAL(p,s)`` ``decimal128(p,s)``, ``DATE`` ``date32``, arrays, maps and
  structs as Arrow's. A type PySpark cannot convert raises
  :class:`~distfusion.errors.PlanningError` naming the table.

:func:`sql` answers as Spark SQL (:mod:`distfusion.spark_sql`; docs/spark.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import logging
import os
import re
import uuid
import weakref

import pyarrow as pa
from datafusion import AggregateUDF, WindowUDF, col

from distfusion.context import DistributedConfig, DistributedContext, DistributedDataFrame
from distfusion.coordinator.checks import check_coordinator_reads
from distfusion.coordinator.results import ResultStream, named
from distfusion.errors import PlanningError, SparkSemanticsError
from distfusion.io import delta, object_store
from distfusion.io.sources import spark_source
from distfusion.runtime.spark import (
    SparkRuntime,
    hold_dataframe,
    import_pyspark,
    spark_arrow_schema,
)
from distfusion.runtime.spark.connect_frames import file_scan, is_connect_dataframe
from distfusion.runtime.spark.dataframes import spark_statistics
from distfusion.runtime.spark.files import native_path
from distfusion.runtime.spark.session_udfs import SPARK_UDF_ERROR, called_functions, session_udfs
from distfusion.spark_sql import SparkSettings, table_names
from distfusion.spark_sql import parse as parse_spark_sql
from distfusion.spark_sql.schema import as_spark_schema, spark_schema
from distfusion.worker.spark_tasks import as_schema, frame_function

__all__ = [
    "sql",
    "from_spark",
    "register_spark_table",
    "register_spark_dataframe",
    "SparkDataFrame",
    "FALLBACKS",
    "to_spark_compatible",
]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_FORMATS = {"parquet": "parquet", "csv": "csv"}
_log = logging.getLogger("distfusion.spark")
_logged_fallbacks: set[str] = set()
_VALUE_ERROR = re.compile(
    rf"overflow|Cast error|Can't cast|Cannot cast|Divide by zero|{SPARK_UDF_ERROR}", re.I
)
FALLBACKS = ("spark", "error")
"""What :func:`sql`'s ``fallback`` takes."""
_runtimes: dict[int, SparkRuntime] = {}
_contexts: dict[int, DistributedContext] = {}  # SparkSession -> from_spark's context


class SparkDataFrame(DistributedDataFrame):
    """A distfusion query planned over Spark's tables; converts to a Spark DataFrame.

    Everything of :class:`~distfusion.context.DistributedDataFrame`
    (``explain``, ``to_arrow_table``, ``to_pandas``, ``execute_stream``, ...)
    plus :meth:`to_spark`, :meth:`spark_column_names` and :meth:`release`.

    Args:
        context: the context that planned ``df``.
        df: the planned query.
        spark: the SparkSession :meth:`to_spark` creates its DataFrame in.
        query: the SQL text ``df`` was planned from, if any: its Spark SQL
            column names name :meth:`to_spark`'s columns.
        spark_struct: Spark's analysis of ``query`` (a ``StructType``), if
            known: the schema of :meth:`to_spark`, and as Arrow (``toArrow()``'s
            types) the result's names and types, which differ from the plan's
            only in names, time zones and list elements' names.
    """

    def __init__(
        self, context: DistributedContext, df, spark, query: str | None = None, spark_struct=None
    ) -> None:
        label = df.label if isinstance(df, DistributedDataFrame) else ""
        super().__init__(context, df.df if isinstance(df, DistributedDataFrame) else df, label)
        self.spark = spark
        self.query = query
        self._spark_struct = spark_struct
        self._spark_schema = (  # its names (repeated ones too), zones, element names
            None if spark_struct is None else spark_arrow_schema(spark_struct, "UTC")
        )
        self.fallback: str | None = None
        """Why the query runs as ``spark.sql(query)`` itself, or None when distfusion runs it."""
        self._held: list[_HeldResult] = []

    def spark_column_names(self) -> list[str]:
        """The result's column names as Spark SQL names them: what :meth:`to_spark` uses.

        :func:`sql` gives its result Spark's names (Spark's analysis of the
        query: ``sum(l_quantity)`` where DataFusion says
        ``sum(lineitem.l_quantity)``, an alias ``AS N`` keeping its case);
        a query Spark cannot analyze (one reading ``tables=``) and a
        DataFrame of :func:`from_spark` keep DataFusion's.

        Returns:
            One name per result column, in order.
        """
        return list(self.schema().names)

    def schema(self) -> pa.Schema:
        """The result's Arrow schema, with Spark's column names."""
        return self._spark_schema or super().schema()

    def execute_stream(self, progress: bool = False) -> ResultStream:
        """As :meth:`DistributedDataFrame.execute_stream`, batches with Spark's names and types."""
        stream = super().execute_stream(progress=progress)
        if self._spark_schema is None or self._spark_schema == super().schema():
            return stream
        return ResultStream(_as_spark_batches(stream.batches, self._spark_schema), stream.close)

    def collect(self, progress: bool = False) -> list[pa.RecordBatch]:
        """As :meth:`DistributedDataFrame.collect`; Spark's answer where DataFusion fails on values.

        Spark rounds a decimal product past 38 digits, wraps an integer
        without ANSI mode, reads ``' 7 '`` as a number, or raises its own
        error, where DataFusion's arithmetic overflows or its cast fails: a
        query of :func:`sql` whose tasks fail so runs again as
        ``spark.sql(query)`` (here and in :meth:`to_spark`), and
        :attr:`fallback` says why.
        """
        try:
            return super().collect(progress=progress)
        except Exception as exc:  # a TaskError, or DataFusion's own on the coordinator
            self._rerun_on_spark(exc)
            return self.spark.sql(self.query).toArrow().to_batches()

    def _rerun_on_spark(self, exc: Exception) -> None:
        """Re-raise ``exc`` unless it is a failure on a value Spark may answer; then say so."""
        if self.query is None or self._spark_struct is None or not _VALUE_ERROR.search(str(exc)):
            raise exc
        self.fallback = f"DataFusion failed on a value where Spark may not: {exc}"
        _log.warning("distfusion.spark.sql runs a query on Spark SQL: %s", self.fallback)

    def to_pandas(self):
        """The result as pandas, as ``toPandas()`` gives it: times local to the session's zone.

        A ``TIMESTAMP`` column holds naive times in ``spark.sql.session.timeZone``
        (PySpark's conversion), in nanoseconds as every time stamp; everything
        else is :meth:`to_arrow_table`'s.

        Raises:
            ImportError, PlanningError, TaskError, TransportError: as
                :meth:`DistributedDataFrame.to_pandas`.
        """
        frame = super().to_pandas()
        zone = self.spark.conf.get("spark.sql.session.timeZone")
        for i, f in enumerate(self.schema()):
            if pa.types.is_timestamp(f.type):
                local = frame.iloc[:, i]
                if f.type.tz:
                    local = local.dt.tz_convert(zone).dt.tz_localize(None)
                frame.isetitem(i, local.astype("datetime64[ns]"))  # toPandas()'s unit
        return frame

    def _derive(self, df) -> SparkDataFrame:
        """A transformation's result: a SparkDataFrame of the same context and session."""
        return SparkDataFrame(self.context, DistributedDataFrame._derive(self, df), self.spark)

    def to_spark(self):
        """The result as a Spark DataFrame on the same SparkSession, computed on the executors.

        As :meth:`_to_spark`; ``spark.sql(query)`` itself where DataFusion fails
        on a value before the DataFrame is returned (see :meth:`collect`).

        Raises:
            TaskError: a task failed (see :meth:`execute_stream`).
        """
        try:
            return self._to_spark()
        except Exception as exc:
            self._rerun_on_spark(exc)
            return self.spark.sql(self.query)

    def _to_spark(self):
        """The result as a Spark DataFrame on the same SparkSession, computed on the executors.

        Its columns have Spark SQL's names for the query
        (:meth:`spark_column_names`) and the result's types converted to Spark's.

        Every stage but the head runs now, on the executors (their outputs
        stay in the executors' Flight workers). The Spark DataFrame returned
        reads them: its partition *i* runs part *i* of the head stage on an
        executor (``spark.range(n, numPartitions=n).mapInArrow(...)``), so
        nothing of the result passes through the driver
        (:mod:`distfusion.worker.head_parts`):

        - a head that is a projection or filter of its inputs (a join, a
          grouped aggregate, a filter: the stage below it did the work) gets
          one partition per task of the stage it reads;
        - any other head (an aggregate without keys, a global ``ORDER BY``,
          a ``LIMIT``) is one partition, in the query's order; when its
          inputs hold at most ``SparkRuntime.driver_stage_bytes`` (64 MiB) it
          runs on the driver instead, and the result is handed to
          ``spark.createDataFrame`` (as for a query run on the coordinator
          only, or on the ``shuffle`` data plane).

        **Lifetime.** The outputs the partitions read are held by the
        executors' workers until the returned DataFrame object is garbage
        collected (and this SparkDataFrame too: both keep them), until
        :meth:`release`, or until the runtime or its session is closed;
        a driver that is gone stops renewing them and the executors drop them
        after ``EXECUTOR_QUERY_TTL_S`` (600 s). While held, a tiny Spark job
        every 20 s keeps the executors' Python workers from PySpark's
        one-minute idle timeout. A DataFrame derived from the returned one
        (``.filter``, ``.join``) does not keep it alive: keep a reference to
        it until the last action. Spark may compute a partition several
        times (each action, a retried task): each reads the held outputs again.

        Raises:
            TaskError: a task failed (see :meth:`execute_stream`).
        """
        from pyspark.sql.pandas.types import from_arrow_schema  # optional dependency

        runtime = self.context.runtime
        if (
            self.coordinator_only() is not None
            or not isinstance(runtime, SparkRuntime)
            or runtime.data_plane != "flight"
            or not runtime.serves(self.spark)
        ):
            return self._on_driver()
        query_id = str(uuid.uuid4())
        run = runtime.start_query(query_id)
        try:
            graph = self._prepare(run, query_id)
            parts = run.head_parts(graph)
            if len(parts) == 1 and run.head_input_bytes(graph) <= runtime.driver_stage_bytes:
                batches = list(named(run.stream_head(graph), self.schema()))
                return self._created(batches)
            schema = to_spark_compatible(self.schema().empty_table()).schema
            access, budget, threads = run.part_args(graph, parts)
            fn = frame_function(parts, access, budget, threads, schema)
            frame = self.spark.range(0, len(parts), 1, len(parts)).mapInArrow(
                fn, self._spark_struct or from_arrow_schema(schema)
            )
            frame = self._spark_named(frame)
        except BaseException:
            run.close()
            raise
        held = _HeldResult(run)
        runtime.held_results[query_id] = run
        run.keep_warm()
        frame._distfusion_result = held  # the DataFrame keeps the outputs
        self._held.append(held)
        return frame

    def release(self) -> None:
        """Release the outputs every :meth:`to_spark` of this DataFrame holds (idempotent).

        A Spark DataFrame returned earlier fails when it is computed again.
        """
        for held in self._held:
            held.run.close()
        self._held.clear()

    def _on_driver(self):
        """The result collected here and handed to ``spark.createDataFrame``."""
        return self._created(self.collect())

    def _created(self, batches: list[pa.RecordBatch]):
        from pyspark.sql.pandas.types import from_arrow_schema  # optional dependency

        table = pa.Table.from_batches(batches) if batches else self.schema().empty_table()
        table = to_spark_compatible(table)
        # Spark's schema given: nullability of elements, TIMESTAMP_NTZ (inferred, a TIMESTAMP)
        schema = self._spark_struct or from_arrow_schema(table.schema)
        frame = self.spark.createDataFrame(table, schema=schema)
        return self._spark_named(frame)

    def _spark_named(self, frame):
        """``frame`` with :meth:`spark_column_names` (a projection; nothing runs)."""
        names = self.spark_column_names()
        return frame if frame.columns == names else frame.toDF(*names)


class _HeldResult:
    """Keeps a query's outputs while referenced: closes its run when garbage collected."""

    def __init__(self, run) -> None:
        self.run = run
        weakref.finalize(self, _close_quietly, run)


def _close_quietly(run) -> None:
    """Close ``run``; at interpreter exit its workers or session may be gone already."""
    try:
        run.close()
    except Exception:  # nothing left to release
        pass


def to_spark_compatible(table: pa.Table) -> pa.Table:
    """``table`` with Arrow types Spark reads: view and large string/binary -> plain.

    Returns:
        The same rows and names; only column types change.
    """
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(f.with_type(t))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


def _runtime_for(spark) -> SparkRuntime:
    runtime = _runtimes.get(id(spark))
    if runtime is None or not runtime.serves(spark):
        runtime = SparkRuntime(spark=spark)  # a SparkConnectRuntime for a Connect session
        _runtimes[id(spark)] = runtime
    return runtime


def _context_for(spark) -> DistributedContext:
    """The DistributedContext :func:`from_spark` registers into by default: one per session.

    On the session's runtime (:func:`_runtime_for`); a new one when that runtime is new.
    """
    runtime = _runtime_for(spark)
    ctx = _contexts.get(id(spark))
    if ctx is None or ctx._runtime is not runtime:
        ctx = DistributedContext(runtime=runtime)
        _contexts[id(spark)] = ctx
    return ctx


def from_spark(
    df, name: str | None = None, context: DistributedContext | None = None
) -> SparkDataFrame:
    """A Spark DataFrame as an input table of a distfusion DataFrame; back with ``to_spark()``.

    ``df`` is registered as :func:`sql`'s ``tables=`` registers a DataFrame:
    read natively when its plan is a plain scan of Parquet or CSV files,
    else through Spark, each leaf task fed one of its partitions inside the
    Spark task computing it (the module's docstring). The result offers
    DataFusion's DataFrame API (:mod:`distfusion.dataframe`: ``filter``,
    ``aggregate``, ``join``, ...; expressions from ``datafusion.col``,
    ``lit``, ``functions``), runs on the Spark runtime of ``df``'s session,
    and every DataFrame derived from it is a :class:`SparkDataFrame`, so
    :meth:`SparkDataFrame.to_spark` hands the result back to Spark::

        from datafusion import col, lit, functions as F

        big = distfusion.spark.from_spark(spark.table("lineitem")).filter(
            col("l_quantity") > lit(45)
        )
        orders = distfusion.spark.from_spark(spark.table("orders"))
        big.join(orders, left_on="l_orderkey", right_on="o_orderkey").aggregate(
            [col("o_orderpriority")], [F.count_star().alias("n")]
        ).to_spark().show()

    DataFrames from one SparkSession share a context by default (one per
    session), so they join each other; ``frame.context`` is that
    :class:`~distfusion.context.DistributedContext` (``read_parquet`` and
    ``register_delta`` there give more inputs to the same plans, ``sql``
    reads the tables by name). Registered tables stay in that context until
    ``frame.context.deregister_table(name)``.

    Args:
        df: a ``pyspark.sql.DataFrame``, classic or Spark Connect's.
        name: the table's name in the context (default: a generated
            ``spark_df_<hex>``); case-insensitive, as in :func:`sql`.
        context: the context to register into (default: the session's); its runtime
            must be a :class:`~distfusion.runtime.spark.SparkRuntime` on ``df``'s
            session when a table is read through Spark.

    Returns:
        A :class:`SparkDataFrame` reading the whole table.

    Raises:
        ImportError: pyspark is not installed.
        TransportError: ``df``'s session is a Spark Connect session whose
            server does not answer (names its URL and how to start one).
        TypeError: ``df`` is not a Spark DataFrame.
        PlanningError: a table ``name`` exists already in the context; as
            :func:`register_spark_dataframe` (a type Arrow cannot express,
            columns differing only in case).
    """
    import_pyspark()
    from pyspark.sql import DataFrame  # optional dependency

    if not isinstance(df, DataFrame):
        msg = (
            f"from_spark takes a pyspark.sql.DataFrame (classic or Spark Connect), got "
            f"{type(df).__module__}.{type(df).__name__}"
        )
        raise TypeError(msg)
    spark = df.sparkSession
    ctx = context if context is not None else _context_for(spark)
    name = (name or f"spark_df_{uuid.uuid4().hex[:16]}").lower()
    if ctx.ctx.table_exist(name):  # earlier DataFrames would read a replacement
        msg = f"from_spark: a table {name!r} exists already; deregister_table it first"
        raise PlanningError(msg)
    if not _register_native(ctx, df, name, name):
        register_spark_dataframe(ctx, name, df)
    return SparkDataFrame(ctx, ctx.table(name), spark)


def _referenced_names(query: str) -> set[str]:
    """Identifiers in ``query`` (string literals removed), lower-cased: the table candidates."""
    return {w.lower() for w in _WORD.findall(_LITERAL.sub("''", query))}


def sql(
    spark,
    query: str,
    runtime: SparkRuntime | None = None,
    config: DistributedConfig | None = None,
    tables: dict | None = None,
    udfs: list | None = None,
    fallback: str = "spark",
) -> SparkDataFrame:
    """Answer Spark SQL ``query`` as ``spark.sql(query)`` does, with distfusion where it can.

    The drop-in for ``spark.sql``. The query is read as Spark SQL and run
    natively, distributed on the session's executors, when every construct in
    it has a translation with Spark's semantics (:mod:`distfusion.spark_sql`:
    NULL order, ``/``, decimal types and rounding, ANSI mode as the session
    sets ``spark.sql.ansi.enabled``) and the result's schema equals Spark's
    analysis of the query (``spark.sql(query).schema``: names and types; the
    result is cast to it). Otherwise it runs as ``spark.sql(query)`` itself,
    on the same session: the result's :attr:`SparkDataFrame.fallback` says
    why, :meth:`~SparkDataFrame.explain`'s first line too, and the reason is
    logged once (logger ``distfusion.spark``, WARNING). Statements that are
    not queries (DDL, DML, ``SET``) go to Spark the same way. A query Spark
    rejects raises Spark's own error.

    Tables the query names (temp views and tables of the current database,
    unqualified, case-insensitive) are registered with
    :func:`register_spark_table`; ``tables`` are registered first and win
    over catalog tables of the same name. Nothing runs until a result is
    asked for (a statement that is not a query runs at once, as in Spark).

    Args:
        spark: the SparkSession; its catalog names the tables and its
            SparkContext runs the tasks.
        query: one Spark SQL statement.
        runtime: the Spark runtime to use (default: one per SparkSession, created
            on first use, with default settings).
        config: planner settings; its ``sql_dialect`` and ``spark`` are set
            to ``"spark"`` and the session's settings.
        tables: more tables by name: Spark DataFrames of ``spark`` (any plan:
            native when a plain file scan, else :func:`register_spark_dataframe`),
            Delta tables (a ``deltalake.DeltaTable``, or the path or URL of a
            table's root: read natively from its log, as
            :meth:`~distfusion.context.DistributedContext.register_delta`), or
            paths and object store URLs of Parquet (CSV: ``.csv``) files,
            read natively (``s3://bucket/prefix/``: the store from the
            environment unless registered), or pyiceberg ``Table`` objects
            (read natively by the tasks, planned on the driver while the
            query runs: :meth:`DistributedContext.register_iceberg`; the
            executors pull the data files from the driver's feed endpoint);
            names case-insensitive. Spark's catalog does not know them, so a
            query reading one is not checked against Spark's analysis and
            cannot run on Spark SQL.
        udfs: Python UDFs the query calls (``distfusion.udf``, ``udaf``,
            ``udwf``); they travel to the executors with the tasks. The
            session's own (``spark.udf.register``, ``@udf``, ``@pandas_udf``,
            ``@arrow_udf``) are found in Spark's analysis of the query and run in
            the tasks with Spark's conversions (:mod:`.runtime.spark.session_udfs`).
        fallback: ``"spark"`` (default): run on Spark SQL what distfusion
            cannot run with Spark's semantics; ``"error"``: raise
            :class:`~distfusion.errors.SparkSemanticsError` instead.

    Returns:
        A :class:`SparkDataFrame`; ``.to_spark()`` gives a Spark DataFrame.

    Raises:
        ImportError: pyspark is not installed.
        TransportError: ``spark`` is a Spark Connect session whose server does
            not answer (names its URL and how to start one), found in seconds.
        ValueError: ``fallback`` is not one of :data:`FALLBACKS`.
        SparkSemanticsError: with ``fallback="error"``, the reason it would
            run on Spark SQL; also when it reads ``tables`` that Spark's
            catalog does not know and cannot be translated.
        PlanningError: invalid SQL, an unknown table or column, or a table
            distfusion cannot read (the message names it and says why), for
            a query Spark's analysis also rejects.
        TypeError: a value of ``tables`` is neither a Spark DataFrame, a Delta
            table, a pyiceberg Table nor a path, or one of ``udfs`` is not a
            DataFusion UDF.
        Exception: Spark's own error for a query that runs on Spark SQL and fails there.
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}; got {fallback!r}")
    import_pyspark()
    runtime = runtime or _runtime_for(spark)
    config = dataclasses.replace(
        config or DistributedConfig(), sql_dialect="spark", spark=SparkSettings.of_session(spark)
    )
    ctx = DistributedContext(runtime=runtime, config=config)
    for f in udfs or ():
        if isinstance(f, AggregateUDF):
            ctx.register_udaf(f)
        elif isinstance(f, WindowUDF):
            ctx.register_udwf(f)
        else:
            ctx.register_udf(f)  # TypeError for anything else
    for name, df in (tables or {}).items():
        if _register_delta(ctx, name.lower(), df):
            continue
        if isinstance(df, str | os.PathLike):  # files, local or on an object store
            path = os.fspath(df)
            if path.endswith(".csv"):
                ctx.register_csv(name.lower(), path)
            else:
                ctx.register_parquet(name.lower(), path)
        elif _is_iceberg_table(df):
            ctx.register_iceberg(name.lower(), df)
        elif not _is_spark_dataframe(df) or not _register_native(ctx, df, name, name.lower()):
            register_spark_dataframe(ctx, name.lower(), df)
    # tables= and udfs= are the caller's: Spark's catalog lacks them, Spark cannot analyze them
    own = {n.lower() for n in tables or ()} | {f.name.lower() for f in udfs or ()}
    uses_own = bool(_referenced_names(query) & own)
    try:  # nothing is registered, and Spark analyzes nothing, for what cannot be parsed
        parsed = parse_spark_sql(query)
        for f in session_udfs(spark, query, called_functions(parsed) - own):  # Spark's analysis
            ctx.register_udf(f.datafusion_udf())
    except SparkSemanticsError as exc:
        if fallback == "error" or uses_own:
            raise
        return _SparkSqlResult(ctx, spark, query, str(exc))
    unreadable: dict[str, str] = {}
    for name in table_names(parsed) - set(ctx.sources):  # by name: listTables() takes ~0.3 s
        try:
            register_spark_table(ctx, spark, name)
        except PlanningError as exc:
            unreadable[name] = str(exc)
    expected = None if uses_own else spark_schema(spark, query)
    try:
        df = ctx.sql(query)
        if expected is not None:
            try:
                arrow = spark_arrow_schema(expected, "UTC")  # toArrow()'s zone
            except Exception as exc:  # PySpark's: a type Arrow cannot express
                raise SparkSemanticsError(f"Spark's result type has no Arrow form ({exc})") from exc
            df = as_spark_schema(df, arrow)
    except PlanningError as exc:
        # A table distfusion could not register explains a failure that names it.
        why = next(
            (w for n, w in unreadable.items() if re.search(rf"\b{re.escape(n)}\b", str(exc), re.I)),
            None,
        )
        semantic = isinstance(exc, SparkSemanticsError)
        if not semantic and expected is None:  # Spark rejects it too: distfusion's error
            if why is None:
                raise
            raise PlanningError(why) from exc
        reason = why or (str(exc) if semantic else f"DataFusion cannot plan the translation: {exc}")
        if fallback == "error" or uses_own:
            raise SparkSemanticsError(reason) from exc
        return _SparkSqlResult(ctx, spark, query, reason)
    if expected is None and not uses_own:  # DataFusion answers what Spark rejects
        reason = "Spark's analysis rejects the query"
        rejected = _SparkSqlResult(ctx, spark, query, reason)  # Spark's own error here
        if fallback == "error":
            raise SparkSemanticsError(reason)
        return rejected
    result = SparkDataFrame(ctx, df, spark, query, expected)
    if expected is not None and any(s is not None and s.is_spark for s in ctx.sources.values()):
        try:  # planned now: a query only the coordinator runs cannot read Spark's rows
            alone = result.coordinator_only()
            if alone is not None:
                check_coordinator_reads(result.df, ctx.sources, alone)
        except PlanningError as exc:
            if fallback == "error":
                raise SparkSemanticsError(str(exc)) from exc
            return _SparkSqlResult(ctx, spark, query, str(exc))
    return result


def _as_spark_batches(batches, schema: pa.Schema):
    """``batches`` with Spark's ``schema``: its names, and its time zones (the same instants).

    Closing this closes ``batches`` (which cancels the run).
    """
    try:
        for batch in batches:
            yield as_schema(batch, schema)
    finally:
        batches.close()


class _SparkSqlResult(SparkDataFrame):
    """A query run as ``spark.sql(query)`` itself (:attr:`fallback` says why).

    Results, ``to_spark()`` and :meth:`explain` are Spark's; a transformation
    reads Spark's result through Spark (:func:`register_spark_dataframe`).
    """

    def __init__(self, ctx: DistributedContext, spark, query: str, reason: str) -> None:
        if reason not in _logged_fallbacks:
            _logged_fallbacks.add(reason)
            _log.warning("distfusion.spark.sql runs a query on Spark SQL: %s", reason)
        frame = spark.sql(query)  # Spark's own error here; DDL and DML run now, as in Spark
        self._frame = frame
        arrow = spark_arrow_schema(frame.schema, "UTC")  # toArrow()'s zone
        placeholder = pa.schema(  # DataFusion's names must differ; Spark's may repeat
            [f.with_name(f"c{i}") for i, f in enumerate(arrow)]
        )
        empty = ctx.ctx.from_arrow(placeholder.empty_table())
        super().__init__(ctx, empty, spark, query, frame.schema)
        self.fallback = reason
        self._registered = False

    def to_spark(self):
        """``spark.sql(query)`` itself."""
        return self._frame

    def execute_stream(self, progress: bool = False) -> ResultStream:
        """Spark's result batches (``toArrow()``); ``progress`` is Spark's own UI."""
        return ResultStream(iter(self.collect()), lambda: None)

    def collect(self, progress: bool = False) -> list[pa.RecordBatch]:
        return self.to_arrow_table().to_batches()

    def to_arrow_table(self, progress: bool = False) -> pa.Table:
        """Spark's result as an Arrow table (``toArrow()``)."""
        return self._frame.toArrow()

    def count(self) -> int:
        return self._frame.count()

    def coordinator_only(self) -> str | None:
        """The reason the query runs on Spark SQL."""
        return f"runs on Spark SQL: {self.fallback}"

    def explain(self, verbose: bool = False, analyze: bool = False, format: str = "text") -> str:
        """``runs on Spark SQL: <reason>``, then Spark's plan (``analyze``: after a run)."""
        if analyze:
            self._frame.collect()
        mode = "extended" if verbose else "formatted"
        try:
            plan = _spark_explain(self._frame, mode)
        except Exception:  # Spark's: no plan text
            plan = ""
        return f"runs on Spark SQL: {self.fallback}\n{plan}".rstrip() + "\n"

    def _transformed(self, method, build):
        if not self._registered:
            name = f"spark_sql_{uuid.uuid4().hex[:16]}"
            register_spark_dataframe(self.context, name, self._frame)
            table = self.context.ctx.table(name)
            renamed = [col(n.lower()).alias(n) for n in self._spark_schema.names]
            self.df = table.select(*renamed)
            self._registered = True
        return super()._transformed(method, build)


def _spark_explain(frame, mode: str) -> str:
    out = io.StringIO()  # DataFrame.explain prints
    with contextlib.redirect_stdout(out):
        frame.explain(mode=mode)
    return out.getvalue()


def _is_spark_dataframe(df) -> bool:
    """Whether ``df`` is a Spark DataFrame, classic or Spark Connect's."""
    from pyspark.sql import DataFrame  # optional dependency

    return isinstance(df, DataFrame)


def _register_delta(ctx: DistributedContext, name: str, table) -> bool:
    """Register ``table`` natively when it is a Delta table (a ``DeltaTable``, or its root).

    A path or URL is a Delta table when it holds ``_delta_log``, looked up
    through its store within seconds (:func:`distfusion.io.delta.is_delta_table`):
    then only the files of its current version are read (a listing would
    read every file ever written there, removed ones included).

    Returns:
        False when ``table`` is no Delta table (a Spark DataFrame, Parquet files).

    Raises:
        PlanningError: see :meth:`~distfusion.context.DistributedContext.register_delta`;
            also when the store of a URL cannot be reached or refuses, so that
            whether it is a Delta table is unknown (never read as Parquet then).
    """
    if isinstance(table, str | os.PathLike):
        if not delta.is_delta_table(os.fspath(table)):
            return False
        ctx.register_delta(name, os.fspath(table))
        return True
    if type(table).__name__ == "DeltaTable" and type(table).__module__.startswith("deltalake"):
        ctx.register_delta(name, table)
        return True
    return False


def _is_iceberg_table(obj) -> bool:
    """Whether ``obj`` is a pyiceberg ``Table`` (checked without importing pyiceberg)."""
    cls = type(obj)
    return cls.__module__.startswith("pyiceberg.") and all(
        hasattr(obj, a) for a in ("metadata", "io", "scan")
    )


def register_spark_table(
    ctx: DistributedContext, spark, name: str, as_name: str | None = None
) -> None:
    """Register Spark table or temp view ``name`` in ``ctx`` as a distfusion source.

    A plain scan of local Parquet or CSV files (Spark's optimized plan of
    ``spark.table(name)`` is a ``LogicalRelation`` over a ``HadoopFsRelation``)
    is read natively by DataFusion in the tasks: its files come from
    ``DataFrame.inputFiles()``, its schema from Spark (converted to Arrow),
    CSV options (``header``, ``sep``) from the relation; a Parquet table
    partitioned by directory (``partitionBy``) is registered with its
    partition columns, pruned by the query's filters as Spark prunes them.
    Anything else is read through Spark (:func:`register_spark_dataframe`).

    Args:
        ctx: where to register.
        spark: the SparkSession whose catalog holds ``name``.
        name: the Spark table or view.
        as_name: the distfusion table name (default ``name`` lower-cased, as
            DataFusion folds unquoted identifiers).

    Raises:
        PlanningError: ``name`` is unknown to Spark, or read through Spark and
            :func:`register_spark_dataframe` refuses it.
    """
    as_name = as_name or name.lower()
    try:
        df = spark.table(name)
    except Exception as exc:
        msg = f"table {name!r}: Spark cannot resolve it: {exc}"
        raise PlanningError(msg) from exc
    if not _register_native(ctx, df, name, as_name):
        register_spark_dataframe(ctx, as_name, df)


def register_spark_dataframe(ctx: DistributedContext, name: str, df) -> None:
    """Register Spark DataFrame ``df`` as table ``name``, read through Spark when queried.

    Nothing runs now. A leaf stage reading the table runs over ``df``'s
    partitions (coalesced to its task count) on the Spark runtime, each task
    fed one partition's Arrow batches inside the Spark task computing it
    (see the module's docstring). The planner sizes it with Spark's plan
    statistics (``sizeInBytes``, ``rowCount``; a missing estimate counts as
    1 GiB) and its partitions as Spark plans them before running (after an
    adaptive shuffle Spark may make fewer: the extra tasks read none). Column
    names are lower-cased and every column is nullable; types map as the
    module's docstring says. ``ctx`` keeps ``df`` alive.

    Args:
        ctx: where to register; its runtime must be a
            :class:`~distfusion.runtime.spark.SparkRuntime` on ``df``'s
            session when a query runs.
        name: the table name.
        df: a ``pyspark.sql.DataFrame``, classic or Spark Connect's.

    Raises:
        TypeError: ``df`` is not a Spark DataFrame.
        PlanningError: its schema has a type Arrow cannot express, or two
            columns whose names differ only in case.
    """
    if not _is_spark_dataframe(df):
        msg = f"table {name!r}: expected a pyspark.sql.DataFrame, got {type(df)!r}"
        raise TypeError(msg)
    time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    try:
        schema = spark_arrow_schema(df.schema, time_zone)
    except Exception as exc:
        msg = f"table {name!r}: its Spark schema has a type Arrow cannot express ({exc})"
        raise PlanningError(msg) from exc
    lowered = [n.lower() for n in schema.names]
    twins = sorted({n for n in lowered if lowered.count(n) > 1})
    if twins:
        msg = (
            f"table {name!r}: columns differ only in case or repeat ({twins[0]!r}): "
            "distfusion lower-cases a Spark table's column names; alias them apart"
        )
        raise PlanningError(msg)
    # Nullable, as stage inputs are: a column the query does not read is NULL in the tasks.
    schema = pa.schema(
        [f.with_name(n).with_nullable(True) for f, n in zip(schema, lowered, strict=True)]
    )
    partitions, size_bytes, rows = spark_statistics(df)
    source = spark_source(name, schema, hold_dataframe(df), partitions, size_bytes, rows)
    ctx._register_streamed(source, df)


def _register_native(ctx: DistributedContext, df, name: str, as_name: str) -> bool:
    """Register ``df`` as a native source if it is a plain scan of local Parquet or CSV files.

    Returns:
        False when it is not (distfusion then reads it through Spark): not a ``LogicalRelation``
        over a ``HadoopFsRelation``, neither Parquet nor CSV, CSV partitioned by directory, several
        roots or files not on a local file system, no file, or a type the native path does not map.
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # optional dependency
    from pyspark.sql.types import StructType, _parse_datatype_json_string  # optional dependency

    if is_connect_dataframe(df):  # no JVM handle: what Spark's explanation says
        scan = file_scan(df)
        if scan is None:
            return False
        relation, fmt = None, "parquet"
        if scan.partition_columns:
            assert scan.root is not None  # a partitioned scan names its root (FileScan)
            fields = df.schema.fields
            data = StructType([f for f in fields if f.name not in scan.partition_columns])
            parts = StructType([f for f in fields if f.name in scan.partition_columns])
            return _register_partitioned(ctx, df.sparkSession, scan.root, data, parts, as_name)
    else:
        try:
            plan = df._jdf.queryExecution().optimizedPlan()
        except Exception as exc:
            msg = f"table {name!r}: Spark cannot plan it: {exc}"
            raise PlanningError(msg) from exc
        kind = plan.getClass().getSimpleName()
        if (
            kind != "LogicalRelation"
            or plan.relation().getClass().getSimpleName() != "HadoopFsRelation"
        ):
            return False
        relation = plan.relation()
        fmt = _FORMATS.get(str(relation.fileFormat().toString()).lower(), "")
        if not fmt:
            return False
        if relation.partitionSchema().nonEmpty():
            roots = relation.location().rootPaths()
            if fmt != "parquet" or roots.size() != 1:
                return False
            root = str(roots.apply(0).toUri().toString())
            data_t = _parse_datatype_json_string(relation.dataSchema().json())
            parts_t = _parse_datatype_json_string(relation.partitionSchema().json())
            return _register_partitioned(ctx, df.sparkSession, root, data_t, parts_t, as_name)
    files = []
    for uri in df.inputFiles():
        if (native := native_path(df.sparkSession, uri)) is None:
            return False
        files.append(native)
    if not files:
        return False
    try:  # Parquet holds instants (UTC); CSV's times are text read in the session's zone
        schema = to_arrow_schema(df.schema, timezone="UTC" if fmt == "parquet" else None)
    except Exception:  # e.g. a CSV time stamp: read through Spark, in the session's zone
        return False
    path = _common_path(sorted(files), fmt)
    if fmt == "parquet":
        ctx.register_parquet(as_name, path, schema=schema)
    else:
        assert relation is not None  # CSV: only a classic DataFrame's relation says so
        options = relation.options()

        def option(key: str, default: str) -> str:
            value = options.get(key)
            return str(value.get()) if value.isDefined() else default

        header = option("header", "false").lower() == "true"
        delimiter = option("sep", option("delimiter", ","))
        ctx.register_csv(as_name, path, schema=schema, has_header=header, delimiter=delimiter)
    return True


def _register_partitioned(
    ctx: DistributedContext, spark, root_uri: str, data, parts, as_name: str
) -> bool:
    """Register a Parquet table Spark partitions by directory (``partitionBy``).

    The table's root directory ``root_uri`` is registered with Spark's
    partition columns and types (``parts``, a Spark ``StructType``; ``data``:
    the files' columns): distfusion lists the files, reads each file's
    partition values from its path and prunes directories by the query's
    filters, as Spark does.

    Returns:
        False (read it through Spark) when the root is not on a file system
        or object store DataFusion reads, or a type does not map natively.
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # optional dependency

    root = native_path(spark, root_uri)
    if root is None:
        return False
    try:
        data = to_arrow_schema(data, timezone="UTC")  # instants, as Parquet stores them
        parts = to_arrow_schema(parts)  # a time stamp in a directory name: Spark's zone
    except Exception:  # e.g. a time stamp: read through Spark, in the session's zone
        return False
    ctx.register_parquet(
        as_name,
        root,
        schema=data,
        table_partition_cols=[(f.name, f.type) for f in parts],
    )
    return True


def _common_path(files: list[str], fmt: str) -> str | list[str]:
    """What to register for exactly ``files``: the file, their directory, or the list itself.

    A directory when it holds exactly these files (Spark read all of it),
    else the list (Spark read a subset of a directory).
    """
    if len(files) == 1:
        return files[0]
    if any(object_store.is_url(f) for f in files):
        return files
    directory = os.path.commonpath(files)
    if os.path.isdir(directory):
        present = sorted(glob.glob(os.path.join(directory, "**", f"*.{fmt}"), recursive=True))
        if present == files:
            return directory
    return files
