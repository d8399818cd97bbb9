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
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import html
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from datafusion import AggregateUDF, DataFrame, ScalarUDF, SessionContext, WindowUDF
from datafusion.substrait import Producer
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType
from substrait.proto import Plan

from distfusion import delta, object_store, udfs
from distfusion.dataframe import Readers, Transformations, mark_session, plan_label
from distfusion.ddl import Statement, fold_identifier, parse_statement
from distfusion.display import print_table, with_progress
from distfusion.errors import (
    DistfusionError,
    NotDistributableError,
    PlanningError,
    QueryCancelledError,
)
from distfusion.iceberg import IcebergTable
from distfusion.metrics.observer import QueryObserver, observer_for, observing
from distfusion.metrics.query import QueryMetrics, build_query_metrics
from distfusion.metrics.render import analyzed_text, to_dot, to_html
from distfusion.metrics.task import TaskMeter
from distfusion.planner.config import DistributedConfig, PlannerConfig
from distfusion.planner.detect_substrait_losses import substrait_losses
from distfusion.planner.fragment import MaterializedStage
from distfusion.planner.inject_network_boundaries import plan_stages
from distfusion.planner.repair_substrait import repair_substrait
from distfusion.planner.rewrite_null_aware_anti_join import rewrite_null_aware_anti_joins
from distfusion.planner.substrait import consume_plan, fits_decoder, parse_plan
from distfusion.protocol.errors import task_error
from distfusion.protocol.task_plan import TaskPlan
from distfusion.runtime.adaptive import AdaptiveReport, plan_final, run_adaptive
from distfusion.runtime.base import QueryRun, Runtime
from distfusion.runtime.registry import runtime_from_name
from distfusion.sources import (
    TableSource,
    check_files_exist,
    csv_source,
    feed_source,
    list_files,
    memory_source,
    parquet_source,
    register_scan,
    sql_name,
)
from distfusion.stages import StageGraph
from distfusion.work_unit_feed.feed import FeedPartitionMetrics, lookup_feed
from distfusion.work_unit_feed.table import FeedTableSource
from distfusion.worker.execute_task import COORDINATOR, build_dataframe, stream_batches
from distfusion.worker.interrupt import Interruptible
from distfusion.write import FileCommitter, WriteSpec, WrittenFile, write_task

# DistributedConfig is defined with the planner settings derived from it
# (planner/config.py); it is public API here and in ``distfusion``.
__all__ = [
    "DistributedConfig",
    "DistributedContext",
    "DistributedDataFrame",
    "ResultStream",
    "plan_statements",
]

_POSTGRES = Postgres()  # its tokenizer splits statements (see split_statements)


def split_statements(sql: str) -> list[str]:
    r"""Split SQL text into its statements, on the semicolons between them.

    The text is tokenized with sqlglot's PostgreSQL tokenizer (DataFusion's SQL
    lexes as PostgreSQL's: ``'it''s'``, ``E'a\'b'``, ``$$...$$`` and
    ``$tag$...$tag$`` strings, ``"quoted"`` identifiers, ``--`` and nested
    ``/* */`` comments), so a ``;`` inside any of them does not split.

    Returns:
        One string per statement, in order: the original text from its first
        token to its last (comments before and after it dropped, those inside
        kept), without the ``;``. Statements with no token (empty, or only
        comments) are dropped. Text the tokenizer rejects (an unterminated string
        or comment) is returned whole as one statement, so that DataFusion
        reports the error in its own words.

    Example:
        >>> split_statements("SELECT 1 /* ; */ ; SELECT 'a;b' -- c;")
        ['SELECT 1', "SELECT 'a;b'"]
    """
    try:
        tokens = _POSTGRES.tokenize(sql)
    except TokenError:
        return [sql.strip()] if sql.strip() else []
    out: list[str] = []
    first = last = None
    for tok in [*tokens, None]:
        if tok is None or tok.token_type == TokenType.SEMICOLON:
            if first is not None:
                out.append(sql[first.start : last.end + 1])
            first = last = None
        else:
            first = first or tok
            last = tok
    return out


def _default_runtime() -> Runtime:
    return runtime_from_name("spark")  # ImportError naming what to install without pyspark


def _check_path(name: str, path: str, extension: str) -> None:
    """Raise a clear PlanningError (naming table and path) when no file is at ``path``."""
    try:
        list_files(path, extension)
    except PlanningError as exc:
        raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from None


_WRITES = ("DmlStatement", "CopyTo")
"""Logical plan variants that write (INSERT, UPDATE, DELETE, COPY): DataFusion
runs them when their DataFrame is collected, not when planned."""


def writes(df: DataFrame) -> bool:
    """Whether ``df`` is an INSERT, UPDATE, DELETE or COPY (it writes when collected)."""
    return type(df.logical_plan().to_variant()).__name__ in _WRITES


def plan_statements(
    ctx: SessionContext, sql: str, run: Callable[[str], DataFrame] | None = None
) -> DataFrame:
    """Plan the statements of ``sql`` on a DataFusion context, in order.

    DDL (``CREATE TABLE``, ``CREATE VIEW``, ``DROP TABLE``, ...) takes effect as
    it is planned. A write (``INSERT``, ``COPY``) before the last statement runs
    at once, so later statements see it (DataFusion runs a write only when its
    DataFrame is collected: the last statement's stays for the caller to run).
    The result is the last statement that returns columns (its plan keeps the
    definition of any view a later statement drops), else the last statement.
    Used by :meth:`DistributedContext.sql`, and for single-node DataFusion by the
    benchmark and the tests.

    Args:
        ctx: the context the statements run on.
        sql: one or more statements separated by ``;``.
        run: plans one statement (default ``ctx.sql``).

    Raises:
        PlanningError: ``sql`` holds no statement.
        Exception: DataFusion's error for an invalid statement.
    """
    statements = split_statements(sql)
    if not statements:
        raise PlanningError("no SQL statement given")
    run = run or ctx.sql
    result = None
    for i, stmt in enumerate(statements):
        df = run(stmt)
        if i < len(statements) - 1 and writes(df):
            df.collect()
        if result is None or len(df.schema()) > 0:
            result = df
    return result


def lost_in_substrait(ctx: SessionContext, logical, plan_bytes: bytes) -> str | None:
    """What of the optimized plan ``logical`` its Substrait ``plan_bytes`` does not carry.

    Read from the plan's structure, never its text
    (:func:`~distfusion.planner.detect_substrait_losses.substrait_losses`:
    ``IGNORE NULLS``, ``DISTINCT`` and ``FILTER`` of window functions, ``RANGE``
    frames with an offset, casts to a timestamp zone other than UTC; in a
    subquery, what such a property may sit on). A plan
    too deep for DataFusion's decoder even in pieces (an expression nested
    about 30 deep, such as a sum of 40 columns) is not carried either: only
    such plans are consumed again, and the views their pieces need are dropped
    from ``ctx`` afterwards.

    Returns:
        A sentence naming what was lost, or None when nothing known was.

    Raises:
        Exception: DataFusion's error when it rejects ``plan_bytes`` otherwise.
    """
    lost = substrait_losses(logical, ctx, parse_plan(plan_bytes))
    if lost:
        return (
            f"Substrait does not carry {'; '.join(lost)} "
            "(DataFusion's producer drops it without an error)"
        )
    if fits_decoder(plan_bytes):
        return None
    tables = ctx.catalog().schema().names()
    try:
        consume_plan(ctx, plan_bytes)
    except Exception as exc:  # DataFusion raises bare Exception
        if "recursion limit" not in str(exc):
            raise
        return "the plan nests deeper than DataFusion's Substrait decoder allows"
    finally:
        for name in ctx.catalog().schema().names() - tables:
            ctx.deregister_table(name)
    return None


