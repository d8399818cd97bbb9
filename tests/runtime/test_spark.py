"""The Spark runtime beyond the contract: Spark's retries, stages run on the driver.

Runs on the test session's one embedded ``local[2]`` SparkSession
(``spark_session`` in conftest.py). What every runtime promises (TPC-H results,
task errors, cleanup) is in tests/contract/.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from distfusion import DistributedConfig, DistributedContext, TaskError, tpch
from distfusion.runtime.resolver import SparkWorkerResolver
from distfusion.runtime.spark import EXECUTORS_SECTION, job_group, with_local_retries
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.conftest import REPO


@pytest.fixture
def runtime(runtime_for):
    return runtime_for("spark", 2)


@pytest.fixture
def ctx(runtime, tpch_dir) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


@pytest.fixture
def shuffle_plane(runtime):
    """The runtime with stage outputs through Spark's shuffle (restored after)."""
    runtime.data_plane = "shuffle"
    yield runtime
    runtime.data_plane = "flight"


def _run(runtime, df) -> tuple[pa.Table, str]:
    """Execute ``df``'s graph directly so the Spark job group is known."""
    graph = df.stage_graph()
    table = pa.Table.from_batches(list(runtime.execute(graph)), schema=None)
    return table.rename_columns(df.schema().names), job_group(graph.query_id)


def _failed_attempts(spark_session, group: str) -> int:
    tracker = spark_session.sparkContext.statusTracker()
    stages = {s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds}
    return sum(tracker.getStageInfo(s).numFailedTasks for s in stages)


def _leaf(df):
    return next(s for s in df.stage_graph().stages if s.is_leaf and s.num_tasks == 2)


def test_resolver_reports_one_worker_per_core(spark_session, runtime):
    urls = SparkWorkerResolver(spark_session.sparkContext).get_urls()
    assert urls == ["spark-local://0", "spark-local://1"]
    assert runtime.num_workers() == 2


def test_local_master_gets_spark_retries():
    assert with_local_retries("local[2]", 4) == "local[2,4]"
    assert with_local_retries("local[*]", 3) == "local[*,3]"
    assert with_local_retries("spark://h:7077", 4) == "spark://h:7077"


def test_first_attempt_failure_is_retried_by_spark(
    ctx, shuffle_plane, fail_task, spark_session, oracle
):
    runtime = shuffle_plane
    sql = tpch.query(3)
    df = ctx.sql(sql)
    leaf = _leaf(df)
    fail_task(f"{leaf.stage_id}:1:1")  # task 1 of the leaf stage fails on its first attempt
    got, group = _run(runtime, df)
    assert_same_result(got, oracle_result(oracle, sql), is_ordered(sql))
    assert _failed_attempts(spark_session, group) == 1
    assert runtime.stats()[spark_session.sparkContext.master] == {"live_tasks": 0, "bytes_held": 0}


def test_flight_plane_runs_a_failed_attempt_again_and_keeps_the_other_outputs(
    ctx, runtime, fail_task, spark_session, oracle, monkeypatch
):
    # A failed attempt comes back as a record (a raised error would end the
    # PySpark worker process and every output it holds); the runtime runs it again.
    assert runtime.data_plane == "flight"
    monkeypatch.setattr(runtime, "driver_stage_bytes", 0)  # every stage a Spark job
    sql = tpch.query(3)
    df = ctx.sql(sql)
    leaf = _leaf(df)
    fail_task(f"{leaf.stage_id}:1:2")  # task 1 of the leaf stage fails twice
    got, group = _run(runtime, df)
    assert_same_result(got, oracle_result(oracle, sql), is_ordered(sql))
    assert _failed_attempts(spark_session, group) == 0  # Spark saw no failure
    # One Spark job per round of stages, and one more for each attempt run again.
    graph = df.stage_graph()
    depth: dict[int, int] = {}
    for stage in graph.stages[:-1]:
        depth[stage.stage_id] = max((depth[i.stage_id] + 1 for i in stage.inputs), default=0)
    jobs = spark_session.sparkContext.statusTracker().getJobIdsForGroup(group)
    assert len(jobs) == max(depth.values()) + 1 + 2
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in runtime.stats().values())


