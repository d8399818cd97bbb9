"""Running a query stage by stage (``Runtime.start_query``), as adaptive execution does.

On real workers: the local runtime's threads, and Flight worker processes on
127.0.0.1 (the session's ``flight_workers``). The query is a grouped sum, so
its stage graph has a shuffle::

    Stage 3 [head]     <- coalesce from stage 2
    Stage 2 [2 tasks]  final aggregate     <- shuffle from stage 1 (2 partitions)
    Stage 1 [2 tasks]  partial aggregate of t

Between calls the graph is rewritten the way adaptive execution rewrites it:
a finished shuffle stage is read as a broadcast, or its partitions coalesced
into one task (``StageInput.groups``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import (
    DistributedConfig,
    DistributedContext,
    LocalRuntime,
    QueryCancelled,
    TaskError,
)
from distfusion.coordinator.query_run import QueryRun, StageStats
from distfusion.protocol import TaskKey
from distfusion.runtime.flight import FlightRuntime
from distfusion.stages import BROADCAST, SHUFFLE, StageGraph
from tests.compare import assert_same_result, oracle_result
from tests.flight_cluster import start_workers, stop_workers

ROWS = 2000
KEYS = 13
WORKERS = 3
SQL = "SELECT k, sum(v) AS s, count(*) AS c FROM t GROUP BY k ORDER BY k"


def _table() -> pa.Table:
    return pa.table(
        {
            "k": pa.array([i % KEYS for i in range(ROWS)], pa.int64()),
            "v": pa.array([float(i) for i in range(ROWS)]),
            "s": pa.array(["x" if i == ROWS - 1 else str(i) for i in range(ROWS)]),
        }
    )


def _local():
    runtime = LocalRuntime(workers=WORKERS)
    return runtime, runtime.urls


def _flight(flight_workers):
    urls = flight_workers[:WORKERS]
    return FlightRuntime(urls), urls


@pytest.fixture(scope="module", params=["local", "flight"])
def cluster(request):
    """``(runtime, worker URLs)``: three workers, closed at the end of the module."""
    if request.param == "local":
        runtime, urls = _local()
    else:
        runtime, urls = _flight(request.getfixturevalue("flight_workers"))
    yield runtime, urls
    runtime.close()


@pytest.fixture(scope="module")
def oracle() -> SessionContext:
    ctx = SessionContext()
    ctx.register_record_batches("t", [_table().to_batches()])
    return ctx


def _context(runtime) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    # 20 work units of 100 rows: each of the 2 leaf tasks sees every key.
    ctx.register_table("t", _table(), max_rows_per_unit=100)
    return ctx


def _graph(runtime, sql: str = SQL) -> StageGraph:
    graph = _context(runtime).sql(sql).stage_graph()
    return dataclasses.replace(graph, query_id=str(uuid.uuid4()))


def _result(batches, graph: StageGraph, expected: pa.Table) -> pa.Table:
    batches = list(batches)
    table = pa.Table.from_batches(batches) if batches else graph.head.output_schema.empty_table()
    return table.rename_columns(expected.column_names)


def _wait_idle(runtime, timeout_s: float = 10.0) -> None:
    """Wait until no worker holds a task, a byte or (Flight) a query."""

    def idle() -> bool:
        return all(
            s["live_tasks"] == 0 and s["bytes_held"] == 0 and s.get("live_queries", 0) == 0
            for s in runtime.stats().values()
        )

    deadline = time.monotonic() + timeout_s
    while not idle():
        assert time.monotonic() < deadline, runtime.stats()
        time.sleep(0.02)


def test_run_stages_measures_outputs_then_streams_the_head(cluster, oracle):
    runtime, urls = cluster
    graph = _graph(runtime)
    leaf, final, head = graph.stages
    assert leaf.output.kind == SHUFFLE and leaf.output.num_partitions == 2
    run = runtime.start_query(graph.query_id)
    assert isinstance(run, QueryRun)
    try:
        stats = run.run_stages(graph, [leaf.stage_id])
        assert set(stats) == {leaf.stage_id}
        st = stats[leaf.stage_id]
        assert isinstance(st, StageStats) and st.stage_id == leaf.stage_id
        # A partial aggregate per task, each task seeing every key.
        assert len(st.partition_rows) == len(st.partition_bytes) == 2
        assert st.rows == 2 * KEYS
        assert all(b > 0 for b in st.partition_bytes) and st.elapsed_s > 0
        # Round-robin from the first worker; the stats are what the partitions hold,
        # and the outputs are kept: read every partition twice.
        assert [run.placement[(leaf.stage_id, t)] for t in range(2)] == urls[:2]
        for _ in range(2):
            for p in range(2):
                read = sum(
                    b.num_rows
                    for t in range(2)
                    for b in runtime.transport.execute_partition(
                        run.placement[(leaf.stage_id, t)],
                        TaskKey(graph.query_id, leaf.stage_id, t),
                        p,
                    )
                )
                assert read == st.partition_rows[p]

        stats = run.run_stages(graph, [final.stage_id])
        assert stats[final.stage_id].rows == KEYS  # each key finished in one task
        assert len(stats[final.stage_id].partition_rows) == 1
        # A stage that ran is not run again: the same stats come back.
        assert run.run_stages(graph, [leaf.stage_id]) == {leaf.stage_id: st}
        # Placement continued where it stopped (task 2 of the query -> worker 2).
        assert [run.placement[(final.stage_id, t)] for t in range(2)] == [urls[2], urls[0]]

        expected = oracle_result(oracle, SQL)
        got = _result(run.stream_head(graph), graph, expected)
        assert_same_result(got, expected, ordered=True)
    finally:
        run.close()
    _wait_idle(runtime)


def test_a_finished_shuffle_is_read_again_as_a_broadcast_and_coalesced(cluster, oracle):
    runtime, urls = cluster
    graph = _graph(runtime)
    leaf, final, head = graph.stages
    shuffle_read = final.inputs[0]
    assert shuffle_read.boundary == SHUFFLE and shuffle_read.stage_id == leaf.stage_id
    run = runtime.start_query(graph.query_id)
    try:
        leaf_stats = run.run_stages(graph, [leaf.stage_id])[leaf.stage_id]
        placed = {k: u for k, u in run.placement.items()}

        # Every task of a new stage reads all of the shuffle output.
        as_broadcast = dataclasses.replace(
            shuffle_read, boundary=BROADCAST, partitions=leaf.output.num_partitions
        )
        bcast = dataclasses.replace(final, stage_id=10, inputs=(as_broadcast,))
        bhead = dataclasses.replace(
            head, stage_id=11, inputs=(dataclasses.replace(head.inputs[0], stage_id=10),)
        )
        g_bcast = StageGraph(graph.query_id, (leaf, bcast, bhead))
        stats = run.run_stages(g_bcast, [10])
        # Each of the 2 tasks aggregated every row of the leaf: every key twice.
        assert stats[10].rows == 2 * KEYS

        # One task reads both shuffle partitions (coalesced), then the head.
        coalesced = dataclasses.replace(
            final,
            stage_id=20,
            num_tasks=1,
            inputs=(dataclasses.replace(shuffle_read, groups=((0, 1),)),),
        )
        chead = dataclasses.replace(
            head, stage_id=21, inputs=(dataclasses.replace(head.inputs[0], stage_id=20),)
        )
        g_coalesced = StageGraph(graph.query_id, (leaf, coalesced, chead))
        expected = oracle_result(oracle, SQL)
        got = _result(run.stream_head(g_coalesced), g_coalesced, expected)
        assert_same_result(got, expected, ordered=True)

        # The leaf ran once and kept its workers; new stages continued the round-robin.
        assert {k: u for k, u in run.placement.items() if k[0] == leaf.stage_id} == placed
        assert [run.placement[(10, t)] for t in range(2)] == [urls[2], urls[0]]
        assert run.placement[(20, 0)] == urls[1]
        assert leaf_stats.rows == 2 * KEYS
    finally:
        run.close()
    _wait_idle(runtime)


def test_close_early_or_an_error_leaves_every_worker_idle(cluster):
    runtime, urls = cluster

    # Stages ran, the head never did: close frees their kept outputs; twice is fine.
    graph = _graph(runtime)
    run = runtime.start_query(graph.query_id)
    run.run_stages(graph, [graph.stages[0].stage_id, graph.stages[1].stage_id])
    assert any(s["bytes_held"] > 0 for s in runtime.stats().values())
    run.close()
    run.close()
    _wait_idle(runtime)
    with pytest.raises(QueryCancelled):
        run.run_stages(graph, [graph.stages[0].stage_id])

    # The head's iterator closed after its first batch.
    graph = _graph(runtime, "SELECT k, v FROM t ORDER BY v")
    run = runtime.start_query(graph.query_id)
    batches = run.stream_head(graph)
    next(batches)
    batches.close()
    _wait_idle(runtime)
    run.close()

    # A task fails in run_stages: its TaskError arrives whole, the run is closed.
    graph = _graph(runtime, "SELECT k, CAST(max(s) AS INT) AS m FROM t GROUP BY k")
    leaf, final = graph.stages[0], graph.stages[1]
    run = runtime.start_query(graph.query_id)
    run.run_stages(graph, [leaf.stage_id])
    with pytest.raises(TaskError) as info:
        run.run_stages(graph, [final.stage_id])
    assert info.value.stage_id == final.stage_id and info.value.worker in urls
    assert "Cannot cast string 'x'" in info.value.cause
    _wait_idle(runtime)
    with pytest.raises(QueryCancelled):
        list(run.stream_head(graph))

    # The same failure while streaming the head.
    graph = _graph(runtime, "SELECT k, CAST(max(s) AS INT) AS m FROM t GROUP BY k")
    run = runtime.start_query(graph.query_id)
    with pytest.raises(TaskError):
        list(run.stream_head(graph))
    _wait_idle(runtime)


def test_execute_runs_the_graph_at_once_and_leaves_workers_idle(cluster, oracle):
    runtime, _ = cluster
    graph = _graph(runtime)
    expected = oracle_result(oracle, SQL)
    assert_same_result(_result(runtime.execute(graph), graph, expected), expected, ordered=True)
    _wait_idle(runtime)


def test_a_write_whose_head_alone_runs_on_a_worker_leaves_it_idle(cluster, tmp_path):
    # No stage task runs before the head: the worker writing it was cancelled by nobody.
    runtime, _ = cluster
    ctx = _context(runtime)
    files = ctx.sql("SELECT 1 AS id, 'k' AS p").write_parquet(tmp_path / "out")
    assert sum(f.rows for f in files) == 1
    _wait_idle(runtime, timeout_s=5.0)


def test_flight_run_survives_losing_a_worker_between_calls(oracle):
    workers = start_workers(2)
    runtime = FlightRuntime([w.url for w in workers], max_retries=1)
    try:
        graph = _graph(runtime)
        leaf = graph.stages[0]
        run = runtime.start_query(graph.query_id)
        first = run.run_stages(graph, [leaf.stage_id])[leaf.stage_id]
        victim = run.placement[(leaf.stage_id, 0)]
        next(w for w in workers if w.url == victim).kill()
        # The kept output on the dead worker is gone: the head's read fails, the
        # leaf runs again on the survivor, then the rest.
        expected = oracle_result(oracle, SQL)
        got = _result(run.stream_head(graph), graph, expected)
        assert_same_result(got, expected, ordered=True)
        assert set(run.placement.values()) == {w.url for w in workers if w.url != victim}
        assert first.rows == 2 * KEYS
        survivors = FlightRuntime([w.url for w in workers if w.url != victim])
        _wait_idle(survivors)
        survivors.close()
    finally:
        runtime.close()
        stop_workers(workers)
