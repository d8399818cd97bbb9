"""Execute one task: bind its inputs as tables, run its fragment, partition the output.

```
 work units ─┐                      ┌─ partition 0 ─> consumer task 0
             ├─> SessionContext ──> fragment (Substrait) ──> split ─┤
 inputs ─────┘   (tables)            DataFusion             └─ partition n-1
```

Leaf tasks register their share of each source table under the table's name;
other tasks register the partitions their producers made for them under
``__stage_N``. The fragment is consumed with ``datafusion.substrait.Consumer``
(in pieces when it nests deeper than DataFusion's decoder allows:
:func:`~distfusion.substrait_plan.decode.consume_plan`) and executed natively. A
shuffle output gets a partition id per row,
``pmod(xxhash64(keys), n)`` (Spark's hash, computed by DataFusion's Spark
functions), so equal keys land in the same partition whichever task produced
them; integer keys are cast to ``int64`` first because the hash depends on the
Arrow type (the rule the planner shares: :mod:`distfusion.protocol.hashing`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
from datafusion import (
    DataFrame,
    RuntimeEnvBuilder,
    SessionConfig,
    SessionContext,
    col,
    functions,
    lit,
)
from datafusion.functions import spark as spark_functions

from distfusion import udfs
from distfusion.errors import DistfusionError, QueryCancelledError, TaskError
from distfusion.io import object_store
from distfusion.io.sources import SPARK, WorkUnit, register_scan, sql_name
from distfusion.metrics.task import TaskMeter, TaskMetrics
from distfusion.protocol.errors import is_task_failure, task_error
from distfusion.protocol.hashing import hash_type
from distfusion.protocol.task_plan import ScanShare, TaskPlan
from distfusion.session import SessionSettings
from distfusion.stages import SHUFFLE, StageInput
from distfusion.substrait_plan.decode import consume_plan
from distfusion.work_unit_feed.table import rebuild_source
from distfusion.worker import memory_retry as retry
from distfusion.worker import stream_inputs
from distfusion.worker.interrupt import iterate_native
from distfusion.worker.memory import TaskMemory
from distfusion.worker.spark_partitions import spark_chunks, spark_schema
from distfusion.worker.stream_inputs import InputBinding, InputStreams, metered, stream_plan

__all__ = [
    "Inputs",
    "PartitionSink",
    "SpillMetrics",
    "build_dataframe",
    "feed_dataframes",
    "partition_output",
    "run_task",
    "run_task_into",
    "stream_head_stage",
    "task_meter",
    "task_context",
    "without_views",
]

PARTITION_ID = "__distfusion_pid"
COORDINATOR = "coordinator"
"""The worker name in errors of tasks run on the coordinator (the head stage)."""


log = logging.getLogger("distfusion.worker")


def task_context(
    target_partitions: int,
    memory: TaskMemory | None = None,
    settings: dict[str, str] | None = None,
    greedy: bool = False,
    session: SessionSettings | None = None,
) -> SessionContext:
    """A fresh DataFusion context for one task, with its query's UDFs and object stores.

    Args:
        target_partitions: threads (DataFusion partitions) the task may use.
        memory: its memory pool and spill directory; None: unbounded, as
            DataFusion's default (the system's temp directory for spills).
        settings: more DataFusion settings (``{"datafusion.optimizer.prefer_hash_join": "false"}``).
        greedy: a bounded pool is DataFusion's greedy pool, not its fair spill
            pool: operators take what they need until the task's total
            reaches the bound, then spill. For the runtime's default bound
            (the plan sets no ``memory_per_task_bytes``): a fair pool gives
            each spilling operator an equal share, and a leaf task reads
            each file as a partition of its own, each with its aggregate, so
            TPC-H SF10 Q18's final aggregate spilled at a 41st of 6 GiB.
        session: the query's UDFs and object stores (the task plan's:
            :mod:`distfusion.session`), registered in this context only, before
            any plan is decoded; None: none. This process's stores
            (:data:`~distfusion.io.object_store.PROCESS`) come first, for a bucket
            the query has none for (one an Iceberg scan found while it ran);
            the query's replace those of the same bucket.
    """
    config = SessionConfig().with_target_partitions(max(1, target_partitions))
    if memory is not None and memory.pool_bytes is not None:
        # A sort keeps this much back to merge its spill files (DataFusion's default
        # 10 MiB): more than a small pool holds, which would fail sorts, not spill them.
        reserve = min(10 * 1024 * 1024, max(64 * 1024, memory.pool_bytes // 8))
        config = config.set("datafusion.execution.sort_spill_reservation_bytes", str(reserve))
    for key, value in (settings or {}).items():
        config = config.set(key, value)
    if memory is None or (memory.pool_bytes is None and memory.spill_dir is None):
        ctx = SessionContext(config)
        object_store.add_to(ctx)  # this process's stores: a bucket the query has none for
        if session is not None:
            session.add_to(ctx)
        return ctx
    runtime = RuntimeEnvBuilder()
    if memory.pool_bytes is not None and greedy:
        runtime = runtime.with_greedy_memory_pool(int(memory.pool_bytes))
    elif memory.pool_bytes is not None:
        runtime = runtime.with_fair_spill_pool(int(memory.pool_bytes))
    if memory.spill_dir is not None:
        runtime = runtime.with_disk_manager_specified(memory.spill_dir)
    else:
        runtime = runtime.with_disk_manager_os()
    ctx = SessionContext(config, runtime)
    object_store.add_to(ctx)  # this process's stores: a bucket the query has none for
    if session is not None:
        session.add_to(ctx)
    return ctx


@dataclass
class SpillMetrics:
    """What DataFusion's operators spilled while a task ran (summed over its operators).

    Attributes:
        spilled_bytes: bytes written to spill files.
        spill_count: spill events.
    """

    spilled_bytes: int = 0
    spill_count: int = 0

    def add_plan(self, plan) -> None:
        """Add the spill metrics of every operator of ``plan`` (an executed ExecutionPlan)."""
        try:
            for _, ms in plan.collect_metrics():
                self.spilled_bytes += ms.spilled_bytes or 0
                self.spill_count += ms.spill_count or 0
        except Exception:  # metrics are a report, never a reason to fail the task
            log.debug("no metrics from the executed plan", exc_info=True)


def _as_declared(batches: list[pa.RecordBatch], schema: pa.Schema) -> list[pa.RecordBatch]:
    """Non-empty ``batches`` with the declared ``schema``, columns matched by position."""
    out = []
    for b in batches:
        if b.num_rows == 0:
            continue
        if b.schema.equals(schema):
            out.append(b)
            continue
        columns = [
            c if c.type == f.type else c.cast(f.type)
            for c, f in zip(b.columns, schema, strict=True)
        ]
        out.append(pa.RecordBatch.from_arrays(columns, schema=schema))
    return out


Inputs = list[pa.RecordBatch] | InputStreams
"""What ``read_input(i)`` returns: the input's batches, or streams to pull them from."""


