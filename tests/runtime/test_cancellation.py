"""Real cancellation (issue #14): a cancelled query stops DataFusion's work on every worker.

Two ways a query ends early, on every runtime:

- interrupted: a shuffle join whose join stage keeps every worker busy for
  tens of seconds is stopped (closing the query run, as a coordinator does on
  Ctrl-C or an error; or closing the workers) once the event "every leaf task
  finished, a task still runs" says the join runs;
- a satisfied ``LIMIT``: the head stage has its rows from the first streamed
  batches and ends the query.

Then every worker process's CPU time must stop growing: an idle process uses
a few milliseconds a second, a join still running in DataFusion's threads a
core or more. The join's probe side is replayed from memory (the default) or
streamed from its producers, so a cancelled task's next pull raises inside
DataFusion, although the aggregate over the join yields nothing until its
input ends (before inputs were replayed, such a task ran on for tens of
seconds). The bound is wide (:data:`STOP_WITHIN_S`) for a busy machine; no
other wall-clock bound. ``benchmarks/cancellation.py`` measures how soon.
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

# A join of lineitem with itself (600 matches per row), a few of its rows:
# satisfied by the first batches of the join, long before the join could end.
HEAVY_LIMIT = (
    "SELECT a.l_orderkey, b.l_orderkey AS other FROM lineitem a "
    "JOIN lineitem b ON a.l_suppkey = b.l_suppkey AND a.l_orderkey <> b.l_orderkey LIMIT 5"
)
BROADCAST_ALL = 2**40
# A shuffle join in a stage of its own: the small side (one line per order,
# ~2 MiB per task) builds, lineitem streams in as the probe side, 15,000
# matches per row feed an aggregate. Tens of seconds of CPU per task,
# uncancelled; the pulls of the probe side are where a cancelled task stops.
STREAMED_JOIN = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s "
    "FROM (SELECT l_suppkey % 10 AS k, l_quantity FROM lineitem WHERE l_linenumber = 1) b "
    "JOIN lineitem a ON a.l_suppkey % 10 = b.k"
)
SHUFFLED = DistributedConfig(
    tasks_per_stage=2, broadcast_threshold_bytes=0, max_broadcast_bytes=0, adaptive=False
)
STOP_WITHIN_S = 10.0
"""Bound for every worker to be idle once the query was stopped: about a batch
of work per task is left (well under a second), the rest is margin for a busy
machine."""
STOP_TIMEOUT_S = 30.0
"""Wide bound for the coordinator's thread to see the cancellation."""


def wait_until(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - start


def _start_heavy(runtime, tpch_dir):
    """Run every non-head stage of STREAMED_JOIN in a thread; returns (run, thread, errors)."""
    ctx = DistributedContext(runtime=runtime, config=SHUFFLED)
    tpch.register_tpch(ctx, tpch_dir)
    graph = ctx.sql(STREAMED_JOIN).stage_graph()
    run = runtime.start_query(graph.query_id)
    run.graph = graph  # for the tests' events
    errors: list[BaseException] = []

    def go():
        try:
            run.run_stages(graph, [s.stage_id for s in graph.stages[:-1]])
        except BaseException as exc:  # the cancellation, expected
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return run, thread, errors


@pytest.fixture
def two_workers():
    # As deployed: without the suite's extra tokio threads (tests/conftest.py).
    env = {"DISTFUSION_STREAM_EXCHANGES": "0", "TOKIO_WORKER_THREADS": str(os.cpu_count() or 1)}
    procs = start_workers(2, env=env)
    yield procs
    stop_workers(procs)


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


def _join_running(runtime, run, urls: list[str]) -> bool:
    """Whether every leaf task of ``run``'s graph finished (``query_metrics``) and a task runs."""
    graph = run.graph
    leaves = {s.stage_id: s.num_tasks for s in graph.stages if not s.inputs}
    finished = {}
    for url in urls:
        for m in runtime.transport.query_metrics(url, graph.query_id):
            finished[m.stage_id] = finished.get(m.stage_id, 0) + 1
    done = all(finished.get(sid, 0) >= n for sid, n in leaves.items())
    return done and any(s.get("running_tasks") for s in runtime.stats().values())


def _interrupt_streamed_join(runtime, tpch_dir, pids: list[int], urls: list[str], stop) -> None:
    """Stop (``stop(run)``) STREAMED_JOIN while its join stage runs; every pid idle soon after."""
    run, thread, errors = _start_heavy(runtime, tpch_dir)
    try:
        wait_until(lambda: _join_running(runtime, run, urls), 120)
        assert sum(cpu_in(pid, 1.0) for pid in pids) > IDLE_CPU_S, "the join was not running"
        assert thread.is_alive(), "the join ended before it could be cancelled"
        stop(run)
        wait_until_idle(pids, STOP_WITHIN_S)
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive()
        assert errors and isinstance(errors[0], QueryCancelled), errors
    finally:
        run.close()


@pytest.fixture(params=["replayed", "streamed"])
def task_inputs(request, monkeypatch):
    """How tasks in this process read their inputs: replayed from memory (the default) or streamed."""
    monkeypatch.setenv("DISTFUSION_STREAM_TASK_INPUTS", "1" if request.param == "streamed" else "0")


def test_local_interrupted_join_stops_datafusion_within_seconds(tpch_dir, task_inputs):
    runtime = LocalRuntime(workers=2)
    try:
        _interrupt_streamed_join(
            runtime, tpch_dir, [os.getpid()], runtime.urls, lambda run: run.close()
        )
        wait_until(lambda: not any(s["running_tasks"] for s in runtime.stats().values()), 5)
        assert all(s["live_tasks"] == 0 for s in runtime.stats().values())
    finally:
        runtime.close()


def test_worker_close_stops_the_join_without_waiting(tpch_dir):
    runtime = LocalRuntime(workers=2)
    workers: list[Worker] = list(runtime.transport.workers.values())

    def close_workers(run) -> None:
        start = time.monotonic()
        for w in workers:
            w.close()  # returns at once; the tasks see the cancellation and end
        assert time.monotonic() - start < STOP_WITHIN_S

    try:
        _interrupt_streamed_join(runtime, tpch_dir, [os.getpid()], runtime.urls, close_workers)
        wait_until(lambda: not any(w.stats()["running_tasks"] for w in workers), 5)
        assert all(w.spill.files() == [] for w in workers)
    finally:
        runtime.close()


def test_flight_interrupted_join_stops_datafusion_within_seconds(two_workers, tpch_dir):
    urls = [p.url for p in two_workers]
    runtime = FlightRuntime(urls)
    try:
        _interrupt_streamed_join(
            runtime, tpch_dir, [p.proc.pid for p in two_workers], urls, lambda run: run.close()
        )
        wait_until(
            lambda: (
                not any(s["running_tasks"] or s["live_tasks"] for s in runtime.stats().values())
            ),
            5,
        )
    finally:
        runtime.close()


def test_spark_interrupted_join_stops_datafusion_in_the_executor_workers(runtime_for, tpch_dir):
    runtime = runtime_for("spark", 2)
    if runtime.data_plane != "flight":
        pytest.skip("the executors' Flight workers exist on the Flight data plane only")
    # A first query makes the executors' Flight workers known (their URLs and pids).
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    ctx.sql(tpch.query(6)).to_arrow_table()
    executors = {u: st for u, st in runtime.stats().items() if u != runtime.sc.master}
    pids = [st["pid"] for st in executors.values()]
    # run.close() cancels the job group and the query on every executor worker.
    _interrupt_streamed_join(runtime, tpch_dir, pids, list(executors), lambda run: run.close())
