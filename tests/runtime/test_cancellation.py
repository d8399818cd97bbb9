"""Real cancellation (issue #14): a cancelled query stops DataFusion's work on every worker.

Each test starts a self-join that keeps every worker busy for many seconds,
cancels it while the join runs (closing the query run, as a coordinator does
on Ctrl-C, an error or a satisfied LIMIT), waits for the event that the
worker's task ended, then measures the worker process's CPU time for a
second: an idle process uses a few milliseconds, a join still running in
DataFusion's threads a core or more. The margins are wide on purpose (a busy
machine slows the cancellation down, not the idle process up); nothing
here bounds wall-clock time tightly.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from distfusion import DistributedConfig, DistributedContext, QueryCancelled, tpch
from distfusion.runtime.flight import FlightRuntime
from distfusion.runtime.local import LocalRuntime
from distfusion.worker.worker import Worker
from tests.cpu import IDLE_CPU_S, cpu_in, wait_until_idle
from tests.flight_cluster import start_workers, stop_workers

# A join of lineitem with itself, 600 matches per row, in the stage that scans
# the probe side's Parquet files (the build side is broadcast): DataFusion
# yields between its reads, where a dropped stream stops. Tens of seconds of
# CPU per task, uncancelled.
HEAVY = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s FROM lineitem a "
    "JOIN lineitem b ON a.l_suppkey = b.l_suppkey AND a.l_orderkey <> b.l_orderkey"
)
# The same join's rows, a few of them: satisfied by the first batches of the
# join (streamed to the head stage), long before the join could end.
HEAVY_LIMIT = (
    "SELECT a.l_orderkey, b.l_orderkey AS other FROM lineitem a "
    "JOIN lineitem b ON a.l_suppkey = b.l_suppkey AND a.l_orderkey <> b.l_orderkey LIMIT 5"
)
# A shuffle join in a stage of its own: the small side (one line per order,
# ~2 MiB per task) builds, lineitem streams in as the probe side, 1,500
# matches per row feed an aggregate. Tens of seconds of CPU per task,
# uncancelled; the pulls of the probe side are where a cancelled task stops
# (read whole, the join would run to its end: the aggregate yields nothing before).
STREAMED_JOIN = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s "
    "FROM (SELECT l_suppkey % 100 AS k, l_quantity FROM lineitem WHERE l_linenumber = 1) b "
    "JOIN lineitem a ON a.l_suppkey % 100 = b.k"
)
SHUFFLED = DistributedConfig(
    tasks_per_stage=2, broadcast_threshold_bytes=0, max_broadcast_bytes=0, adaptive=False
)
STOP_WITHIN_S = 10.0
"""Bound for every worker to be idle after a satisfied LIMIT: about a second of
work is left (a batch per task), the rest is margin for a busy machine."""
BROADCAST_ALL = 2**40
STOP_TIMEOUT_S = 30.0
"""Wide bound for a task to notice its cancellation (it polls every 0.05 s)."""
IDLE_TIMEOUT_S = 60.0
"""Wide bound for DataFusion to stop after its streams were dropped: at its next
yield point (an input batch past tokio's budget, an I/O wait)."""


def wait_until(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - start


def _start_heavy(runtime, tpch_dir, tasks: int, sql: str = HEAVY, config=None):
    """Run every non-head stage of ``sql`` in a thread; returns (run, thread, errors)."""
    if config is None:
        config = DistributedConfig(tasks_per_stage=tasks, broadcast_threshold_bytes=BROADCAST_ALL)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    graph = ctx.sql(sql).stage_graph()
    run = runtime.start_query(graph.query_id)
    errors: list[BaseException] = []

    def go():
        try:
            run.run_stages(graph, [s.stage_id for s in graph.stages[:-1]])
        except BaseException as exc:  # the cancellation, expected
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return run, thread, errors


def test_local_cancellation_stops_datafusion_in_the_workers(tpch_dir):
    runtime = LocalRuntime(workers=2)
    pid = os.getpid()
    try:
        run, thread, errors = _start_heavy(runtime, tpch_dir, tasks=2)
        wait_until(lambda: any(s["running_tasks"] for s in runtime.stats().values()), 60)
        time.sleep(1.0)  # deep into the join
        assert cpu_in(pid, 1.0) > IDLE_CPU_S, "the join was not running"
        assert thread.is_alive(), "the query ended before it could be cancelled"
        run.close()
        wait_until(
            lambda: not any(s["running_tasks"] for s in runtime.stats().values()), STOP_TIMEOUT_S
        )
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        assert errors and isinstance(errors[0], QueryCancelled), errors
        wait_until_idle([pid], IDLE_TIMEOUT_S)
        assert all(s["live_tasks"] == 0 for s in runtime.stats().values())
    finally:
        runtime.close()


def test_worker_close_does_not_wait_for_running_tasks(tpch_dir):
    runtime = LocalRuntime(workers=2)
    workers: list[Worker] = list(runtime.transport.workers.values())
    run, thread, errors = _start_heavy(runtime, tpch_dir, tasks=2)
    try:
        wait_until(lambda: any(w.stats()["running_tasks"] for w in workers), 60)
        time.sleep(0.5)
        assert thread.is_alive()
        for w in workers:
            w.close()  # returns at once; the tasks see the cancellation and end
        wait_until(lambda: not any(w.stats()["running_tasks"] for w in workers), STOP_TIMEOUT_S)
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        assert errors and isinstance(errors[0], QueryCancelled), errors
        assert all(w.spill.files() == [] for w in workers)
    finally:
        run.close()


@pytest.fixture
def two_workers():
    procs = start_workers(2)
    yield procs
    stop_workers(procs)


def test_flight_cancellation_stops_datafusion_in_the_worker_processes(two_workers, tpch_dir):
    runtime = FlightRuntime([p.url for p in two_workers])
    pids = [p.proc.pid for p in two_workers]
    try:
        run, thread, errors = _start_heavy(runtime, tpch_dir, tasks=2)
        wait_until(lambda: all(s["running_tasks"] for s in runtime.stats().values()), 60)
        time.sleep(1.0)
        assert thread.is_alive(), "the query ended before it could be cancelled"
        assert sum(cpu_in(pid, 1.0) for pid in pids) > IDLE_CPU_S, "the join was not running"
        run.close()
        wait_until(
            lambda: (
                not any(s["running_tasks"] or s["live_tasks"] for s in runtime.stats().values())
            ),
            STOP_TIMEOUT_S,
        )
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        wait_until_idle(pids, IDLE_TIMEOUT_S)
    finally:
        runtime.close()


def test_spark_cancellation_stops_datafusion_in_the_executor_workers(runtime_for, tpch_dir):
    runtime = runtime_for("spark", 2)
    if runtime.data_plane != "flight":
        pytest.skip("the executors' Flight workers exist on the Flight data plane only")
    # A first query makes the executors' Flight workers known (their URLs and pids).
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    ctx.sql(tpch.query(6)).to_arrow_table()
    run, thread, errors = _start_heavy(runtime, tpch_dir, tasks=2)
    try:

        def executors() -> dict[str, dict]:
            return {u: s for u, s in runtime.stats().items() if u != runtime.sc.master}

        wait_until(lambda: any(s["running_tasks"] for s in executors().values()), 120)
        time.sleep(1.0)
        assert thread.is_alive(), "the query ended before it could be cancelled"
        pids = [s["pid"] for s in executors().values() if s["running_tasks"]]
        run.close()  # cancels the job group and the query on every executor worker
        wait_until(
            lambda: not any(s["running_tasks"] for s in executors().values()), STOP_TIMEOUT_S
        )
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        wait_until_idle(pids, IDLE_TIMEOUT_S)  # Spark may also end the Python workers
    finally:
        run.close()
        thread.join(STOP_TIMEOUT_S)


def _limit_query(runtime, tpch_dir) -> int:
    """Run HEAVY_LIMIT to its end on ``runtime``; the rows it returned."""
    config = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=BROADCAST_ALL)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    return ctx.sql(HEAVY_LIMIT).to_arrow_table().num_rows


def test_local_satisfied_limit_stops_the_join_in_the_workers(tpch_dir):
    runtime = LocalRuntime(workers=2)
    try:
        assert _limit_query(runtime, tpch_dir) == 5
        wait_until_idle([os.getpid()], STOP_WITHIN_S)
        assert all(s["live_tasks"] == 0 for s in runtime.stats().values())
    finally:
        runtime.close()


def test_flight_satisfied_limit_stops_the_join_in_the_worker_processes(two_workers, tpch_dir):
    runtime = FlightRuntime([p.url for p in two_workers])
    try:
        assert _limit_query(runtime, tpch_dir) == 5
        wait_until_idle([p.proc.pid for p in two_workers], STOP_WITHIN_S)
        wait_until(
            lambda: not any(s["live_tasks"] for s in runtime.stats().values()), STOP_TIMEOUT_S
        )
    finally:
        runtime.close()


def _interrupt_streamed_join(runtime, tpch_dir, pids: list[int]) -> None:
    """Close a query while its join stage runs over a streamed probe side; all idle soon after."""
    run, thread, errors = _start_heavy(runtime, tpch_dir, 2, STREAMED_JOIN, SHUFFLED)
    try:
        wait_until(
            lambda: sum(s.get("running_tasks", 0) for s in runtime.stats().values()) > 0, 60
        )
        time.sleep(4.0)  # past the leaf stages, into the join
        assert thread.is_alive(), "the query ended before it could be cancelled"
        assert sum(cpu_in(pid, 1.0) for pid in pids) > IDLE_CPU_S, "the join was not running"
        run.close()
        wait_until_idle(pids, STOP_WITHIN_S)
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        assert errors and isinstance(errors[0], QueryCancelled), errors
    finally:
        run.close()


def test_local_interrupted_streamed_join_stops_within_seconds(tpch_dir):
    runtime = LocalRuntime(workers=2)
    try:
        _interrupt_streamed_join(runtime, tpch_dir, [os.getpid()])
        wait_until(
            lambda: not any(s["running_tasks"] for s in runtime.stats().values()), STOP_TIMEOUT_S
        )
    finally:
        runtime.close()


def test_flight_interrupted_streamed_join_stops_within_seconds(two_workers, tpch_dir):
    runtime = FlightRuntime([p.url for p in two_workers])
    try:
        _interrupt_streamed_join(runtime, tpch_dir, [p.proc.pid for p in two_workers])
    finally:
        runtime.close()