def table_name(name: str) -> str:
    """The name DataFusion registers a table under: ``T1`` is ``t1``, ``'"T1"'`` is ``T1``.

    DataFusion parses a name given to ``register_*`` as SQL does an identifier:
    unquoted, it folds to lower case; double-quoted, it keeps its case.
    """
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return fold_identifier(name, quoted=False)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters (for a reason)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"(Unsupported plan type: \w+) \{.*", r"\1", text)  # not the whole plan
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_spark_reads(graph: StageGraph, runtime: Runtime) -> None:
    """Raise unless ``runtime`` can read the Spark DataFrames ``graph`` reads.

    Raises:
        PlanningError: a stage reads a Spark DataFrame and ``runtime`` is not
            the Spark runtime (names the table and the runtime).
    """
    if getattr(runtime, "reads_spark_dataframes", False):
        return
    for stage in graph.stages:
        for scan in stage.scans:
            if scan.source.is_spark:
                msg = (
                    f"table {scan.source.name!r} is a Spark DataFrame, read by Spark's "
                    "executors: only the Spark runtime (SparkRuntime, distfusion.spark.sql) "
                    f"runs a query reading it, and this context runs on "
                    f"{getattr(runtime, 'name', type(runtime).__name__)!r}; use a "
                    "SparkRuntime, or write the DataFrame to Parquet and register_parquet it"
                )
                raise PlanningError(msg)


def _tables_read(df: DataFrame, names) -> list[str]:
    """The tables of ``names`` that ``df``'s plan scans (from its rendered logical plan)."""
    names = list(names)
    if not names:
        return []
    text = df.optimized_logical_plan().display_indent()
    scanned = set(re.findall(r"TableScan: ([^\s]+)", text))
    return [n for n in names if n in scanned or sql_name(n) in scanned]


def _check_coordinator_reads(
    df: DataFrame,
    sources: dict[str, TableSource],
    reason: str,
    not_on_coordinator: dict[str, str] | None = None,
) -> None:
    """Refuse a coordinator-only query over a table only leaf tasks can read.

    The coordinator's DataFusion context knows a Spark DataFrame or a
    feed-backed table (an Iceberg table, a ``ListingFeed``) as an empty
    table with its schema: single-node DataFusion running the query there
    would read no row of it and answer as if it were empty. Tables in
    ``not_on_coordinator`` (name -> why) cannot be read here either (a Delta
    table whose reader DataFusion lacks a store for).

    Raises:
        PlanningError: the query scans such a table (names it and what to do).
    """
    streamed = _tables_read(df, [n for n, s in sources.items() if s.streamed])
    if streamed:
        name = streamed[0]
        if sources[name].is_spark:
            msg = (
                f"table {name!r} is a Spark DataFrame, read only by Spark tasks, but "
                f"this query runs on the coordinator only ({reason}); "
                "use spark.sql for it, or write the table to Parquet first"
            )
        else:
            msg = (
                f"table {name!r} is a feed-backed table (an Iceberg table or a work unit "
                f"feed), read only by distributed tasks, but this query runs on the "
                f"coordinator only ({reason}), where the table has no rows; copy what the "
                f"query needs into a memory table first (CREATE TABLE {name}_copy AS SELECT "
                f"... FROM {name}: that runs distributed) and query the copy, or rewrite the "
                "query so it is distributed"
            )
        raise PlanningError(msg)
    unreadable = _tables_read(df, not_on_coordinator or {})
    if unreadable:
        table = unreadable[0]
        msg = (
            f"table {table!r} is read only by tasks, but this query runs on the "
            f"coordinator only ({reason}): {not_on_coordinator[table]}; write the query so "
            "that it distributes, or read the table's result first (ctx.sql(...).to_arrow_table())"
        )
        raise PlanningError(msg)


def _on_coordinator(df: DataFrame) -> Iterator[pa.RecordBatch]:
    """``df`` run by single-node DataFusion in this process, as Arrow batches.

    The wait for each batch can be interrupted (:class:`ResultStream` closed
    from another thread).
    """
    yield from stream_batches(df, lambda: False)


class ResultStream(Iterator[pa.RecordBatch]):
    """The result batches of one run of a query (:meth:`DistributedDataFrame.execute_stream`).

    An iterator of ``pyarrow.RecordBatch``. :meth:`close` before the end
    cancels every task of the query, and may be called from any thread: a
    generator closed while another thread waits in it fails with
    ``ValueError: generator already executing``, and the query ran on.

    Args:
        batches: the run's batches (a generator that cancels the query when closed).
        cancel: stops the run from another thread (the observer's
            :meth:`~distfusion.metrics.observer.QueryObserver.cancel`).
    """

    close_wait_s = 10.0
    """How long :meth:`close` from another thread waits for the reading thread to stop, seconds."""

    def __init__(self, batches: Iterator[pa.RecordBatch], cancel: Callable[[], None]) -> None:
        self._batches = batches
        self._cancel = cancel
        self._lock = threading.Lock()
        self._reading: Interruptible | None = None  # the reading thread's, inside __next__
        self._left = threading.Condition(self._lock)
        self._closed = False

    def __iter__(self) -> ResultStream:
        return self

    @property
    def batches(self) -> Iterator[pa.RecordBatch]:
        """The run's batches themselves, for a reader that never closes them from another thread."""
        return self._batches

    def __next__(self) -> pa.RecordBatch:
        """The next batch.

        Raises:
            StopIteration: the result ended, or the stream was closed.
            QueryCancelledError: :meth:`close` was called from another thread
                while this call waited.
            DistfusionError: as :meth:`DistributedDataFrame.execute_stream`.
        """
        with self._lock:
            if self._closed:
                raise StopIteration
            if self._reading is not None:
                msg = "a ResultStream is read by one thread at a time"
                raise RuntimeError(msg)
            reading = self._reading = Interruptible()
        try:
            with reading:
                return _next_of(self._batches, reading)
        finally:
            with self._lock:
                self._reading = None
                self._left.notify_all()

    def close(self) -> None:
        """Stop the query: every task is cancelled and its state freed. Idempotent.

        From the thread reading the stream (or with no read under way) this
        closes the generator, as closing a generator does. From another
        thread while a read waits: the query's runs are closed, the reading
        thread's wait is interrupted (its :meth:`__next__` raises
        :class:`~distfusion.errors.QueryCancelledError`), and this waits up to
        :attr:`close_wait_s` for it to stop.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        if reading is None or reading.thread_id == threading.get_ident():
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()
            return
        self._cancel()
        reading.interrupt(QueryCancelledError("the result stream was closed"))
        deadline = time.monotonic() + self.close_wait_s
        with self._lock:
            while self._reading is reading and time.monotonic() < deadline:
                self._left.wait(0.1)

    def __enter__(self) -> ResultStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _next_of(batches: Iterator[pa.RecordBatch], reading: Interruptible) -> pa.RecordBatch:
    """``next(batches)``; an interrupted read raises the interrupter's error, not what it caused."""
    try:
        return next(batches)
    except StopIteration:
        raise
    except Exception:
        if reading.error is not None:
            raise reading.error.with_traceback(None) from None
        raise


