"""Streamed exchanges (issue #14): consumers and the caller get rows while a producer still runs.

The producer stage applies ``gated`` (tests/udf_funcs.py): its first batch
(keys below 8192) passes at once, every later batch waits until the test
creates the gate file. So the producer cannot finish before the caller has
seen rows -- unless batches only move once a task is done, in which case the
gated calls wait :data:`~tests.udf_funcs.GATE_TIMEOUT_S` in vain and say so in
``<gate>.timeout``. Each test asserts on those events (the gate closed when the
first rows arrived, no timeout), never on wall time.

Two plans: the producer's output read by the head stage (``leaf -> coalesce -> head``),
and read by a join stage between them (``leaf -> shuffle -> join -> head``,
the join's small side read whole, its probe side streamed). The workers have
two slots each, so the join's tasks can run next to the producer's.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distfusion import DistributedConfig, DistributedContext, QueryCancelled
from distfusion.runtime.flight import FlightRuntime
from distfusion.runtime.local import LocalRuntime
from distfusion.worker import stream_inputs
from distfusion.worker.task_output import TaskOutput
from tests.flight_cluster import start_workers, stop_workers
from tests.udf_funcs import FREE_BELOW, gated

FILES = 4
ROWS_PER_FILE = 3 * FREE_BELOW  # three row groups of 8192 keys per file: one batch each
GROUPS = 50

# The producer is the leaf stage scanning ``big``; the head stage reads it.
HEAD_READS_PRODUCER = "SELECT k, gated(k, '{gate}') AS v FROM big"
# A join stage between them: ``small`` (left, read whole) builds, the gated
# side (shuffled) is its streamed probe side.
JOIN_STAGE_READS_PRODUCER = (
    "SELECT a.k, a.v, s.name FROM small s "
    "JOIN (SELECT k, g, gated(k, '{gate}') AS v FROM big) a ON a.g = s.g"
)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """``big``: FILES Parquet files of 8192-row row groups; ``small``: GROUPS rows."""
    root = tmp_path_factory.mktemp("streaming")
    big = root / "big"
    big.mkdir()
    for f in range(FILES):
        keys = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        table = pa.table(
            {"k": pa.array(keys, pa.int64()), "g": pa.array([k % GROUPS for k in keys], pa.int64())}
        )
        pq.write_table(table, big / f"{f}.parquet", row_group_size=FREE_BELOW)
    small = pa.table(
        {"g": pa.array(range(GROUPS), pa.int64()), "name": [f"group {i}" for i in range(GROUPS)]}
    )
    pq.write_table(small, root / "small.parquet")
    return root


def _gated_workers(stream_task_inputs: str):
    """Two Flight workers (2 slots) with the gate UDFs; their ``DISTFUSION_STREAM_TASK_INPUTS``."""
    procs = start_workers(
        2,
        "--slots",
        "2",
        "--udf",
        "tests.udf_funcs:STREAMING_UDFS",
        env={"DISTFUSION_STREAM_TASK_INPUTS": stream_task_inputs},
    )
    yield [p.url for p in procs]
    stop_workers(procs)


@pytest.fixture(scope="module")
def flight_workers_with_gate():
    yield from _gated_workers("1")


# One DataFusion partition per task: a gated call holds a tokio thread while it
# waits, as the streams' pulls may hold the threads beyond the cores
# (PullSlots): together they must leave a thread free. The join plan then holds
# 2 gated calls + 3 pulls of the 6 threads of 2 cores (with 2 partitions, all 6).
@pytest.fixture(params=["local", "flight"])
def runtime(request, monkeypatch):
    monkeypatch.setenv("DISTFUSION_STREAM_TASK_INPUTS", "1")  # the join stage's too
    if request.param == "local":
        rt = LocalRuntime(workers=2, slots=2, target_partitions=1)
    else:
        rt = FlightRuntime(request.getfixturevalue("flight_workers_with_gate"), target_partitions=1)
    yield rt
    rt.close()


def _context(runtime, tables, tasks: int, **settings) -> DistributedContext:
    config = DistributedConfig(
        tasks_per_stage=tasks,
        broadcast_threshold_bytes=0,
        max_broadcast_bytes=0,
        replicate_scan_bytes=0,
        adaptive=False,
        **settings,
    )
    ctx = DistributedContext(runtime=runtime, config=config)
    ctx.register_udf(gated)
    ctx.register_parquet("big", str(tables / "big"))
    ctx.register_parquet("small", str(tables / "small.parquet"))
    return ctx


@pytest.mark.parametrize(
    ("sql", "stages", "tasks"),
    [(HEAD_READS_PRODUCER, 2, 2), (JOIN_STAGE_READS_PRODUCER, 4, 2)],
    ids=["head_reads_producer", "join_stage_reads_producer"],
)
def test_rows_reach_the_caller_before_the_producer_finishes(
    runtime, tables, tmp_path, sql, stages, tasks
):
    _first_rows_before_the_producer_ends(runtime, tables, tmp_path, sql, stages, tasks)


def test_flight_head_streams_without_tokio_threads_beyond_the_cores(
    flight_workers_with_gate, tables, tmp_path, monkeypatch
):
    """The Flight head stage streams with the pull slots of a default process.

    No slot for producers in this process; the head stage streams anyway (its
    producers run in the workers), through the one slot left for remote producers.
    """
    monkeypatch.setattr(stream_inputs, "pull_slots", stream_inputs.PullSlots(0, 1))
    runtime = FlightRuntime(flight_workers_with_gate, target_partitions=1)
    try:
        _first_rows_before_the_producer_ends(runtime, tables, tmp_path, HEAD_READS_PRODUCER, 2, 2)
    finally:
        runtime.close()
    assert stream_inputs.pull_slots.used == 0


@pytest.fixture(scope="module")
def flight_workers_told_nothing():
    """As ``flight_workers_with_gate``, without ``DISTFUSION_STREAM_TASK_INPUTS``."""
    yield from _gated_workers("")


def test_the_query_setting_reaches_workers_whose_environment_says_nothing(
    flight_workers_told_nothing, tables, tmp_path, monkeypatch
):
    """``stream_task_inputs=True`` travels in the task plans: the join stage's tasks stream."""
    monkeypatch.delenv("DISTFUSION_STREAM_TASK_INPUTS", raising=False)
    runtime = FlightRuntime(flight_workers_told_nothing, target_partitions=1)
    try:
        _first_rows_before_the_producer_ends(
            runtime, tables, tmp_path, JOIN_STAGE_READS_PRODUCER, 4, 2, stream_task_inputs=True
        )
    finally:
        runtime.close()


