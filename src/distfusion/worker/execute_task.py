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
:func:`~distfusion.planner.substrait.consume_plan`) and executed natively. A
shuffle output gets a partition id per row,
``pmod(xxhash64(keys), n)`` (Spark's hash, computed by DataFusion's Spark
functions), so equal keys land in the same partition whichever task produced
them; integer keys are cast to ``int64`` first because the hash depends on the
Arrow type (the rule the planner shares: :mod:`distfusion.protocol.hashing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
from datafusion import DataFrame, SessionConfig, SessionContext, col, lit
from datafusion.functions import spark as spark_functions

from distfusion.errors import DistfusionError, QueryCancelled, TaskError
from distfusion.metrics.task import TaskMeter, TaskMetrics
from distfusion.planner.substrait import consume_plan
from distfusion.protocol.errors import task_error
from distfusion.protocol.hashing import hash_type
from distfusion.protocol.task_plan import ScanShare, TaskPlan
from distfusion.sources import WorkUnit, register_scan
from distfusion.stages import SHUFFLE, StageInput
from distfusion.work_unit_feed.table import rebuild_source

__all__ = [
    "build_dataframe",
    "feed_dataframes",
    "partition_output",
    "run_task",
    "stream_head_stage",
    "task_context",
    "without_views",
]

PARTITION_ID = "__distfusion_pid"
COORDINATOR = "coordinator"
"""The worker name in errors of tasks run on the coordinator (the head stage)."""


def task_context(target_partitions: int) -> SessionContext:
    """A fresh DataFusion context for one task, using ``target_partitions`` threads."""
    config = SessionConfig().with_target_partitions(max(1, target_partitions))
    return SessionContext(config)


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


def bind_input(
    ctx: SessionContext, inp: StageInput, batches: list[pa.RecordBatch], target_partitions: int
) -> None:
    """Register ``batches`` as table ``inp.table``, split into up to ``target_partitions``."""
    batches = _as_declared(batches, inp.schema)
    if not batches:
        ctx.register_record_batches(
            inp.table, [[pa.RecordBatch.from_pylist([], schema=inp.schema)]]
        )
        return
    n = max(1, min(target_partitions, len(batches)))
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
    for i, b in enumerate(batches):
        parts[i % n].append(b)
    ctx.register_record_batches(inp.table, parts)


def build_dataframe(
    plan: TaskPlan, read_input: Callable[[int], list[pa.RecordBatch]]
) -> tuple[SessionContext, DataFrame]:
    """The task's fragment as a DataFusion DataFrame, inputs bound.

    Args:
        plan: the task plan.
        read_input: ``read_input(i)`` returns the batches of ``plan.inputs[i]`` this
            task reads (its partition from every producer task).

    Raises:
        Exception: DataFusion's error (file unreadable, fragment rejected); the
            caller wraps it with the task's identity.
    """
    ctx = task_context(plan.target_partitions)
    for share in plan.scans:
        register_scan(ctx, share.source, share.units)
    for i, inp in enumerate(plan.inputs):
        bind_input(ctx, inp, read_input(i), plan.target_partitions)
    logical = consume_plan(ctx, plan.fragment)
    return ctx, ctx.create_dataframe_from_logical_plan(logical)


def stream_batches(df: DataFrame, cancelled: Callable[[], bool]) -> Iterator[pa.RecordBatch]:
    """Execute ``df``, yielding Arrow batches; stops with QueryCancelled when asked.

    Raises:
        QueryCancelled: ``cancelled()`` became true.
    """
    for rb in df.execute_stream():
        if cancelled():
            raise QueryCancelled("query cancelled")
        batch = rb.to_pyarrow()
        if batch.num_rows:
            yield batch


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


def partition_output(
    df: DataFrame,
    plan: TaskPlan,
    cancelled: Callable[[], bool],
    meter: TaskMeter | None = None,
) -> list[list[pa.RecordBatch]]:
    """Execute ``df`` and split its rows into ``plan.output.num_partitions`` lists.

    ``meter`` (when given) is told which DataFrame runs, for its operator metrics.

    Returns:
        One list of RecordBatch per output partition (columns ``c0..``, the
        declared ``num_columns`` only).

    Raises:
        QueryCancelled: ``cancelled()`` became true.
        Exception: DataFusion's error while executing.
    """
    out = plan.output
    n = out.num_partitions
    schema = df.schema()
    keep = [col(f'"{name}"') for name in schema.names[: out.num_columns]]
    if out.kind != SHUFFLE or n == 1:
        if len(keep) != len(schema):
            df = df.select(*keep)
        if meter is not None:
            meter.executed(df)
        return [list(stream_batches(df, cancelled))]
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
    if not out.key_columns:
        df = df.select(*keep) if len(keep) != len(schema) else df
        if meter is not None:
            meter.executed(df)
        for i, b in enumerate(stream_batches(df, cancelled)):
            parts[i % n].append(b)
        return parts
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
    df = df.select(*body, pid.cast(pa.int64()).alias(PARTITION_ID))
    if meter is not None:
        meter.executed(df)
    for b in stream_batches(df, cancelled):
        ids = b.column(len(keep)).to_numpy()
        counts = np.bincount(ids, minlength=n)
        rows = b.drop_columns([PARTITION_ID])
        if np.count_nonzero(counts) == 1:
            parts[int(ids[0])].append(rows)
            continue
        rows = rows.take(pa.array(np.argsort(ids, kind="stable")))
        offset = 0
        for p in range(n):
            if counts[p]:
                parts[p].append(rows.slice(offset, counts[p]))
                offset += counts[p]
    return parts


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


def _register_feed(
    ctx: SessionContext, name: str, schema: pa.Schema, batches: list[pa.RecordBatch], n: int
) -> None:
    """Register ``batches`` as table ``name``, split into up to ``n`` partitions."""
    if name in ctx.catalog().schema().names():
        ctx.deregister_table(name)
    if not batches:
        ctx.register_record_batches(name, [[pa.RecordBatch.from_pylist([], schema=schema)]])
        return
    n = max(1, min(n, len(batches)))
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
    for i, b in enumerate(batches):
        parts[i % n].append(b)
    ctx.register_record_batches(name, parts)


def feed_dataframes(
    plan: TaskPlan,
    read_input: Callable[[int], list[pa.RecordBatch]],
    feed_chunks: FeedChunks,
) -> Iterator[DataFrame]:
    """The fragment of a task that reads work unit feeds, as DataFrames to run in turn.

    A fragment linear in its one feed (the planner marks its scan ``chunked``)
    yields one DataFrame per chunk of units, as the chunk arrives: reading and
    executing start with the first unit, and the outputs concatenated equal
    one run over every unit (docs/work-unit-feeds.md). Otherwise each unit is
    read as it arrives and one DataFrame over all of them is yielded at the end
    of the feeds. An empty feed yields one DataFrame over an empty table (a
    global partial aggregate then says "0 rows", as a task without units does).

    Raises:
        FeedError: a feed's provider failed, or the feed cannot be reached.
        Exception: DataFusion's error; ``read``'s error.
    """
    ctx = task_context(plan.target_partitions)
    feeds = [s for s in plan.scans if s.source.is_feed]
    for share in plan.scans:
        if not share.source.is_feed:
            register_scan(ctx, share.source, share.units)
    for i, inp in enumerate(plan.inputs):
        bind_input(ctx, inp, read_input(i), plan.target_partitions)
    readers = {}
    for share in feeds:
        o = share.source.options
        readers[share.source.name] = rebuild_source(
            o["feed_id"], o["reader"], o["state"], share.source.schema
        )
    n = plan.target_partitions
    if len(feeds) == 1 and feeds[0].source.options.get("chunked"):
        source = feeds[0].source
        ran = False
        for chunk in feed_chunks(feeds[0]):
            batches = _read_units(readers[source.name], chunk, source.schema)
            _register_feed(ctx, source.name, source.schema, batches, n)
            ran = True
            yield ctx.create_dataframe_from_logical_plan(consume_plan(ctx, plan.fragment))
        if ran:
            return
    for share in feeds:
        batches = []
        for chunk in feed_chunks(share):
            batches.extend(_read_units(readers[share.source.name], chunk, share.source.schema))
        _register_feed(ctx, share.source.name, share.source.schema, batches, n)
    yield ctx.create_dataframe_from_logical_plan(consume_plan(ctx, plan.fragment))


def run_task(
    plan: TaskPlan,
    read_input: Callable[[int], list[pa.RecordBatch]],
    cancelled: Callable[[], bool] = lambda: False,
    worker: str = "local",
    feed_chunks: FeedChunks = _no_feeds,
    on_metrics: Callable[[TaskMetrics], None] | None = None,
) -> list[list[pa.RecordBatch]]:
    """Run one task to completion.

    Args:
        plan: what to run.
        read_input: see :func:`build_dataframe`.
        cancelled: polled between batches; true stops the task.
        worker: the URL of the worker running the task, for error messages.
        feed_chunks: the units of each feed scan of a leaf task, in chunks as
            they arrive (see :func:`feed_dataframes`).
        on_metrics: called once with the task's
            :class:`~distfusion.metrics.TaskMetrics` when it succeeded (never
            when it failed), before this returns.

    Returns:
        One list of RecordBatch per output partition.

    Raises:
        TaskError: the fragment failed (DataFusion's message and the traceback
            kept), an input's producer task failed (that task's error), or a
            work unit feed failed (its FeedError's message: feed and partition).
        QueryCancelled: the query was cancelled.
    """
    meter = _meter(plan, worker)
    read_input = meter.reading(read_input)
    try:
        if any(s.source.is_feed for s in plan.scans):
            parts: list[list[pa.RecordBatch]] | None = None
            for df in feed_dataframes(plan, read_input, feed_chunks):
                out = partition_output(df, plan, cancelled, meter)
                if parts is None:
                    parts = out
                else:
                    for mine, more in zip(parts, out, strict=True):
                        mine.extend(more)
            parts = parts or [[] for _ in range(plan.output.num_partitions)]
        else:
            _, df = build_dataframe(plan, read_input)
            parts = partition_output(df, plan, cancelled, meter)
        if on_metrics is not None:
            on_metrics(meter.finish(parts))
        return parts
    except (TaskError, QueryCancelled):
        raise
    except Exception as exc:
        raise task_error(plan.key.stage_id, plan.key.task_index, worker, exc) from exc


def _meter(plan: TaskPlan, worker: str) -> TaskMeter:
    """A meter for ``plan``'s task (work unit bytes known from its scans)."""
    unit_bytes = sum(u.size_bytes for share in plan.scans for u in share.units)
    return TaskMeter(
        plan.key.stage_id, plan.key.task_index, worker, len(plan.inputs), unit_bytes
    )


def stream_head_stage(
    plan: TaskPlan,
    read_input: Callable[[int], list[pa.RecordBatch]],
    feed_chunks: FeedChunks = _no_feeds,
    on_metrics: Callable[[TaskMetrics], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run the head stage's only task on the coordinator, yielding its result batches.

    Every runtime ends a query with this. A head stage that reads a feed
    (a one-task query) streams each chunk's result as it is computed.
    ``on_metrics`` is called with the head task's metrics once the last
    batch was yielded (not when the caller stops early or it fails).

    Raises:
        DistfusionError: reading an input failed (a producer's TaskError, a
            transport error) or a feed's provider failed (FeedError), passed on
            as it is.
        TaskError: the fragment failed here (worker ``coordinator``).
    """
    meter = _meter(plan, COORDINATOR)
    read_input = meter.reading(read_input)
    rows = nbytes = 0
    try:
        if any(s.source.is_feed for s in plan.scans):
            frames = feed_dataframes(plan, read_input, feed_chunks)
        else:
            frames = iter([build_dataframe(plan, read_input)[1]])
        for df in frames:
            meter.executed(df)
            for batch in stream_batches(df, lambda: False):
                rows += batch.num_rows
                nbytes += batch.nbytes
                yield batch
        if on_metrics is not None:
            on_metrics(meter.finish(None, rows, nbytes))
    except DistfusionError:
        raise
    except Exception as exc:
        raise task_error(plan.key.stage_id, plan.key.task_index, COORDINATOR, exc) from exc
