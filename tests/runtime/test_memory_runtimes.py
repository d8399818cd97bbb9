"""Memory budgets with spill on the Flight and Spark runtimes (issue #14).

With a budget of a few MiB per task, TPC-H queries still equal single-node
DataFusion, the workers report what they spilled, and no spill file is left
once the query ended. The local runtime and the parts are in
``tests/test_memory_budgets.py``.
"""

from __future__ import annotations

import os
import time

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.runtime.flight import FlightRuntime
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.flight_cluster import start_workers, stop_workers
from tests.test_memory_budgets import MANY_GROUPS, SMALL, TINY

QUERIES = {
    "many_groups": (MANY_GROUPS, SMALL),
    "q9": (tpch.query(9), TINY),
    "q18": (tpch.query(18), TINY),
}
"""Name -> (SQL, task budget). A whole-table sort does not fit 8 MiB, and its
failure naming the operator is tested on the local runtime."""


def _files(path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


@pytest.fixture(scope="module")
def spilling_flight(tmp_path_factory):
    """Three worker processes spilling into a directory of this module, and a runtime on them."""
    spill = tmp_path_factory.mktemp("flight-spill")
    procs = start_workers(3, "--memory", "8MiB", "--spill-dir", str(spill))
    runtime = FlightRuntime([p.url for p in procs])
    yield runtime, spill
    runtime.close()
    stop_workers(procs)


@pytest.mark.parametrize("name", list(QUERIES))
def test_flight_on_a_tiny_budget_equals_datafusion_and_leaves_no_spill_file(
    name, spilling_flight, tpch_dir, oracle
):
    runtime, spill = spilling_flight
    sql, budget = QUERIES[name]
    ctx = DistributedContext(
        runtime=runtime, config=DistributedConfig(tasks_per_stage=3, memory_per_task_bytes=budget)
    )
    tpch.register_tpch(ctx, tpch_dir)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    assert _files(spill) == [], "spill files left after the query"


def test_flight_workers_report_spills_under_their_own_memory_flag(
    spilling_flight, tpch_dir, oracle
):
    """No budget in the query: each worker's ``--memory 8MiB`` decides, and they spill."""
    runtime, spill = spilling_flight
    before = sum(s["spilled_bytes"] + s["output_spilled_bytes"] for s in runtime.stats().values())
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=3))
    tpch.register_tpch(ctx, tpch_dir)
    got = ctx.sql(MANY_GROUPS).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, MANY_GROUPS), ordered=True)
    stats = runtime.stats().values()
    assert all(s["memory_per_task_bytes"] == TINY for s in stats)
    assert sum(s["spilled_bytes"] + s["output_spilled_bytes"] for s in stats) > before
    assert _files(spill) == []
    assert all(s["spill_files"] == 0 and s["bytes_held"] == 0 for s in stats)


@pytest.mark.parametrize("name", ["many_groups", "q18"])
def test_spark_on_a_tiny_budget_equals_datafusion_and_leaves_no_spill_file(
    name, runtime_for, tpch_dir, oracle
):
    runtime = runtime_for("spark", 2)
    sql, budget = QUERIES[name]
    ctx = DistributedContext(
        runtime=runtime, config=DistributedConfig(tasks_per_stage=2, memory_per_task_bytes=budget)
    )
    tpch.register_tpch(ctx, tpch_dir)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    executors = {u: s for u, s in runtime.stats().items() if u != runtime.sc.master}
    assert executors, "no executor Flight worker reported"
    assert all(s["spill_files"] == 0 and s["bytes_held"] == 0 for s in executors.values())
    if name == "many_groups":
        assert sum(s["spilled_bytes"] + s["output_spilled_bytes"] for s in executors.values()) > 0


def test_spark_local_mode_shares_half_the_machine_between_its_slots(runtime_for):
    # The Python workers are processes of their own, not in the driver's JVM heap.
    runtime = runtime_for("spark", 2)
    from distfusion.worker.memory import default_memory_per_task_bytes

    assert runtime.memory_per_task_bytes == default_memory_per_task_bytes(
        runtime.sc.defaultParallelism
    )


def test_spilled_outputs_of_a_query_nobody_asks_about_are_deleted_after_the_ttl(tmp_path, tpch_dir):
    """A coordinator that disappears (no close, no keepalive): the worker's TTL deletes the files."""
    from distfusion.coordinator.query_run import WorkerQueryRun
    from distfusion.transport.flight import FlightWorkerTransport

    spill = tmp_path / "spill"
    procs = start_workers(2, "--memory", "8MiB", "--spill-dir", str(spill), "--query-ttl", "2")
    urls = [p.url for p in procs]
    transport = FlightWorkerTransport(token="")
    try:
        runtime = FlightRuntime(urls)
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        tpch.register_tpch(ctx, tpch_dir)
        graph = ctx.sql("SELECT l_orderkey, l_comment FROM lineitem").stage_graph()
        runtime.close()
        # A bare run: no heartbeat, never closed, as a coordinator that died.
        run = WorkerQueryRun(graph.query_id, transport, urls, keep_outputs=True)
        run.run_stages(graph, [s.stage_id for s in graph.stages[:-1]])
        assert any(f.endswith(".arrow") for f in _files(spill)), "nothing was spilled"
        deadline = time.monotonic() + 60
        while _files(spill) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _files(spill) == [], "spill files outlived the query's time-to-live"
        assert all(transport.stats(u)["bytes_held"] == 0 for u in urls)
    finally:
        transport.close()
        stop_workers(procs)