def _in_place(graph: StageGraph, config: DistributedConfig) -> bool:
    """Whether ``graph`` runs as single-node DataFusion on the coordinator's own context.

    A plan of one stage (the head, one task, on the coordinator anyway) that
    reads only files and memory tables is the query as DataFusion planned it
    here: running ``df`` itself on the coordinator's context gives the same
    rows without a Substrait round trip or a fresh task context, and reuses
    that context's caches of file listings and Parquet footers (on an object
    store, a request each per file otherwise). Not when the user set a memory
    budget per task (the head task runs within it).
    """
    return (
        len(graph.stages) == 1
        and not graph.head.inputs
        and not any(s.source.streamed for s in graph.head.scans)
        and config.memory_per_task_bytes is None
    )


IN_PLACE_BYTES = 16 * 1024 * 1024
"""A query reading at most this many bytes of sources runs in place, as single-node
DataFusion on the coordinator (the local runtime's bytes per task: every leaf
stage would get one task), unless the config forces task counts or budgets."""


def _run_in_place(
    df: DataFrame, query_id: str, scans: list[tuple[str, tuple]], stage_id: int = 1
) -> Iterator[pa.RecordBatch]:
    """``df`` run here as one task of stage ``stage_id``: its files checked, its metrics reported.

    Args:
        df: the query, planned on the coordinator's context.
        query_id: the run's id (its observer gets the task's metrics).
        scans: ``(table, work units)`` of every source it reads.
        stage_id: the stage the task's metrics are reported under.

    Raises:
        TaskError: a file is gone, or DataFusion failed (worker ``coordinator``).
    """
    meter = TaskMeter(
        stage_id, 0, COORDINATOR, 0, sum(u.size_bytes for _, units in scans for u in units)
    )
    rows = nbytes = 0
    try:
        for table, units in scans:
            check_files_exist(table, [u.path for u in units])
        meter.executed(df)
        for batch in _on_coordinator(df):
            rows += batch.num_rows
            nbytes += batch.nbytes
            yield batch
    except DistfusionError:
        raise
    except Exception as exc:  # DataFusion's bare Exception, a missing file
        raise task_error(stage_id, 0, COORDINATOR, exc) from exc
    observer_for(query_id).task_finished(meter.finish(None, rows, nbytes))