def test_flight_plane_runs_a_small_one_task_stage_on_the_drivers_worker(
    runtime, tpch_dir, spark_session, oracle
):
    # Measured after the leaf stage ran, the final aggregate's input is a few
    # KiB: it is coalesced into one task, which needs no Spark job and runs on
    # the driver's Flight worker; the head stage reads it there.
    assert runtime.data_plane == "flight"
    config = DistributedConfig(bytes_per_task=2**20, adaptive_shuffle_bytes=0)  # measured
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    sql = "SELECT o_orderpriority, count(*) AS n FROM orders GROUP BY o_orderpriority"
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
    ran = df.last_run.final
    leaf, final, head = ran.stages
    assert (leaf.num_tasks > 1, final.num_tasks, final.scans) == (True, 1, ())
    jobs = spark_session.sparkContext.statusTracker().getJobIdsForGroup(job_group(ran.query_id))
    assert len(jobs) == 1  # the leaf stage's round only
    assert runtime.driver_worker().url in runtime.stats()
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in runtime.stats().values())


def test_flight_plane_runs_small_one_task_leaf_stages_on_the_driver(
    runtime, tpch_dir, spark_session, oracle
):
    # Q9's partsupp and orders sides read a few MiB of files each: as one-task
    # leaf stages of one round they run on the driver's worker, both at once,
    # with no Spark job; lineitem's tasks run on the executors.
    assert runtime.data_plane == "flight"
    config = DistributedConfig(bytes_per_task=4 * 2**20)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    sql = tpch.query(9)
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
    ran = df.last_run.final
    small = [s for s in ran.stages if s.scans and s.num_tasks == 1 and s is not ran.head]
    big = [s for s in ran.stages if s.scans and s.num_tasks > 1]
    assert len(small) >= 2 and big
    where = {(t.stage_id, t.worker) for t in df.metrics().tasks()}
    driver = runtime.driver_worker().url
    assert {(s.stage_id, driver) for s in small} <= where
    assert all(w != driver for sid, w in where if sid in {s.stage_id for s in big})
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in runtime.stats().values())


@pytest.mark.parametrize(("lone_bytes", "jobs"), [(None, 1), (0, 2)])
def test_flight_plane_runs_a_lone_one_task_stage_on_the_driver_where_cores_are_shared(
    runtime, tpch_dir, spark_session, oracle, monkeypatch, lone_bytes, jobs
):
    # Q19's part side is a one-task leaf stage alone in the first round, and
    # reads more files than driver_scan_bytes: in local[2] (the executors add
    # no core) it runs on the driver's worker, and lineitem's stage is the
    # one Spark job; with no lone bound (a cluster whose executors add
    # cores), it is a Spark job of its own.
    assert runtime.data_plane == "flight"
    assert runtime.lone_stage_bytes() == 2 * 320 * 2**20  # in_place_bytes of 2 slots
    monkeypatch.setattr(runtime, "driver_scan_bytes", 1)
    if lone_bytes is not None:
        monkeypatch.setattr(runtime, "lone_stage_bytes", lambda: lone_bytes)
    config = DistributedConfig(in_place_bytes=0, bytes_per_task=4 * 2**20, replicate_scan_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    sql = tpch.query(19)
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
    ran = df.last_run.final
    part = ran.stages[0]
    assert ([s.source.name for s in part.scans], part.num_tasks) == (["part"], 1), ran.render()
    assert all(part.stage_id in {i.stage_id for i in s.inputs} for s in ran.stages[1:-1])
    group = job_group(ran.query_id)
    assert len(spark_session.sparkContext.statusTracker().getJobIdsForGroup(group)) == jobs
    where = {t.worker for t in df.metrics().tasks() if t.stage_id == part.stage_id}
    assert (where == {runtime.driver_worker().url}) == (jobs == 1)
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in runtime.stats().values())