def bind_input(
    ctx: SessionContext,
    inp: StageInput,
    batches: Inputs,
    target_partitions: int,
    binding: InputBinding | None = None,
    replay: Callable[[int], bool] = lambda _size: False,
) -> int | None:
    """Register input ``inp`` as table ``inp.table``, split into up to ``target_partitions``.

    ``batches`` given as :class:`~distfusion.worker.stream_inputs.InputStreams`
    are streamed (DataFusion pulls them per batch, one stream per partition)
    when ``binding`` is given and the process has pull slots for them; else
    they are read whole first. An input read whole is registered as a memory
    table, or, when ``replay(its Arrow bytes)`` says so, replayed from memory
    through ``binding`` so that a cancelled task stops at its next batch
    (:meth:`~distfusion.worker.stream_inputs.InputBinding.replay`).

    Returns:
        None when the input is streamed or replayed; else its Arrow bytes.
    """
    if isinstance(batches, InputStreams):
        if binding is not None:
            dataset = binding.stream(inp.table, inp.schema, batches, target_partitions)
            if dataset is not None:
                ctx.register_dataset(inp.table, dataset)
                return None
        batches = batches.read_all()
    batches = _as_declared(batches, inp.schema)
    if not batches:
        ctx.register_record_batches(
            inp.table, [[pa.RecordBatch.from_pylist([], schema=inp.schema)]]
        )
        return 0
    size = sum(b.nbytes for b in batches)
    if binding is not None and replay(size):
        ctx.register_dataset(
            inp.table, binding.replay(inp.table, inp.schema, batches, target_partitions)
        )
        return None
    n = max(1, min(target_partitions, len(batches)))
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
    for i, b in enumerate(batches):
        parts[i % n].append(b)
    ctx.register_record_batches(inp.table, parts)
    return size