def _first_rows_before_the_producer_ends(
    runtime, tables, tmp_path, sql, stages, tasks, **settings
) -> None:
    gate = str(tmp_path / "gate")
    df = _context(runtime, tables, tasks, **settings).sql(sql.format(gate=gate))
    assert len(df.stage_graph().stages) == stages, df.explain()
    rows = 0
    closed_when_first_rows_came = None
    for batch in df.execute_stream():
        if closed_when_first_rows_came is None and batch.num_rows:
            closed_when_first_rows_came = not os.path.exists(gate)
            open(gate, "w").close()  # let the producer go on
        rows += batch.num_rows
    assert not os.path.exists(f"{gate}.timeout"), "the producer waited for rows nobody got"
    assert closed_when_first_rows_came, "the first rows came after the producer finished"
    assert rows == FILES * ROWS_PER_FILE


# ------------------------------------------------------------------ the exchange buffer
def _batch(i: int) -> pa.RecordBatch:
    keys = range(i * 100, (i + 1) * 100)
    return pa.record_batch({"k": pa.array(keys, pa.int64()), "s": [f"row {k}" for k in keys]})


def test_a_task_output_is_read_while_written_and_across_its_spill(tmp_path):
    """A reader gets each batch as it is added, before and after the partition spills."""
    path = str(tmp_path / "p0.arrow")
    out = TaskOutput(1, lambda p: path, memory_limit_bytes=None)
    reader = out.stream(0)
    out.add(0, _batch(0))
    out.add(0, _batch(1))
    assert next(reader).column("k")[0].as_py() == 0  # the task has not finished
    out.spill()  # batch 1 now in the file, read from there
    out.add(0, _batch(2))  # appended to the file
    assert next(reader).column("k")[0].as_py() == 100
    assert next(reader).column("k")[0].as_py() == 200
    out.add(0, _batch(3))
    out.finish()
    assert [b.column("k")[0].as_py() for b in reader] == [300]
    whole = pa.Table.from_batches(out.read(0))
    assert whole.column("k").to_pylist() == list(range(400))
    out.close()
    assert not os.path.exists(path)


def test_readers_of_a_failed_or_freed_output_raise(tmp_path):
    out = TaskOutput(2)
    first, second = out.stream(0), out.stream(1)
    out.add(0, _batch(0))
    assert next(first).num_rows == 100
    out.fail(QueryCancelled("query q was cancelled"))
    with pytest.raises(QueryCancelled):
        next(first)
    out.close()
    with pytest.raises(QueryCancelled):  # the error comes before the freed partition
        next(second)