def test_flight_plane_computes_outputs_lost_with_their_worker_again(
    ctx, runtime, spark_session, oracle
):
    # Every stage but the head ran; then the executors' Python workers are
    # killed (an executor lost, or PySpark's idle timeout): their outputs are
    # gone, and the head stage reads them computed again.
    assert runtime.data_plane == "flight"
    sql = tpch.query(5)
    graph = ctx.sql(sql).stage_graph()
    run = runtime.start_query(graph.query_id)
    run.run_stages(graph, [s.stage_id for s in graph.stages if s is not graph.head])
    held = set(run.placement.values())
    sc = spark_session.sparkContext
    pids = set(sc.parallelize(range(4), 4).map(lambda _: os.getpid()).collect())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert any(url not in runtime.stats() for url in held)  # some outputs are lost
    got = pa.Table.from_batches(list(run.stream_head(graph)))
    expected = oracle_result(oracle, sql)
    assert_same_result(got.rename_columns(expected.column_names), expected, is_ordered(sql))
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in runtime.stats().values())


def test_always_failing_task_names_stage_task_and_traceback(ctx, runtime, fail_task):
    df = ctx.sql(tpch.query(1))
    leaf = _leaf(df)
    fail_task(f"{leaf.stage_id}:0:always")
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    err = info.value
    assert (err.stage_id, err.task_index) == (leaf.stage_id, 0)
    assert err.worker.startswith(("spark-executor://", "grpc://"))  # shuffle, flight plane
    last_line = err.remote_traceback.strip().splitlines()[-1]
    assert last_line.startswith("RuntimeError: injected failure")
    assert last_line in str(err)
    assert "gave up after 4 attempts" in str(err)


@pytest.mark.parametrize("q", [3, 8, 18])
def test_one_task_broadcast_stages_run_on_the_driver(
    shuffle_plane, tpch_dir, oracle, spark_session, q
):
    runtime = shuffle_plane
    # 6 MiB per task at SF0.1 (64 MiB at SF1): the broadcast sides of Q3/Q8/Q18 are one-task
    # stages; they run on the driver (no Spark job), the rest on Spark. Q18's reads
    # the IN subquery's stage, which Spark runs and the driver collects. (Orders
    # and lineitem, stored in order-key order, would join by file range instead.)
    config = DistributedConfig(bytes_per_task=6 * 2**20, storage_partitioned_joins=False)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(tpch.query(q))
    graph = df.stage_graph()
    on_driver = [s for s in graph.stages if s.output.kind == "broadcast" and s.num_tasks == 1]
    assert on_driver, graph.render()
    table, group = _run(runtime, df)
    assert_same_result(table, oracle_result(oracle, tpch.query(q)), is_ordered(tpch.query(q)))
    tracker = spark_session.sparkContext.statusTracker()
    stage_tasks = [
        tracker.getStageInfo(sid).numTasks
        for j in tracker.getJobIdsForGroup(group)
        for sid in tracker.getJobInfo(j).stageIds
    ]
    assert stage_tasks and 1 not in stage_tasks  # no one-task Spark stage was started


@pytest.mark.parametrize(
    ("q", "broadcast_bytes"),
    [(4, 10 * 2**20), (21, 2**20)],  # at SF0.1 Q21 would broadcast lineitem under 10 MiB
)
def test_runtime_filters_on_spark(runtime, tpch_dir, oracle, spark_session, q, broadcast_bytes):
    # Q4: orders (filtered) runs on the driver; lineitem's tasks read it as a
    # broadcast and the head reads it once more, from the driver. Q21: the
    # late lineitems of Saudi suppliers are collected once, broadcast to both
    # lineitem scans, and shuffled into the join from Spark's cache (the RDD
    # is persisted because two consumers read it). Not by file range: orders and
    # lineitem would join in one stage.
    config = DistributedConfig(
        bytes_per_task=6 * 2**20,
        broadcast_threshold_bytes=broadcast_bytes,
        max_broadcast_bytes=broadcast_bytes,
        storage_partitioned_joins=False,
    )
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(tpch.query(q))
    graph = df.stage_graph()
    filters = [
        (graph.stage(i.stage_id), s)
        for s in graph.stages
        for i in s.inputs
        if i.boundary == "broadcast" and graph.stage(i.stage_id).output.kind != "broadcast"
    ]
    assert filters and all("LeftSemi Join" in s.plan_text for _, s in filters), graph.render()
    table, _ = _run(runtime, df)
    assert_same_result(table, oracle_result(oracle, tpch.query(q)), is_ordered(tpch.query(q)))
    assert runtime.stats()[spark_session.sparkContext.master] == {"live_tasks": 0, "bytes_held": 0}