def build_dataframe(
    plan: TaskPlan,
    read_input: Callable[[int], Inputs],
    memory: TaskMemory | None = None,
    settings: dict[str, str] | None = None,
    binding: InputBinding | None = None,
    stream: bool = True,
) -> tuple[SessionContext, DataFrame]:
    """The task's fragment as a DataFusion DataFrame, inputs bound.

    With ``binding``, the inputs :func:`~distfusion.worker.stream_inputs.stream_plan`
    allows are read through it: streamed when given as streams and
    ``stream`` is true, else replayed from memory (a task without scans
    only: a streamed or replayed input turns off filter pushdown, which
    scans of files need). Either way a cancelled task's next pull of them
    raises, wherever DataFusion is in the fragment.

    Args:
        plan: the task plan.
        read_input: ``read_input(i)`` returns the batches of ``plan.inputs[i]`` this
            task reads (its partition from every producer task), as a list or
            as :class:`~distfusion.worker.stream_inputs.InputStreams`.
        memory: the task's memory pool and spill directory (see :func:`task_context`).
        settings: more DataFusion settings.
        binding: streams or replays inputs (see :func:`bind_input`); None
            reads them whole into memory tables.
        stream: stream the inputs given as streams (else they are read whole).

    Raises:
        Exception: DataFusion's error (file unreadable, fragment rejected); the
            caller wraps it with the task's identity.
    """
    ctx = task_context(
        plan.target_partitions,
        memory,
        settings,
        plan.memory_per_task_bytes is None,
        plan.session,
    )
    for share in plan.scans:
        register_scan(ctx, share.source, share.units)
    inputs = [read_input(i) for i in range(len(plan.inputs))]
    decide = None
    if binding is not None and plan.inputs:
        decide = stream_plan(plan.fragment, [inp.table for inp in plan.inputs])
    whole: dict[str, int] = {}
    via_dataset = False
    # Inputs read whole go first: a probe side streams once its build side's size is known.
    order = sorted(
        range(len(inputs)),
        key=lambda i: decide is not None and plan.inputs[i].table not in decide.whole,
    )
    for i in order:
        inp = plan.inputs[i]
        got = inputs[i]
        streams = stream and decide is not None and decide.streams(inp.table, whole)
        if isinstance(got, InputStreams) and not streams:
            got = got.read_all()

        def replay(size: int, table: str = inp.table) -> bool:
            return not plan.scans and decide is not None and decide.streams(table, whole, size)

        size = bind_input(ctx, inp, got, plan.target_partitions, binding, replay)
        if size is None:
            via_dataset = True
        else:
            whole[inp.table] = size
    if via_dataset:  # filters pushed into a dataset scan would run in pyarrow (stream_inputs)
        ctx.remove_optimizer_rule("push_down_filter")
    return ctx, ctx.create_dataframe_from_logical_plan(_consume(ctx, plan.fragment))


_UDF_HINT = (
    " is unknown to this worker; if it is a Python UDF, register it with "
    "ctx.register_udf(distfusion.udf(...)), ctx.register_udaf(distfusion.udaf(...)) or "
    "ctx.register_udwf(distfusion.udwf(...)) (local and Spark runtimes), or start "
    "Flight workers with --udf package.module:name"
)
# DataFusion's Substrait consumer on a function its session lacks (scalar, aggregate, window).
_UNKNOWN_FUNCTION = re.compile(
    r'Unsupported function name: "([^"]+)"|(?:Aggregate|Window) function (\S+) is not supported'
)


def _consume(ctx: SessionContext, fragment: bytes):
    """DataFusion's logical plan of ``fragment``; an unknown function's error says how to add a UDF.

    Raises:
        Exception: DataFusion's error, for an unknown function with the UDF's
            name (a mergeable UDAF's, not its companion's) and :data:`_UDF_HINT`.
    """
    try:
        return consume_plan(ctx, fragment)
    except Exception as exc:
        found = _UNKNOWN_FUNCTION.search(str(exc))
        if found:
            name = found.group(1) or found.group(2)
            for suffix in (udfs.PARTIAL_SUFFIX, udfs.FINAL_SUFFIX):
                name = name.removesuffix(suffix)
            raise type(exc)(f"{exc} -- function {name!r}{_UDF_HINT}") from exc
        raise


def stream_batches(
    df: DataFrame,
    cancelled: Callable[[], bool],
    metrics: SpillMetrics | None = None,
    binding: InputBinding | None = None,
) -> Iterator[pa.RecordBatch]:
    """Execute ``df``, yielding Arrow batches; stops with QueryCancelledError when asked.

    ``cancelled()`` is checked between batches and while waiting for one.
    DataFusion runs in a helper thread and this generator waits for its
    batches in Python (:func:`~distfusion.worker.interrupt.iterate_native`):
    the calling thread's :class:`~distfusion.worker.interrupt.Interruptible`
    (a worker's task, a result stream) stops the wait within 0.1 s, even
    where DataFusion yields nothing for a long time (an aggregate over a
    join). DataFusion's own work then stops at its next yield, when the
    helper drops the stream. Over streamed or replayed inputs (``binding``)
    the pulls check ``cancelled()`` too and fail DataFusion's stream
    wherever it pulls (a hash join's probe, an aggregate); the error a pull
    raised (a producer's TaskError, the cancellation) is raised here rather
    than DataFusion's text of it. ``metrics`` then gets what the operators
    spilled.

    Two ways that did not stop DataFusion sooner: polling every partition of
    the physical plan from an event loop (to drop the streams the moment the
    flag is set) slowed every query, and DataFusion's operators still ran on
    to their next yield point (docs/benchmarks.md, "Cancellation"); awaiting
    this one stream (``__anext__``) ran two tasks' single-partition plans on
    one core, and cancelling the await did not stop them.

    Raises:
        QueryCancelledError: ``cancelled()`` became true, or the thread was interrupted.
        Exception: DataFusion's error while executing.
    """
    batches = iterate_native(df.execute_stream, cancelled, "running a fragment")
    try:
        for rb in batches:
            if cancelled():
                raise QueryCancelledError("query cancelled")
            batch = rb.to_pyarrow()
            if batch.num_rows:
                yield batch
    except Exception as exc:
        if binding is not None and binding.error is not None and exc is not binding.error:
            raise binding.error from None
        raise
    finally:
        batches.close()  # the helper drops the stream: DataFusion's partition tasks end
    if metrics is not None:
        metrics.add_plan(df.execution_plan())