def _named(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``batches`` with the query's column names and time zones.

    Stages name columns ``c0..``; and Substrait does not carry a timestamp
    literal's zone (DataFusion's consumer reads it as UTC), so a column whose
    only difference from the query's type is the zone gets the query's zone
    back (the same instants: only the label changes). Closing the returned
    iterator closes ``batches`` (which cancels the query).
    """
    names = schema.names
    try:
        for b in batches:
            columns = [
                c.cast(f.type) if c.type != f.type and _zone_only(c.type, f.type) else c
                for c, f in zip(b.columns, schema, strict=True)
            ]
            if b.schema.names == names and all(
                c is o for c, o in zip(columns, b.columns, strict=True)
            ):
                yield b
            else:
                yield pa.RecordBatch.from_arrays(columns, names=names)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _zone_only(got: pa.DataType, want: pa.DataType) -> bool:
    """Both are timestamps of one unit, with different zones (or one without)."""
    return (
        pa.types.is_timestamp(got)
        and pa.types.is_timestamp(want)
        and got.unit == want.unit
        and got.tz is not None
        and want.tz is not None
    )


class DistributedContext(Readers):
    """Registers tables and plans SQL or DataFrames for distributed execution.

    Queries come as SQL (:meth:`sql`) or as DataFrames built with
    DataFusion's DataFrame API from :meth:`table`, :meth:`read_parquet`,
    :meth:`read_csv`, :meth:`from_arrow`, :meth:`from_pydict`,
    :meth:`from_pylist`, :meth:`from_pandas` or :meth:`from_datafusion`
    (:mod:`distfusion.dataframe`).

    Args:
        runtime: runs the stage graphs: a :class:`~distfusion.runtime.base.Runtime`,
            or a zero-argument callable returning one, called on first use (so
            registering tables and SQL errors never wait for a cluster). Default:
            a :class:`~distfusion.runtime.spark.SparkRuntime` on an embedded
            ``local[*]`` SparkSession (or the active one), started on first use.
            Pass ``LocalRuntime()`` to run in-process without Spark.
        config: planner settings (:class:`DistributedConfig`).

    Raises:
        ImportError: (on first use) no ``runtime`` given and pyspark is not installed.
    """

    def __init__(
        self,
        runtime: Runtime | Callable[[], Runtime] | None = None,
        config: DistributedConfig | None = None,
    ):
        if runtime is None:
            runtime = _default_runtime
        self._runtime: Runtime | None = (
            None if callable(runtime) and not isinstance(runtime, Runtime) else runtime
        )
        self._runtime_factory = runtime
        self.config = config or DistributedConfig()
        self.ctx = SessionContext()
        self._marker = mark_session(self.ctx)  # tells this context's DataFrames apart
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
        classes as :mod:`distfusion.object_store` offers them (same names and
        arguments: ``AmazonS3``, ``GoogleCloud``, ``MicrosoftAzure``, ``Http``,
        ``LocalFileSystem``); they remember their arguments, so that each
        worker builds the store again before it decodes a task plan. Without
        explicit keys, every worker takes credentials from its own environment.
        A bucket with no store registered gets one from the environment when a
        table on it is registered (:func:`distfusion.object_store.spec_for`).

        Args:
            scheme: ``"s3://"``, ``"gs://"``, ``"az://"``, ``"abfss://"``, ``"https://"``, ...
            store: the store, e.g. ``AmazonS3(bucket_name="lake", region="eu-west-1")``.
            host: the bucket (container, host) it serves, as in DataFusion.

        Raises:
            TypeError: ``store`` is a plain ``datafusion.object_store`` store
                (use :mod:`distfusion.object_store`'s class of the same name).

        Example:
            >>> from distfusion import DistributedContext, LocalRuntime
            >>> from distfusion.object_store import AmazonS3
            >>> ctx = DistributedContext(runtime=LocalRuntime())
            >>> ctx.register_object_store("s3://", AmazonS3(bucket_name="lake"), "lake")
        """
        object_store.register(scheme, store, host)
        object_store.add_to(self.ctx)

    def deregister_object_store(self, scheme: str, host: str | None = None) -> None:
        """Stop reading ``scheme://host/...`` through the store registered for it (DataFusion's)."""
        object_store.deregister(scheme, host)
        try:
            self.ctx.deregister_object_store(scheme, host)
        except Exception:  # DataFusion's: none registered here
            pass

    def _stores_for(self, path: str, extension: str | None = None) -> str:
        """Make sure the store of ``path`` (when a URL) is known here and to DataFusion.

        Returns:
            ``path``, a URL naming a "directory" with the ``/`` DataFusion
            needs to list it (``s3://b/t`` -> ``s3://b/t/``) when ``extension``
            is given and the URL does not end with it.
        """
        if not object_store.is_url(path):
            return path
        object_store.spec_for(path)
        object_store.add_to(self.ctx)
        glob = any(ch in path for ch in "*?[")
        if extension and not glob and not path.endswith((extension, "/")):
            return path + "/"
        return path

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
        from there.

        ``table_partition_cols`` (as DataFusion's ``register_parquet``): the table
        is partitioned by directory, Hive style, as Spark's ``partitionBy``
        writes it (``path/dt=2024-01-01/part-0.parquet``); each ``(column,
        Arrow type)`` is a column of the table, read from the directory names.
        A filter on those columns skips the other directories' files when the
        query is planned (``explain()`` says how many files remain).

        Raises:
            PlanningError: no Parquet file at ``path``, DataFusion cannot read
                its schema, or a file is not below a ``column=value`` directory
                of every partition column.
        """
        if isinstance(path, list | tuple):
            if table_partition_cols:
                msg = "table_partition_cols needs a directory, not a list of files"
                raise ValueError(msg)
            self._register_files(name, "parquet", list(path), schema)
            return
        path = self._stores_for(os.fspath(path), ".parquet")
        _check_path(name, path, ".parquet")
        cols = [(c, t) for c, t in (table_partition_cols or [])]
        try:
            self.ctx.register_parquet(name, path, schema=schema, table_partition_cols=cols or None)
            table_schema = self.ctx.table(name).schema()
            source = parquet_source(name, path, table_schema, tuple(c for c, _ in cols))
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from exc
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

        ``path`` may be an object store URL or a list of files, as for
        :meth:`register_parquet`.

        Raises:
            PlanningError: no CSV file at ``path``, or DataFusion cannot infer a schema.
        """
        if isinstance(path, list | tuple):
            options = {"has_header": has_header, "delimiter": delimiter}
            self._register_files(name, "csv", list(path), schema, options)
            return
        path = self._stores_for(os.fspath(path), ".csv")
        _check_path(name, path, ".csv")
        try:
            self.ctx.register_csv(
                name, path, schema=schema, has_header=has_header, delimiter=delimiter
            )
            table_schema = self.ctx.table(name).schema()
        except Exception as exc:
            self._forget(name)
            raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from exc
        self._add(csv_source(name, path, table_schema, has_header, delimiter))

    def _register_files(
        self,
        name: str,
        fmt: str,
        files: list,
        schema: pa.Schema | None,
        options: dict | None = None,
    ) -> None:
        """Register exactly ``files`` (paths or URLs) as ``name``: one work unit each.

        The coordinator's DataFusion context gets a view of their union (as a
        task reads its share), so queries run here see the same rows.

        Raises:
            PlanningError: no file given, a file is missing, or DataFusion cannot read it.
        """
        files = [self._stores_for(os.fspath(f)) for f in files]
        if not files:
            raise PlanningError(f"cannot register table {name!r}: the list of files is empty")
        options = options or {}
        try:
            if schema is None:
                first = files[0]
                df = (
                    self.ctx.read_parquet(first)
                    if fmt == "parquet"
                    else self.ctx.read_csv(first, **options)
                )
                schema = df.schema()
            if fmt == "parquet":
                source = parquet_source(name, files, schema)
            else:
                source = csv_source(name, files, schema, **options)
            self._forget(name)
            register_scan(self.ctx, source, source.units)
            self._file_views.add(table_name(name))
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            msg = f"cannot register {len(files)} files ({files[0]}, ...) as table {name!r}: {exc}"
            raise PlanningError(msg) from exc
        self._add(source)

    def register_delta(
        self,
        name: str,
        table: Any,
        version: int | None = None,
        storage_options: dict[str, str] | None = None,
        timestamp: datetime.datetime | str | None = None,
    ) -> None:
        """Register a Delta Lake table (its latest version, or one version of it) as ``name``.

        The table is read through its own log, with delta-rs (``pip install
        'distfusion[delta]'``): every active data file of the version is one
        work unit (its URL, size and row count from the log, never listed),
        read natively by DataFusion in the tasks. Partition values come from
        the log, so a filter on a partition column keeps only the matching
        files; deletion vectors and column mapping are applied, schema
        evolution reads added columns as NULL in older files
        (:mod:`distfusion.delta`, docs/delta.md).

        On an object store (``s3://bucket/path``), the tasks read the files
        through the store registered for the bucket
        (:meth:`register_object_store`), and delta-rs reads the log with
        ``storage_options`` made from that store unless given. A table given
        ``storage_options`` for a bucket with no store registered gets a store
        made from them (:func:`distfusion.delta.store_from_options`).

        Args:
            name: the table name in SQL.
            table: the table's root (a path, ``file://`` or object store URL:
                the directory holding ``_delta_log``) or a
                ``deltalake.DeltaTable``.
            version: the version to read (time travel); default the latest
                (or the ``DeltaTable``'s loaded version).
            storage_options: delta-rs's storage options (``AWS_ENDPOINT_URL``,
                ``AWS_REGION``, keys, ...) for reading the log.
            timestamp: read the version that was current at this time
                (``datetime``, naive meaning UTC, or an ISO 8601 string), as
                ``DeltaTable.load_as_version``; not with ``version``.

        Raises:
            ImportError: deltalake is not installed.
            PlanningError: ``table`` is no Delta table; the version does not
                exist or the time is before the table; the log is corrupt or
                unreachable; the table needs a reader feature distfusion does
                not apply (the message names the table, where it is and why).

        Example:
            >>> import tempfile, pyarrow as pa
            >>> from deltalake import write_deltalake
            >>> from distfusion import DistributedContext, LocalRuntime
            >>> path = tempfile.mkdtemp()
            >>> write_deltalake(path, pa.table({"x": [1, 2, 3]}))
            >>> ctx = DistributedContext(runtime=LocalRuntime())
            >>> ctx.register_delta("t", path)
            >>> ctx.sql("SELECT sum(x) AS s FROM t").to_pylist()
            [{'s': 6}]
        """
        dt = delta.load_delta(name, table, version, timestamp, storage_options)
        uri = dt.table_uri
        options = storage_options or getattr(dt, "_storage_options", None)
        if object_store.is_url(uri):
            key = object_store.store_url(uri)
            if key not in object_store.registered() and options:
                store = delta.store_from_options(uri, options)
                if store is not None:
                    scheme, _, host = key.partition("://")
                    self.register_object_store(scheme + "://", store, host)
            self._stores_for(uri)
        self._forget(name)
        try:
            schema, unreadable = delta.register_on_coordinator(self.ctx, name, dt)
            source = delta.delta_source(name, dt, schema)
            for key in {object_store.store_url(u.path) for u in source.units if "://" in u.path}:
                self._stores_for(key)  # files elsewhere (a shallow clone's): their stores
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            msg = f"cannot register the Delta table at {uri} as table {name!r}: {exc}"
            raise PlanningError(object_store.redact(msg)) from exc
        self._add(source)
        if unreadable:
            self._not_on_coordinator[table_name(name)] = unreadable

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
        udfs.register(udf)

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
        udfs.register(udaf)

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
        udfs.register(udwf)

    def register_record_batches(self, name: str, partitions: list[list[pa.RecordBatch]]) -> None:
        """Register in-memory batches as ``name``; each batch is one work unit.

        Raises:
            PlanningError: no batch, or batches with different schemas.
        """
        source = memory_source(name, partitions)
        self.ctx.register_record_batches(name, partitions)
        self._add(source)

    def register_table(self, name: str, table: pa.Table, max_rows_per_unit: int = 65536) -> None:
        """Register an Arrow table as ``name``, in units of at most ``max_rows_per_unit`` rows."""
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
        object_store.add_to(self.ctx)
        self.register_feed_table(name, source)

    def _register_streamed(self, source: TableSource, held: object) -> None:
        """Register a table read at run time (a Spark DataFrame), keeping ``held`` alive with it.

        The coordinator's DataFusion context knows the table as empty, with its
        schema: it plans queries over it; only tasks read its rows.
        """
        source = dataclasses.replace(source, name=table_name(source.name))
        self._forget(sql_name(source.name))
        self._held[source.name] = held
        empty = pa.RecordBatch.from_pylist([], schema=source.schema)
        self.ctx.register_record_batches(sql_name(source.name), [[empty]])
        self._add(source)

    def deregister_table(self, name: str) -> None:
        """Forget table ``name`` (no error when unknown)."""
        self._forget(name)

    def table_names(self) -> list[str]:
        """Registered table names, sorted."""
        return sorted(self.sources)

    def _add(self, source: TableSource) -> None:
        name = table_name(source.name)
        self.sources[name] = dataclasses.replace(source, name=name)

    def _forget(self, name: str) -> None:
        self.sources.pop(table_name(name), None)
        self._file_views.discard(table_name(name))
        self._not_on_coordinator.pop(table_name(name), None)
        self._feed_sources.pop(table_name(name), None)
        self._held.pop(table_name(name), None)
        try:
            self.ctx.deregister_table(name)
        except Exception:  # not registered: nothing to forget
            pass

    # ------------------------------------------------------------- queries
    def sql(self, query: str) -> DistributedDataFrame:
        """Plan ``query``; nothing runs until a result is asked for.

        ``query`` may hold several statements separated by semicolons. They are
        planned in order (:func:`plan_statements`); the result is the last
        statement that returns rows (a view it uses may be dropped by a later
        statement: the plan keeps the view's definition). With only DDL, the
        result is empty. DDL and DML follow DataFusion (:mod:`distfusion.ddl`):

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
        - ``CREATE VIEW``, ``DROP TABLE``/``VIEW`` and ``SET`` act at once.

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
        statements = split_statements(query)
        explain = _EXPLAIN.match(statements[-1]) if statements else None
        if explain is not None:
            if statements[:-1]:
                self.sql(";\n".join(statements[:-1]))
            analyze, verbose, fmt, inner = explain.groups()
            fmt = (fmt or "text").lower()
            if fmt not in _EXPLAIN_FORMATS:
                msg = (
                    f"EXPLAIN FORMAT {fmt.upper()} is not supported here; use one of "
                    f"{', '.join(f.upper() for f in _EXPLAIN_FORMATS)}"
                )
                raise PlanningError(msg)
            return _ExplainDataFrame(
                self, self.sql(inner), bool(analyze), bool(verbose), _EXPLAIN_FORMATS[fmt]
            )
        try:
            df = plan_statements(self.ctx, query, self._statement)
        except DistfusionError:
            raise
        except Exception as exc:  # DataFusion's bare Exception, message kept
            raise PlanningError(str(exc)) from exc
        label = " ".join(statements[-1].split())[:80] if statements else ""
        return DistributedDataFrame(self, df, label)

    def _frame(self, df: DataFrame, label: str) -> DistributedDataFrame:
        """A distributed DataFrame of this context around DataFusion's ``df``."""
        return DistributedDataFrame(self, df, label)

    def _statement(self, sql: str) -> DataFrame:
        """Plan one statement on the coordinator's context; keep :attr:`sources` in step."""
        self._reread_memory_tables()
        st = parse_statement(sql)
        if st.schema_qualified:  # another schema: DataFusion's alone (no source)
            return self.ctx.sql(sql)
        source = self.sources.get(st.table)
        if st.kind == "external" and st.location:
            self._stores_for(st.location)
        if st.kind == "dml" and source is not None and source.format != "memory":
            msg = (
                f"cannot write into table {st.table!r}: it is read from {source.format} files; "
                "INSERT INTO takes memory tables (CREATE TABLE, register_table, "
                "register_record_batches)"
            )
            raise PlanningError(msg)
        if st.kind == "ctas" and (
            not self.ctx.table_exist(sql_name(st.table)) or "REPLACE" in st.head.upper().split()
        ):
            df = self._create_table_as(st.head, st.query)
        else:
            df = self.ctx.sql(sql)
        self._sync_sources(st)
        return df

    def _create_table_as(self, head: str, query: str) -> DataFrame:
        """``{head} AS {query}`` with ``query`` run distributed; DataFusion creates the table."""
        result = self.sql(query).to_arrow_table()
        tmp = f"__distfusion_ctas_{uuid.uuid4().hex}"
        batches = result.to_batches() or [pa.RecordBatch.from_pylist([], schema=result.schema)]
        self.ctx.register_record_batches(tmp, [batches])
        try:
            return self.ctx.sql(f"{head}AS SELECT * FROM {tmp}")
        finally:
            self.ctx.deregister_table(tmp)

    def _sync_sources(self, st: Statement) -> None:
        """Sources after statement ``st``: dropped with their table, added for SQL-made tables."""
        schema = self.ctx.catalog().schema()
        names = set(schema.names())
        for name in list(self.sources):
            if name not in names or (
                schema.table(name).kind == "view"
                and (name not in self._file_views or (st.kind == "view" and st.table == name))
            ):
                del self.sources[name]
                self._file_views.discard(name)
        if st.table not in names or schema.table(st.table).kind == "view":
            return
        if st.kind in ("ctas", "create"):
            self._memory_source(st.table)
        elif st.kind == "external":
            self.sources.pop(st.table, None)  # replaced, or read on the coordinator
            if (
                st.stored_as == "PARQUET"
                and st.location
                and (st.partition_cols or not st.partitioned)
            ):
                try:
                    source = parquet_source(
                        st.table,
                        st.location,
                        self.ctx.table(sql_name(st.table)).schema(),
                        st.partition_cols,
                    )
                except PlanningError:  # remote or no local file: DataFusion reads it
                    return
                self._add(source)
        elif st.kind == "dml":
            self._written = True  # runs when collected: read memory tables again then

    def _memory_source(self, name: str) -> None:
        """(Re)describe memory table ``name`` from its batches in the coordinator's context."""
        table = self.ctx.table(sql_name(name))
        batches = [b for b in table.collect() if b.num_rows]
        if not batches:
            batches = [pa.RecordBatch.from_pylist([], schema=table.schema())]
        self._add(memory_source(name, [batches]))

    def _reread_memory_tables(self) -> None:
        """After a write may have run (INSERT ...), describe every memory table again."""
        if not self._written:
            return
        self._written = False
        for name, source in list(self.sources.items()):
            if source.format == "memory" and self.ctx.table_exist(sql_name(name)):
                self._memory_source(name)

    @property
    def runtime(self) -> Runtime:
        """The runtime, created now if it was given as a callable (or defaulted)."""
        if self._runtime is None:
            self._runtime = self._runtime_factory()
        return self._runtime

    def close(self) -> None:
        """Release the runtime (if it was ever started)."""
        if self._runtime is not None:
            self._runtime.close()

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_EXPLAIN = re.compile(
    r"^\s*EXPLAIN\s+(?:(ANALYZE)\s+)?(?:(VERBOSE)\s+)?(?:FORMAT\s+(\w+)\s+)?(.+)$",
    re.IGNORECASE | re.DOTALL,
)
_EXPLAIN_FORMATS = {
    "text": "text",
    "indent": "text",
    "tree": "text",
    "dot": "dot",
    "graphviz": "dot",
}
"""``EXPLAIN FORMAT`` names (DataFusion's and ours) -> ``DistributedDataFrame.explain`` formats."""

EXPLAIN_SCHEMA = pa.schema([("plan_type", pa.string()), ("plan", pa.string())])
"""The columns of an ``EXPLAIN`` result, as DataFusion's."""

HTML_ROWS = 10
"""Rows a notebook shows of a DistributedDataFrame (``_repr_html_``)."""

FORMATS = ("text", "dot", "html")
"""Formats of :meth:`DistributedDataFrame.explain`."""


class DistributedDataFrame(Transformations):
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
        self._small: tuple[bool, list[str]] | None = None  # see _small_in_place

    def schema(self) -> pa.Schema:
        """The result's Arrow schema."""
        return self.df.schema()

    def _derive(self, df: DataFrame) -> DistributedDataFrame:
        """A DataFrame of this context around ``df`` (a transformation's result)."""
        return DistributedDataFrame(self.context, df, plan_label(df))

    def _is_query(self) -> bool:
        return len(self.df.schema()) > 0  # DDL has no columns

    def _substrait(self) -> bytes | None:
        """The optimized query as Substrait plan bytes (made once); None when it has none.

        When DataFusion's producer cannot express the query (``WITH RECURSIVE``,
        ``UNNEST``, a ``LEFT JOIN ... USING``), or the plan would lose meaning on
        the way (:func:`lost_in_substrait`), the reason is kept for
        :meth:`coordinator_only`.
        """
        if self._plan_bytes is None and self._coordinator_only is None:
            ctx = self.context
            if writes(self.df):
                self._coordinator_only = "a write (INSERT, COPY, ...) runs in DataFusion"
                return None
            logical = self.df.optimized_logical_plan()
            try:
                produced = Producer.to_substrait_plan(logical, ctx.ctx).encode()
            except Exception as exc:  # DataFusion raises bare Exception
                self._coordinator_only = (
                    f"DataFusion's Substrait producer cannot express the plan: {_first_line(exc)}"
                )
                return None
            plan = Plan()
            plan.ParseFromString(produced)
            try:
                rewrite_null_aware_anti_joins(plan, logical)
                repair_substrait(plan)
            except NotDistributableError as exc:
                self._coordinator_only = str(exc)
                return None
            self._plan_bytes = plan.SerializeToString()
            try:
                self._coordinator_only = lost_in_substrait(ctx.ctx, logical, self._plan_bytes)
            except Exception as exc:  # DataFusion raises bare Exception
                self._coordinator_only = (
                    f"DataFusion cannot consume its own Substrait plan: {_first_line(exc)}"
                )
        return self._plan_bytes

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

    def _planner_config(self) -> PlannerConfig:
        return PlannerConfig.for_runtime(self.context.config, self.context.runtime)

    def _plan(
        self,
        config: PlannerConfig,
        materialized: dict[str, MaterializedStage] | None = None,
        query_id: str | None = None,
        first_stage_id: int = 1,
    ) -> StageGraph:
        """Plan the query (over the stages that ran, for adaptive execution).

        Raises:
            NotDistributableError: see :func:`plan_stages`.
        """
        plan = Plan()
        plan.ParseFromString(self._substrait())  # the planner rewrites its plan in place
        graph = plan_stages(
            plan, self.context.sources, config, materialized, query_id, first_stage_id
        )
        _check_spark_reads(graph, self.context.runtime)
        return graph

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
        if format == "text" and not verbose:
            return self._plan_text()
        graph = self._ran_graph()
        if format == "dot":
            return to_dot(graph or _coordinator_graph(), self._metrics)
        if format == "html":
            text = self.explain(verbose=verbose)
            return to_html(graph or _coordinator_graph(), self._metrics, text)
        text = self._plan_text()
        if graph is not None:
            lines = ["Physical plans (task 0 of each stage, planned here):"]
            for sid, plan in self._physical_plans(graph).items():
                lines.append(f"  Stage {sid}:")
                lines.extend("    " + ln for ln in plan.rstrip().splitlines())
            text += "\n" + "\n".join(lines)
        return text

    def _ran_graph(self) -> StageGraph | None:
        """The graph of the last run (else the static plan); None for a coordinator-only query."""
        if self.coordinator_only() is not None:
            return None
        if self.last_run is not None and self.last_run.graphs:
            return self.last_run.final
        return self.stage_graph()

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
        graph = self._ran_graph()
        if format == "dot":
            return to_dot(graph or _coordinator_graph(), self._metrics)
        text = self._analyzed(verbose)
        if format == "html":
            return to_html(graph or _coordinator_graph(), self._metrics, text)
        return text

    def _analyzed(self, verbose: bool) -> str:
        """The plan of the last run annotated with its metrics (EXPLAIN ANALYZE text)."""
        metrics = self._metrics
        graph = self._ran_graph()
        if metrics is None:
            return self._plan_text()
        if graph is None:
            return (
                f"{self._plan_text()}\nQuery {metrics.query_id[:8]} on the coordinator: "
                f"{metrics.rows:,} rows in {metrics.elapsed_s:.3f} s"
            )
        text = analyzed_text(graph, metrics, verbose)
        if self.last_run is not None and self.last_run.graphs:
            rest = self.last_run.render().split("\n")
            # the adaptive report after the graph: measured sizes and decisions
            tail = rest[len(graph.render().split("\n")) :]
            text += "\n" + "\n".join(tail)
        return text + self._notes()

    def _physical_plans(self, graph: StageGraph) -> dict[int, str]:
        """Stage id -> the physical plan DataFusion makes here of its task 0 (nothing runs).

        Inputs are bound as empty tables, so sizes and partitionings are
        those of empty inputs; a stage reading a work unit feed is left out.
        """
        out = {}
        for stage in reversed(graph.stages):
            if any(scan.source.is_feed for scan in stage.scans):
                out[stage.stage_id] = "(reads a work unit feed: planned as units arrive)"
                continue
            workers = tuple(("",) * graph.stage(i.stage_id).num_tasks for i in stage.inputs)
            plan = TaskPlan.for_task(graph.query_id, stage, 0, workers, 1)
            try:
                _, df = build_dataframe(plan, lambda i: [])
                out[stage.stage_id] = df.execution_plan().display_indent()
            except Exception as exc:  # DataFusion's: a picture is not worth failing for
                out[stage.stage_id] = f"(cannot plan it here: {_first_line(exc)})"
        return out

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

    def _plan_text(self) -> str:
        """The text of ``explain()`` with no argument."""
        reason = self.coordinator_only()
        if reason is not None:
            plan = self.df.optimized_logical_plan().display_indent()
            return f"coordinator only (single-node DataFusion): {reason}\n{plan}"
        if self.last_run is not None and self.last_run.graphs:
            text = self.last_run.render()
        else:
            text = self.stage_graph().render()
        return text + self._notes()

    def _notes(self) -> str:
        """Lines after the plan: feed metrics, what the runtime says of how it moves data."""
        feeds = self._feed_text()
        # Spark: its data plane over TLS when Spark encrypts, or why not Flight.
        note = getattr(self.context.runtime, "explain_note", "")
        return ("\n" + feeds if feeds else "") + ("\n" + note if note else "")

    def _feed_text(self) -> str:
        """The feed metrics of the last run as explain() lines ("" without feeds)."""
        metrics = self.feed_metrics()
        if not metrics:
            return ""
        lines = ["Work unit feeds (last run):"]
        for table, parts in metrics.items():
            lines.append(f"  {table}:")
            source = self.context._feed_sources.get(table)
            said = source.describe_run() if source is not None else ""  # the last query's
            if said:
                lines.append(f"    {said}")
            lines.extend(f"    {m.describe()}" for m in parts)
        return "\n".join(lines)

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
        """
        if not self._is_query():
            return ResultStream(iter(()), lambda: None)
        if writes(self.df):
            self.context._written = True  # memory tables are read again before the next query
        # Every execution is a new query on the workers: a fresh id.
        query_id = str(uuid.uuid4())
        observer = QueryObserver(query_id, self.label)
        small = self._small_in_place()
        if small is not None:  # no planning: single-node DataFusion here
            if self.context.runtime.num_workers() < 1:  # a misconfigured cluster shows at once
                msg = "no workers: the worker resolver returned an empty list"
                raise PlanningError(msg)
            sources = self.context.sources
            scans = [(n, sources[n].units) for n in small]
            batches = _run_in_place(self.df, query_id, scans)
            stream = self._observed(observer, batches, lambda: None)
            stream = with_progress(stream, observer) if progress else stream
            return ResultStream(stream, observer.cancel)
        reason = self.coordinator_only()
        if reason is not None:
            _check_coordinator_reads(
                self.df, self.context.sources, reason, self.context._not_on_coordinator
            )
            stream = self._observed(observer, _on_coordinator(self.df), lambda: None)
        else:
            stream = self._observed(observer, *self._start(query_id))
        stream = with_progress(stream, observer) if progress else stream
        return ResultStream(stream, observer.cancel)

    def _small_in_place(self) -> list[str] | None:
        """The tables of a query small enough to run in place, without planning; else None.

        A query over at most :data:`IN_PLACE_BYTES` of files and memory tables
        (every leaf stage would get one task) runs as single-node DataFusion on
        the coordinator's context: no Substrait round trip, no planning, no
        task (the fixed cost of a small query is DataFusion's). Not when the
        config forces task counts, sizes or budgets (``tasks_per_stage``,
        ``bytes_per_task``, ``estimator``, ``memory_per_task_bytes``), for a
        write, nor when it reads a table only tasks can read (a feed, a Spark
        DataFrame). Decided once per DataFrame.

        Returns:
            The registered tables the query reads, or None.
        """
        if self._small is None:
            config = self.context.config
            sources = self.context.sources
            read = _tables_read(self.df, sources) if sources else []
            fits = (
                config.tasks_per_stage is None
                and config.bytes_per_task is None
                and config.estimator is None
                and config.memory_per_task_bytes is None
                and not writes(self.df)
                and not any(sources[n].streamed for n in read)
                and not any(n in self.context._not_on_coordinator for n in read)
                and sum(sources[n].size_bytes for n in read) <= IN_PLACE_BYTES
            )
            self._small = (fits, read)
        fits, read = self._small
        return read if fits else None

    def _start(self, query_id: str) -> tuple[Iterator[pa.RecordBatch], Callable]:
        """The result batches of a run as ``query_id`` (not started yet), and its final graph.

        Errors of planning are raised here, before any batch is asked for.
        """
        ctx = self.context
        self._ran = [
            scan.source.name
            for stage in self.stage_graph().stages
            for scan in stage.scans
            if scan.source.is_feed
        ]
        if _in_place(self.stage_graph(), ctx.config):
            graph = dataclasses.replace(self.stage_graph(), query_id=query_id)
            scans = [(s.source.name, s.task_units[0]) for s in graph.head.scans]
            batches = _run_in_place(self.df, query_id, scans, graph.head.stage_id)
            return batches, lambda: graph
        if not ctx.config.adaptive:
            graph = dataclasses.replace(self.stage_graph(), query_id=query_id)
            return _named(ctx.runtime.execute(graph), self.df.schema()), lambda: graph
        config = self._planner_config()
        static = dataclasses.replace(self.stage_graph(), query_id=query_id)  # errors first

        def plan(materialized: dict[str, MaterializedStage], first_id: int) -> StageGraph:
            # Nothing ran yet: the static plan, planned once per DataFrame.
            if not materialized:
                return static
            return self._plan(config, materialized, query_id, first_id)

        report = self.last_run = AdaptiveReport()
        batches = run_adaptive(
            plan,
            ctx.runtime,
            query_id,
            config,
            ctx.config.adaptive_shuffle_bytes,
            report,
        )
        return _named(batches, self.df.schema()), lambda: report.final if report.graphs else None

    def _prepare(self, run: QueryRun, query_id: str) -> StageGraph:
        """The graph to finish on ``run`` (query ``query_id``): adaptive waves run on it.

        For results that stay distributed: the caller runs the remaining
        stages and the head's parts on ``run`` (``map_head_parts``,
        ``head_parts``) and closes it.

        Raises:
            PlanningError, TaskError, TransportError: as :meth:`execute_stream`.
        """
        ctx = self.context
        static = dataclasses.replace(self.stage_graph(), query_id=query_id)  # errors first
        self._ran = [
            scan.source.name
            for stage in static.stages
            for scan in stage.scans
            if scan.source.is_feed
        ]
        if not ctx.config.adaptive:
            return static
        config = self._planner_config()

        def plan(materialized: dict[str, MaterializedStage], first_id: int) -> StageGraph:
            if not materialized:
                return static
            return self._plan(config, materialized, query_id, first_id)

        report = self.last_run = AdaptiveReport()
        return plan_final(plan, run, config, ctx.config.adaptive_shuffle_bytes, report)

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
        The commit is Hadoop's ``FileOutputCommitter``'s (:mod:`distfusion.write`):
        tasks write under ``path/_temporary/<query>/``, a task's files are
        moved into ``path`` only once the job succeeded, then ``_SUCCESS``
        is written; a failed or retried task leaves no partial or duplicate
        file, a failed job no file at all (its temporary files are deleted).

        On an object store (``path`` is ``s3://bucket/prefix/``, ...) tasks
        upload their files below ``_temporary`` and the job commit copies them
        into place, then writes ``_SUCCESS`` (a manifest of the files) last:
        readers wait for it (:mod:`distfusion.write`).

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
            PlanningError, TaskError, TransportError: as :meth:`execute_stream`.
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

    def _write_files(
        self, fmt: str, path: str | os.PathLike, partition_by: list[str] | None, mode: str
    ) -> list[WrittenFile]:
        """See :meth:`write_parquet`."""
        if not self._is_query():
            msg = "the statement returns no columns (DDL): there is nothing to write"
            raise PlanningError(msg)
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        query_id = str(uuid.uuid4())
        path = os.fspath(path)
        self.context._stores_for(path)
        spec = WriteSpec(
            path if object_store.is_url(path) else os.path.abspath(path),
            query_id,
            fmt,
            self.schema(),
            tuple(partition_by or ()),
        )
        committer = FileCommitter(spec, mode)
        reason = self.coordinator_only()  # planned before anything is touched on disk
        if reason is not None:
            _check_coordinator_reads(
                self.df, self.context.sources, reason, self.context._not_on_coordinator
            )
        committer.setup_job()
        try:
            if reason is not None:
                tasks = [write_task(spec, 0, _on_coordinator(self.df))]
            else:
                run = self.context.runtime.start_query(query_id)
                try:
                    graph = self._prepare(run, query_id)
                    writer = getattr(run, "write_head_parts", None)
                    if writer is not None:
                        tasks = writer(graph, spec)
                    else:  # a run that cannot cut its head: the head whole, here
                        tasks = map_head_parts(run, graph, functools.partial(_write_part, spec))
                finally:
                    run.close()
            return committer.commit_job(tasks)
        except BaseException:
            committer.abort_job()
            raise

    def _observed(
        self,
        observer: QueryObserver,
        batches: Iterator[pa.RecordBatch],
        final_graph: Callable[[], StageGraph | None],
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` with ``observer`` registered while they run; :meth:`metrics` after.

        Closing the returned iterator closes ``batches`` (which cancels the query).
        """
        start = time.perf_counter()
        try:
            with observing(observer):
                try:
                    for batch in batches:
                        observer.result_rows += batch.num_rows
                        yield batch
                finally:
                    close = getattr(batches, "close", None)
                    if close is not None:
                        close()
        finally:
            graph = final_graph()
            elapsed = time.perf_counter() - start
            runtime = getattr(self.context._runtime, "name", "coordinator")
            if graph is None:
                graph = _coordinator_graph(observer.query_id)
            self._metrics = build_query_metrics(
                graph, observer.tasks, observer.query_id, runtime, elapsed, observer.result_rows
            )

    def collect(self, progress: bool = False) -> list[pa.RecordBatch]:
        """All result batches (see :meth:`execute_stream` for ``progress`` and errors)."""
        # Read in this thread: the batches themselves, without ResultStream's frames in
        # the traceback of an error (its close from another thread is not needed here).
        return list(self.execute_stream(progress=progress).batches)

    def to_arrow_table(self, progress: bool = False) -> pa.Table:
        """The result as an Arrow table (see :meth:`execute_stream` for ``progress`` and errors)."""
        batches = self.collect(progress=progress)
        schema = self.df.schema()
        if not batches:
            return schema.empty_table()
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
        """Print the first ``num`` rows as a table (the query runs with ``LIMIT num``)."""
        print_table(self._head(num), limit=num)

    def __repr__(self) -> str:
        """The query's label and columns; plans and runs nothing (``explain()`` shows the plan)."""
        columns = ", ".join(f"{f.name}: {f.type}" for f in self.df.schema())
        label = f" {self.label!r}" if self.label else ""
        return f"DistributedDataFrame{label} [{columns}]"


def map_head_parts(run: QueryRun, graph: StageGraph, fn, split: bool = True) -> list:
    """``fn(part, attempt, batches)`` over every part of ``graph``'s head on ``run``.

    A run that cannot cut its head (Spark's shuffle data plane, whose head
    inputs come to the driver) runs the head whole here as part 0.
    """
    mapper = getattr(run, "map_head_parts", None)
    if mapper is not None:
        return mapper(graph, fn, split)
    return [fn(0, 0, run.stream_head(graph))]


def _write_part(spec: WriteSpec, part: int, attempt: int, batches) -> list[WrittenFile]:
    """Write one head part's batches (named as the result) as task ``part`` of ``spec``'s job."""
    return write_task(spec, part, _named(batches, spec.schema))


def _coordinator_graph(query_id: str = "") -> StageGraph:
    """An empty stage graph: what a query run whole on the coordinator has."""
    return StageGraph(query_id, ())


def explain_rows(
    df: DistributedDataFrame, analyze: bool, verbose: bool, format: str
) -> list[tuple[str, str]]:
    """The rows ``(plan_type, plan)`` of ``EXPLAIN`` over ``df``'s query.

    ``EXPLAIN``: ``logical_plan`` (DataFusion's optimized logical plan) and
    ``distributed_plan`` (:meth:`DistributedDataFrame.explain`); with
    ``VERBOSE``, the physical plans of the stages are part of the latter.
    ``EXPLAIN ANALYZE``: one row ``Plan with Metrics`` (DataFusion's name),
    the plan annotated with the metrics of the run just made.

    Raises:
        PlanningError, TaskError, TransportError: with ``analyze``, as
            :meth:`DistributedDataFrame.execute_stream`.
    """
    if analyze:
        return [("Plan with Metrics", df.explain(analyze=True, verbose=verbose, format=format))]
    logical = df.df.optimized_logical_plan().display_indent()
    return [
        ("logical_plan", logical),
        ("distributed_plan", df.explain(verbose=verbose, format=format)),
    ]


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

    def _transformed(self, method: str, build: Callable[[], DataFrame]) -> DistributedDataFrame:
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

    def explain(self, verbose: bool = False, analyze: bool = False, format: str = "text") -> str:
        """The explained query's plan (see :meth:`DistributedDataFrame.explain`)."""
        return self.inner.explain(verbose, analyze, format)

    def metrics(self) -> QueryMetrics | None:
        """The metrics of the explained query's last run (``EXPLAIN ANALYZE``)."""
        return self.inner.metrics()

    def execute_stream(self, progress: bool = False) -> Iterator[pa.RecordBatch]:
        """One batch of the rows ``(plan_type, plan)`` (runs the query with ANALYZE).

        ``progress`` is not shown for an EXPLAIN.
        """
        rows = explain_rows(self.inner, self.analyze, self.verbose, self.format)
        columns = [pa.array([r[i] for r in rows], pa.string()) for i in (0, 1)]
        batch = pa.RecordBatch.from_arrays(columns, schema=EXPLAIN_SCHEMA)
        return iter([batch])

    def to_arrow_table(self, progress: bool = False) -> pa.Table:
        """The rows ``(plan_type, plan)`` as a table."""
        return pa.Table.from_batches(self.collect(progress=progress), schema=EXPLAIN_SCHEMA)