def test_failing_driver_stage_names_stage_and_driver(shuffle_plane, tmp_path):
    runtime = shuffle_plane
    config = DistributedConfig(bytes_per_task=4096, replicate_scan_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    big = pa.table({"k": pa.array(range(4000), pa.int64()), "x": pa.array(range(4000), pa.int64())})
    small = pa.table({"k": pa.array([0, 1, 2], pa.int64()), "d": pa.array([1, 0, 2], pa.int64())})
    ctx.register_table("big", big, max_rows_per_unit=500)
    ctx.register_table("small", small)
    df = ctx.sql(
        "SELECT big.x, s.q FROM big JOIN (SELECT k, 10 / d AS q FROM small) s ON big.k = s.k"
    )
    (bcast,) = [s for s in df.stage_graph().stages if s.output.kind == "broadcast"]
    assert bcast.num_tasks == 1 and not bcast.inputs
    with pytest.raises(TaskError, match="Divide by zero") as info:
        df.to_arrow_table()
    assert info.value.stage_id == bcast.stage_id
    assert info.value.worker.startswith("spark-driver://")


_NO_PACKAGES_DRIVER = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.argv[1]
from distfusion import DistributedConfig, DistributedContext, TaskError, TransportError, tpch
from distfusion.runtime.spark import SparkRuntime
# PySpark's own daemon, as on a session the user made: distfusion's (the embedded
# session's) cannot start on such executors at all, so no task would run.
runtime = SparkRuntime(master="local[2]", conf={"spark.python.daemon.module": "pyspark.daemon"})
ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
tpch.register_tpch(ctx, sys.argv[2])
df = ctx.sql("SELECT l_returnflag, count(*) FROM lineitem GROUP BY 1")
leaf = df.stage_graph().stages[0].stage_id
try:
    df.to_arrow_table()
except TransportError as err:  # the probe job, before any task
    print("PROBE", str(err).replace(chr(10), " "))
# As on a cluster whose probed executor had distfusion and another has not:
# the task itself reports it.
runtime._checked_python = runtime.sc.pythonExec
try:
    df.to_arrow_table()
except TaskError as err:
    print("LEAF", leaf, "ERROR", err.stage_id, err)
runtime.close()
"""


@pytest.mark.slow
def test_executor_without_the_packages_fails_clearly(tmp_path, tpch_dir):
    """Executors without distfusion: one short error before any task, else a clear TaskError.

    Their Python has no site-packages (``python -S``) and no checkout's ``src``
    on ``PYTHONPATH`` (Spark's own entries stay). The runtime's probe job says
    what is missing in which interpreter and points to the README; a task
    that meets it anyway (an executor the probe did not reach) says what is
    missing, names the stage and points to the README.
    """
    python = tmp_path / "python"
    src = REPO / "src"
    python.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -v "^{src}/*$" | paste -sd: -)\n'
        f'export PYTHONPATH\nexec {sys.executable} -S "$@"\n'
    )
    python.chmod(0o755)
    driver = subprocess.run(
        [sys.executable, "-c", _NO_PACKAGES_DRIVER, str(python), str(tpch_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    probe = next((ln for ln in driver.stdout.splitlines() if ln.startswith("PROBE")), "")
    assert probe, driver.stdout + driver.stderr[-3000:]
    assert str(python) in probe and "No module named" in probe
    assert EXECUTORS_SECTION in probe
    line = next((ln for ln in driver.stdout.splitlines() if ln.startswith("LEAF")), "")
    assert line, driver.stdout + driver.stderr[-3000:]
    _, leaf, _, stage, message = line.split(" ", 4)
    assert stage == leaf
    assert "No module named 'distfusion'" in message
    assert "need distfusion and datafusion" in message and EXECUTORS_SECTION in message


def test_executor_workers_say_when_they_start_so_closing_a_query_reaches_them(
    spark_session, tpch_dir
):
    # A runtime of its own (its own token): every executor starts a new Flight
    # worker for it, during the first query, before any task of it reported.
    from distfusion.runtime.registry import runtime_from_name
    from distfusion.transport.flight import FlightWorkerTransport

    runtime = runtime_from_name("spark", 2, spark=spark_session)
    try:
        if runtime.data_plane != "flight":
            pytest.skip("the executors' Flight workers exist on the Flight data plane only")
        heard: list[tuple[str, str]] = []
        answer = runtime._executor_started
        runtime.driver_worker().on_worker_started = lambda url, q: (
            heard.append((url, q)) or answer(url, q)
        )
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        tpch.register_tpch(ctx, tpch_dir)
        df = ctx.sql(tpch.query(6))
        df.to_arrow_table()
        ran = runtime.executor_urls - {runtime.driver_worker().url}  # tasks reported these
        assert ran and {url for url, _ in heard} == ran  # each said so when it started
        assert {q for _, q in heard} == {df.last_run.final.query_id}

        run = runtime.start_query("open-query")
        assert runtime._executor_started("grpc://127.0.0.1:1", "open-query") is False
        run.close()
        client = FlightWorkerTransport(token=runtime.token)
        try:  # over the wire, as an executor asks: a closed or unknown query
            assert client.worker_started(runtime.driver_worker().url, "grpc://h:2", "open-query", 5)
            assert client.worker_started(runtime.driver_worker().url, "grpc://h:2", "unknown", 5)
            executor = next(iter(ran))  # no driver: the call is not known there
            assert not client.worker_started(executor, "grpc://h:2", "unknown", 5)
        finally:
            client.close()
    finally:
        runtime.close()


def test_the_executors_python_workers_are_kept_warm_between_queries(runtime, ctx, spark_session):
    # PySpark ends a Python worker idle for a minute, and the next query's tasks
    # would start new ones. After a query's Spark job, a thread runs a tiny job
    # in every check interval in which no query ran one (here 0.2 s, not 20 s).
    import time

    from distfusion.runtime.spark.runtime import WARM_JOB_GROUP

    tracker = spark_session.sparkContext.statusTracker()
    before = len(tracker.getJobIdsForGroup(WARM_JOB_GROUP))
    interval, runtime.warm_interval_s = runtime.warm_interval_s, 0.2
    try:
        ctx.sql(tpch.query(6)).to_arrow_table()  # two tasks a stage: a Spark job
        deadline = time.monotonic() + 60  # a thread started earlier waits its 20 s out first
        while len(tracker.getJobIdsForGroup(WARM_JOB_GROUP)) <= before:
            assert time.monotonic() < deadline, "no keep-warm job ran"
            time.sleep(0.1)
    finally:
        runtime.warm_interval_s = interval


def test_the_executors_python_workers_keep_freed_memory(runtime):
    # mimalloc in the Python workers reads MIMALLOC_PURGE_DELAY when it loads:
    # the runtime puts it in the workers' environment (distfusion.allocator).
    import os

    from distfusion.allocator import (
        ARENA_PURGE_MULT,
        ARENA_PURGE_MULT_VAR,
        PURGE_DELAY_MS,
        PURGE_DELAY_VAR,
    )

    n = runtime.num_workers()
    seen = runtime.sc.parallelize(range(n), n).map(
        lambda _: (os.environ.get(PURGE_DELAY_VAR), os.environ.get(ARENA_PURGE_MULT_VAR))
    )
    assert set(seen.collect()) == {(str(PURGE_DELAY_MS), str(ARENA_PURGE_MULT))}