def _projects_scans(df: DataFrame) -> bool:
    """Whether ``df`` is table scans under projections and unions only.

    A projection over it is then pushed into the scans by DataFusion's
    physical optimizer. Read from the plan as consumed, not optimized (which
    costs ~1 ms per task, and DataFusion optimizes again to run it): a filter
    there stays above the Parquet scans after optimizing, as they take
    filters inexactly.
    """
    stack = [df.logical_plan()]
    while stack:
        node = stack.pop()
        kind = type(node.to_variant()).__name__
        if kind == "TableScan":
            return True
        if kind in ("Projection", "Union", "SubqueryAlias"):
            stack.extend(node.inputs())
    return False


def _hash_key(expr, dtype: pa.DataType):
    target = hash_type(dtype)
    return expr if target == dtype else expr.cast(target)


def without_views(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with string/binary view columns as plain string/binary columns.

    Called before a stage output is written as Arrow IPC (Spark records, Flight
    streams). A view array out of a join or a filter still points at every data buffer of
    its input (e.g. all the names of a broadcast table), and Arrow IPC writes
    every referenced buffer with every batch: a stage output of 30 MB became
    240 MB. Plain strings carry only their own bytes; the consumer casts them
    back to the declared schema (``_as_declared``).
    """
    types = batch.schema.types
    if not any(pa.types.is_string_view(t) or pa.types.is_binary_view(t) for t in types):
        return batch
    columns = [
        c.cast(pa.string())
        if pa.types.is_string_view(c.type)
        else c.cast(pa.binary())
        if pa.types.is_binary_view(c.type)
        else c
        for c in batch.columns
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


class PartitionSink(Protocol):
    """Where :func:`partition_output` puts each output batch.

    A worker's :class:`~distfusion.worker.task_output.TaskOutput`, or plain lists.
    """

    def add(self, partition: int, batch: pa.RecordBatch) -> None: ...  # noqa: D102


class _Lists:
    """A :class:`PartitionSink` keeping one list of batches per partition."""

    def __init__(self, n: int) -> None:
        self.parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]

    def add(self, partition: int, batch: pa.RecordBatch) -> None:
        self.parts[partition].append(batch)

    def reset(self) -> None:
        self.parts = [[] for _ in self.parts]


def partition_output(
    df: DataFrame,
    plan: TaskPlan,
    cancelled: Callable[[], bool],
    sink: PartitionSink | None = None,
    metrics: SpillMetrics | None = None,
    meter: TaskMeter | None = None,
) -> list[list[pa.RecordBatch]] | None:
    """Execute ``df`` and split its rows into ``plan.output.num_partitions`` partitions.

    Args:
        df: the task's fragment.
        plan: the task plan (its ``output`` says how to split).
        cancelled: polled while executing (see :func:`stream_batches`).
        sink: receives ``(partition, batch)`` as batches are produced; None:
            lists, returned.
        metrics: gets what DataFusion spilled.
        meter: told which DataFrame runs, for its operator metrics.

    Returns:
        Without ``sink``: one list of RecordBatch per output partition (columns
        ``c0..``, the declared ``num_columns`` only). With one: None.

    Raises:
        QueryCancelledError: ``cancelled()`` became true.
        Exception: DataFusion's error while executing.
    """
    if sink is not None:
        _partition_into(df, plan, cancelled, sink, metrics, meter)
        return None
    lists = _Lists(plan.output.num_partitions)
    _partition_into(df, plan, cancelled, lists, metrics, meter)
    return lists.parts


def _partition_into(
    df: DataFrame,
    plan: TaskPlan,
    cancelled: Callable[[], bool],
    sink: PartitionSink,
    metrics: SpillMetrics | None,
    meter: TaskMeter | None = None,
    binding: InputBinding | None = None,
) -> None:
    out = plan.output
    n = out.num_partitions
    schema = df.schema()
    keep = [col(f'"{name}"') for name in schema.names[: out.num_columns]]

    def batches(frame: DataFrame) -> Iterator[pa.RecordBatch]:
        if meter is not None:
            meter.executed(frame)
        return stream_batches(frame, cancelled, metrics, binding)

    if out.kind != SHUFFLE or n == 1:
        if len(keep) != len(schema):
            df = df.select(*keep)
        for b in batches(df):
            sink.add(0, b)
        return
    if not out.key_columns:
        df = df.select(*keep) if len(keep) != len(schema) else df
        for i, b in enumerate(batches(df)):
            sink.add(i % n, b)
        return
    files = any(s.source.format not in ("memory", SPARK) for s in plan.scans)
    if files and _projects_scans(df):
        # DataFusion would evaluate the hash inside the Parquet scans, where a file
        # whose statistics make a key column constant (one value, or only NULLs)
        # gives the column as a scalar: xxhash64 of scalars panics. A filter
        # DataFusion cannot drop keeps the hash above the scans
        # (docs/datafusion-bugs.md).
        df = df.filter(functions.random() >= lit(0.0))
    keys = [_hash_key(col(f'"{schema.names[k]}"'), schema.field(k).type) for k in out.key_columns]
    pid = spark_functions.pmod(spark_functions.xxhash64(*keys), lit(n))
    # pyarrow has no take kernel for string_view or binary_view: views become plain
    # strings and binaries here (the consumer casts them back to its declared schema).
    body = [
        c.cast(pa.string())
        if pa.types.is_string_view(schema.field(i).type)
        else c.cast(pa.binary())
        if pa.types.is_binary_view(schema.field(i).type)
        else c
        for i, c in enumerate(keep)
    ]
    # The planner's appended key columns are selected too, and dropped below:
    # a computed column used twice is not inlined into the hash by DataFusion's
    # optimizer, so xxhash64 always hashes a column. Inlined, a key that is a
    # scalar at run time (a CASE of literals whose rows all take one branch)
    # made datafusion-spark's xxhash64 panic over a batch of several rows
    # (docs/datafusion-bugs.md).
    appended = [
        col(f'"{schema.names[k]}"').alias(f"{PARTITION_ID}_key{k}")
        for k in out.key_columns
        if k >= len(keep)
    ]
    df = df.select(*body, *appended, pid.cast(pa.int64()).alias(PARTITION_ID))
    rows_of = list(range(len(keep)))
    for b in batches(df):
        ids = b.column(b.num_columns - 1).to_numpy()
        counts = np.bincount(ids, minlength=n)
        rows = b.select(rows_of)
        if np.count_nonzero(counts) == 1:
            sink.add(int(ids[0]), rows)
            continue
        rows = rows.take(pa.array(np.argsort(ids, kind="stable")))
        offset = 0
        for p in range(n):
            if counts[p]:
                sink.add(p, rows.slice(offset, counts[p]))
                offset += counts[p]


FeedChunks = Callable[[ScanShare], Iterator[list[WorkUnit]]]
"""``feed_chunks(share)``: the work units of a feed scan for this task, in chunks
as they arrive (a worker's :class:`~distfusion.worker.feed_inbox.FeedInbox`)."""


def _no_feeds(share: ScanShare) -> Iterator[list[WorkUnit]]:
    msg = f"table {share.source.name!r} is fed at run time, but this task has no feed"
    raise TaskError(-1, -1, "", msg)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns (by name) and types."""
    if batch.schema.equals(schema):
        return batch
    columns = []
    for f in schema:
        c = batch.column(f.name)
        columns.append(c if c.type == f.type else c.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _read_units(source, units: list[WorkUnit], schema: pa.Schema) -> list[pa.RecordBatch]:
    """Every batch of ``units``, read with the feed-backed ``source`` (its ``read``)."""
    out = []
    for unit in units:
        reader = source.read(unit)
        for batch in reader:
            if batch.num_rows:
                out.append(_conform(batch, schema))
    return out


def _scan_units(
    ctx: SessionContext, source, units: list[WorkUnit], meter: TaskMeter | None
) -> DataFrame:
    """``units`` read natively by ``source.scan`` (a FeedTableSource that implements it).

    Their bytes count as the task's source bytes (``meter``).

    Raises:
        Exception: ``scan``'s error (a file gone, unreadable, a schema it refuses).
    """
    if meter is not None:
        meter.unit_bytes += sum(u.size_bytes for u in units)
    return source.scan(ctx, units)


def _register_frames(ctx: SessionContext, name: str, frames: list[DataFrame]) -> None:
    """Register the union of ``frames`` (a native feed scan's chunks) as view ``name``."""
    if name in ctx.catalog().schema().names():
        ctx.deregister_table(sql_name(name))
    df = frames[0]
    for other in frames[1:]:
        df = df.union(other)
    ctx.register_view(sql_name(name), df)


def _register_feed(
    ctx: SessionContext, name: str, schema: pa.Schema, batches: list[pa.RecordBatch], n: int
) -> None:
    """Register ``batches`` as table ``name``, split into up to ``n`` partitions."""
    if name in ctx.catalog().schema().names():
        ctx.deregister_table(sql_name(name))
    if not batches:
        empty = [[pa.RecordBatch.from_pylist([], schema=schema)]]
        ctx.register_record_batches(sql_name(name), empty)
        return
    n = max(1, min(n, len(batches)))
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
    for i, b in enumerate(batches):
        parts[i % n].append(b)
    ctx.register_record_batches(sql_name(name), parts)


def _register_spark(ctx: SessionContext, source, batches: list[pa.RecordBatch], n: int) -> None:
    """Register a Spark table's batches as ``source.name``, with every column of its schema.

    When Spark computed only some columns (``columns``), they are registered
    as a table of their own and ``source.name`` is a view over it adding the
    others as typed NULLs: the fragment's positional field references stay
    valid, and DataFusion prunes those columns (no fragment reads them).
    """
    cols = source.options.get("columns")
    if cols is None:
        _register_feed(ctx, source.name, source.schema, batches, n)
        return
    inner = f"__distfusion_spark_{source.name}"
    _register_feed(ctx, inner, spark_schema(source), batches, n)
    table = ctx.table(sql_name(inner))
    exprs = [
        col(f'"{f.name}"') if i in cols else lit(None).cast(f.type).alias(f.name)
        for i, f in enumerate(source.schema)
    ]
    if source.name in ctx.catalog().schema().names():
        ctx.deregister_table(sql_name(source.name))
    ctx.register_view(sql_name(source.name), table.select(*exprs))


def feed_dataframes(
    plan: TaskPlan,
    read_input: Callable[[int], Inputs],
    feed_chunks: FeedChunks,
    memory: TaskMemory | None = None,
    meter: TaskMeter | None = None,
) -> Iterator[tuple[SessionContext, DataFrame]]:
    """The fragment of a task that reads streamed tables, as DataFrames to run in turn.

    Streamed tables are work unit feeds and Spark DataFrames
    (:attr:`~distfusion.io.sources.TableSource.streamed`); a Spark table's rows
    are the batches of the Spark partition offered to this task
    (:mod:`distfusion.worker.spark_partitions`), in chunks of
    :data:`~distfusion.worker.spark_partitions.SPARK_CHUNK_BYTES`. Yields
    ``(context, DataFrame)`` pairs (one context for the whole task, bounded by
    ``memory``).

    A fragment linear in its one streamed table (the planner marks its scan
    ``chunked``) yields one DataFrame per chunk, as the chunk arrives: reading
    and executing start with the first unit or batch, and the outputs
    concatenated equal one run over all of them (docs/work-unit-feeds.md).
    Otherwise each chunk is read as it arrives and one DataFrame over all of
    them is yielded at the end (the task then holds the whole partition in
    memory). An empty feed or partition yields one DataFrame over an empty
    table (a global partial aggregate then says "0 rows", as a task without
    units does).

    A feed whose source reads natively
    (:attr:`~distfusion.work_unit_feed.FeedTableSource.scans_natively`: an
    Iceberg table's Parquet files) is not read in Python: each chunk of units
    becomes the DataFrame ``source.scan(ctx, units)`` returns, registered as
    the table (chunked), or the union of every chunk's DataFrame (whole:
    DataFusion then reads all the files when the fragment runs, not holding
    them in memory first).

    Raises:
        FeedError: a feed's provider failed, or the feed cannot be reached.
        TaskError: a Spark table's partition was not offered to this task.
        Exception: DataFusion's error; ``read``'s error.
    """
    ctx = task_context(
        plan.target_partitions,
        memory,
        greedy=plan.memory_per_task_bytes is None,
        session=plan.session,
    )
    feeds = [s for s in plan.scans if s.source.streamed]
    for share in plan.scans:
        if not share.source.streamed:
            register_scan(ctx, share.source, share.units)
    for i, inp in enumerate(plan.inputs):
        bind_input(ctx, inp, read_input(i), plan.target_partitions)
    readers = {}
    for share in feeds:
        o = share.source.options
        if share.source.is_feed:
            readers[share.source.name] = rebuild_source(
                o["feed_id"], o["reader"], o["state"], share.source.schema
            )

    def chunks(share: ScanShare) -> Iterator[list[pa.RecordBatch] | DataFrame]:
        if share.source.is_spark:
            return spark_chunks(plan.key, share, meter)
        reader = readers[share.source.name]
        if reader.scans_natively:  # DataFusion reads the units: a DataFrame per chunk
            return (_scan_units(ctx, reader, c, meter) for c in feed_chunks(share))
        return (_read_units(reader, c, share.source.schema) for c in feed_chunks(share))

    n = plan.target_partitions

    def register(source, got: list[pa.RecordBatch] | list[DataFrame]) -> None:
        if source.is_spark:
            _register_spark(ctx, source, got, n)
        elif got and isinstance(got[0], DataFrame):
            _register_frames(ctx, source.name, got)
        else:
            _register_feed(ctx, source.name, source.schema, got, n)

    if len(feeds) == 1 and feeds[0].source.options.get("chunked"):
        source = feeds[0].source
        ran = False
        for chunk in chunks(feeds[0]):
            register(source, [chunk] if isinstance(chunk, DataFrame) else chunk)
            ran = True
            yield ctx, ctx.create_dataframe_from_logical_plan(_consume(ctx, plan.fragment))
        if not ran:  # an empty feed or partition (read once: not asked again)
            register(source, [])
            yield ctx, ctx.create_dataframe_from_logical_plan(_consume(ctx, plan.fragment))
        return
    for share in feeds:
        got = []
        for chunk in chunks(share):
            if isinstance(chunk, DataFrame):
                got.append(chunk)
            else:
                got.extend(chunk)
        register(share.source, got)
    yield ctx, ctx.create_dataframe_from_logical_plan(_consume(ctx, plan.fragment))


def _read_once(plan: TaskPlan, read_input: Callable[[int], Inputs]) -> Callable[[int], Inputs]:
    """``read_input`` reading each input once, kept as bound for a run again (views cast once).

    Streamed inputs are kept as their streams: a run again replays them
    (:class:`~distfusion.worker.stream_inputs.InputBinding`).
    """
    inputs: dict[int, Inputs] = {}

    def read(i: int) -> Inputs:
        if i not in inputs:
            got = read_input(i)
            if not isinstance(got, InputStreams):
                got = _as_declared(got, plan.inputs[i].schema)
            inputs[i] = got
        return inputs[i]

    return read


class _Resettable(PartitionSink, Protocol):
    def reset(self) -> None: ...


def run_task_into(
    sink: _Resettable,
    plan: TaskPlan,
    read_input: Callable[[int], Inputs],
    cancelled: Callable[[], bool] = lambda: False,
    worker: str = "local",
    feed_chunks: FeedChunks = _no_feeds,
    memory: TaskMemory | None = None,
    meter: TaskMeter | None = None,
) -> SpillMetrics:
    """Run one task to completion, its output partitions into ``sink``.

    The fragment runs within ``memory`` (a fair spill pool: sorts, aggregates
    and sort-merge joins spill to ``memory.spill_dir``). An operator that cannot
    spill and needs more than the pool (a hash join's build side) fails with
    DataFusion's "Resources exhausted"; the task then runs again, its output
    ``sink.reset()``, in the ways :mod:`~distfusion.worker.memory_retry` lists
    (sort-merge joins; unbounded only with ``plan.unbounded_memory_retry``).
    A task reading a work unit feed runs once (its feed is consumed).

    Args:
        sink: gets ``(partition, batch)`` as batches are produced; ``reset()``
            forgets them before a run again.
        plan: what to run.
        read_input: see :func:`build_dataframe`; called once per input.
        cancelled: checked between batches; true stops the task at DataFusion's
            next batch.
        worker: the URL of the worker running the task, for error messages.
        feed_chunks: the units of each feed scan of a leaf task, in chunks as
            they arrive (see :func:`feed_dataframes`).
        memory: the task's memory pool and spill directory; None: unbounded.
        meter: measures the run (inputs read, DataFrames executed) for the
            task's :class:`~distfusion.metrics.TaskMetrics`.

    Returns:
        What DataFusion's operators spilled, summed over the runs.

    Raises:
        TaskError: the fragment failed (DataFusion's message and the traceback
            kept), an input's producer task failed (that task's error), or a
            work unit feed failed (its FeedError's message: feed and partition);
            over ``memory`` every run (``MemoryBudgetExceeded``: the operator).
        QueryCancelledError: the query was cancelled.
    """
    metrics = SpillMetrics()
    if meter is not None:
        read_input = metered(meter, read_input)
    try:
        if any(s.source.streamed for s in plan.scans):
            for _ctx, df in feed_dataframes(plan, read_input, feed_chunks, memory, meter):
                _partition_into(df, plan, cancelled, sink, metrics, meter)
            return metrics
        read_once = _read_once(plan, read_input)
        attempts = retry.memory_attempts(memory, plan.unbounded_memory_retry)
        binding = InputBinding(cancelled, keep=len(attempts) > 1)
        streaming = stream_inputs.streams_task_inputs(plan.stream_inputs)
        try:
            for n, run in enumerate(attempts):
                try:
                    ctx, df = build_dataframe(plan, read_once, *run[:2], binding, streaming)
                    _partition_into(df, plan, cancelled, sink, metrics, meter, binding)
                    return metrics
                except (TaskError, QueryCancelledError):
                    raise
                except Exception as exc:
                    if not retry.is_exhausted(exc):
                        raise
                    if n + 1 == len(attempts) or getattr(sink, "streamed", False):
                        raise retry.over_budget(memory, n + 1, exc) from exc
                    sink.reset()
                    binding.error = None
                    retry.warn_run_again(plan, memory, attempts[n + 1], exc)
                    if meter is not None:
                        meter.ran_again(attempts[n + 1].name)
        finally:
            binding.close()
        raise AssertionError("unreachable")  # pragma: no cover
    except (TaskError, QueryCancelledError):
        raise
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        raise task_error(plan.key.stage_id, plan.key.task_index, worker, exc) from exc


def run_task(
    plan: TaskPlan,
    read_input: Callable[[int], Inputs],
    cancelled: Callable[[], bool] = lambda: False,
    worker: str = "local",
    feed_chunks: FeedChunks = _no_feeds,
    memory: TaskMemory | None = None,
    on_metrics: Callable[[TaskMetrics], None] | None = None,
) -> list[list[pa.RecordBatch]]:
    """Run one task to completion; its output as lists (see :func:`run_task_into`).

    ``on_metrics`` is called once with the task's
    :class:`~distfusion.metrics.TaskMetrics` when it succeeded (never when it
    failed), before this returns.

    Returns:
        One list of RecordBatch per output partition.

    Raises:
        TaskError: the fragment failed, an input's producer task failed, or a
            work unit feed failed (see :func:`run_task_into`).
        QueryCancelledError: the query was cancelled.
    """
    lists = _Lists(plan.output.num_partitions)
    meter = task_meter(plan, worker) if on_metrics is not None else None
    run_task_into(lists, plan, read_input, cancelled, worker, feed_chunks, memory, meter)
    if meter is not None and on_metrics is not None:  # the meter is made for on_metrics
        on_metrics(meter.finish(lists.parts))
    return lists.parts


def task_meter(plan: TaskPlan, worker: str) -> TaskMeter:
    """A :class:`~distfusion.metrics.task.TaskMeter` for ``plan``'s task, run by ``worker``.

    The work unit bytes come from the plan's scans (``source_bytes`` when
    DataFusion reports no ``bytes_scanned``); operator metrics as the plan says.
    """
    unit_bytes = sum(u.size_bytes for share in plan.scans for u in share.units)
    return TaskMeter(
        plan.key.stage_id,
        plan.key.task_index,
        worker,
        len(plan.inputs),
        unit_bytes,
        operators=plan.operator_metrics,
    )


def stream_head_stage(
    plan: TaskPlan,
    read_input: Callable[[int], Inputs],
    feed_chunks: FeedChunks = _no_feeds,
    memory: TaskMemory | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    on_metrics: Callable[[TaskMetrics], None] | None = None,
    remote_inputs: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Run the head stage's only task on the coordinator, yielding its result batches.

    Every runtime ends a query with this. A head stage that reads a feed
    (a one-task query) streams each chunk's result as it is computed. It runs
    within ``memory``; over it before its first batch, it runs again as
    :func:`run_task_into` says (after a batch went out, the error is raised).
    Closing the iterator stops its DataFusion work. ``on_metrics`` is called
    with the head task's metrics once the last batch was yielded (not when the
    caller stops early or it fails). ``remote_inputs``: the producers run in
    other processes (see :class:`~distfusion.worker.stream_inputs.PullSlots`).

    Raises:
        DistfusionError: reading an input failed (a producer's TaskError, a
            transport error) or a feed's provider failed (FeedError), passed on
            as it is.
        QueryCancelledError: ``cancelled()`` became true.
        TaskError: the fragment failed here (worker ``coordinator``) or over ``memory``.
    """
    meter = task_meter(plan, COORDINATOR)
    read_input = metered(meter, read_input)
    rows = nbytes = 0
    try:
        if any(s.source.streamed for s in plan.scans):
            for _ctx, df in feed_dataframes(plan, read_input, feed_chunks, memory, meter):
                meter.executed(df)
                for batch in stream_batches(df, cancelled):
                    rows += batch.num_rows
                    nbytes += batch.nbytes
                    yield batch
        else:
            read_once = _read_once(plan, read_input)
            attempts = retry.memory_attempts(memory, plan.unbounded_memory_retry)
            binding = InputBinding(cancelled, keep=len(attempts) > 1, remote=remote_inputs)
            try:
                for n, run in enumerate(attempts):
                    yielded = False
                    try:
                        _ctx, df = build_dataframe(plan, read_once, *run[:2], binding)
                        meter.executed(df)
                        for batch in stream_batches(df, cancelled, None, binding):
                            if not yielded:  # no run again from here: drop what streams kept
                                binding.stop_keeping()
                            yielded = True
                            rows += batch.num_rows
                            nbytes += batch.nbytes
                            yield batch
                        break
                    except DistfusionError:
                        raise
                    except Exception as exc:
                        if not retry.is_exhausted(exc):
                            raise
                        if yielded or n + 1 == len(attempts):
                            raise retry.over_budget(memory, n + 1, exc) from exc
                        binding.error = None
                        retry.warn_run_again(plan, memory, attempts[n + 1], exc)
                        meter.ran_again(attempts[n + 1].name)
            finally:
                binding.close()
        if on_metrics is not None:
            on_metrics(meter.finish(None, rows, nbytes))
    except DistfusionError:
        raise
    except BaseException as exc:  # a native panic too (is_task_failure); not GeneratorExit
        if not is_task_failure(exc):
            raise
        raise task_error(plan.key.stage_id, plan.key.task_index, COORDINATOR, exc) from exc
