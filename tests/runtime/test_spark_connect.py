"""The Spark runtime on a Spark Connect session: TPC-H, retries, cancellation, cleanup.

Runs on the test session's Spark Connect session (``connect_session``): Spark
Connect's service in the classic session's ``local[2]`` application. The
Connect runtime sees only what its client shows; the tests also watch the
application itself (its status tracker, its executors' Python workers) for
the events to check.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import distfusion
from distfusion import (
    DistributedConfig,
    DistributedContext,
    PlanningError,
    QueryCancelled,
    SparkRuntime,
    TaskError,
    tpch,
)
from distfusion.runtime.spark import job_group
from distfusion.runtime.spark.connect import SparkConnectRuntime, executors_next_to_client
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.cpu import IDLE_CPU_S, cpu_in, wait_until_idle
from tests.runtime.test_cancellation import SHUFFLED, STOP_TIMEOUT_S, STOP_WITHIN_S, STREAMED_JOIN


@pytest.fixture(scope="module")
def runtime(connect_session):
    """``SparkRuntime(spark=<Connect session>)``: a SparkConnectRuntime, closed after the module.

    Its heads run as Spark jobs, as on a deployment whose client the executors
    and the client cannot reach each other (the test server is on this
    machine, where heads would run on the client: :func:`client_runtime`).
    """
    rt = SparkRuntime(spark=connect_session, head_on_client=False)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def client_runtime(connect_session):
    """The default SparkConnectRuntime of a local server: heads run on the client."""
    rt = SparkRuntime(spark=connect_session)
    yield rt
    rt.close()


@pytest.fixture
def ctx(runtime, tpch_dir) -> DistributedContext:
    """TPC-H on the Connect runtime, two tasks per stage: every stage runs as Spark jobs."""
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _jobs(spark_session, connect_session, tag: str) -> list:
    """The application's Spark jobs that ran with Connect job tag ``tag``, as JVM job infos."""
    full = f"SparkConnect_SessionTag_User__Session_{connect_session.session_id}_Tag_{tag}"
    tracker = spark_session.sparkContext._jsc.sc().statusTracker()
    return [tracker.getJobInfo(int(j)).get() for j in sorted(tracker.getJobIdsForTag(full))]


def _running(jobs) -> list:
    return [j for j in jobs if str(j.status()) == "RUNNING"]


def _rounds(graph) -> int:
    """How many rounds of tasks run the stages before the head (a stage's round: its depth)."""
    depth: dict[int, int] = {}
    for stage in graph.stages[:-1]:
        depth[stage.stage_id] = max((depth[i.stage_id] + 1 for i in stage.inputs), default=0)
    return max(depth.values()) + 1


def _leaf(df):
    return next(s for s in df.stage_graph().stages if s.is_leaf and s.num_tasks == 2)


def _nothing_held(runtime, timeout_s: float = 60.0) -> None:
    """Wait until no executor worker holds a task, a byte or a query (cleanup runs as a job)."""
    start = time.monotonic()
    while True:
        stats = runtime.stats()
        if all(
            s["live_tasks"] == 0 and s["bytes_held"] == 0 and s.get("live_queries", 0) == 0
            for s in stats.values()
        ):
            return
        assert time.monotonic() - start < timeout_s, stats
        time.sleep(0.5)


def test_a_connect_session_gets_the_connect_runtime(runtime, connect_session):
    assert isinstance(runtime, SparkConnectRuntime) and isinstance(runtime, SparkRuntime)
    assert runtime.num_workers() == 2  # the application's local[2] slots
    assert runtime.serves(connect_session)
    with pytest.raises(ValueError, match="needs RDDs"):
        SparkRuntime(spark=connect_session, data_plane="shuffle")


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch(ctx, runtime, oracle, q):
    sql = tpch.query(q)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    # Nothing listens on the client: the executors never connect to it.
    assert runtime._driver_worker is None and runtime._feed_endpoint is None


@pytest.mark.parametrize("q", [3, 5, 18, 21])
def test_heads_on_the_client_read_the_executors(
    client_runtime, tpch_dir, oracle, spark_session, connect_session, q
):
    """A local server's runtime runs heads here: one Spark job per round, none for the head."""
    assert client_runtime.head_on_client and client_runtime.local
    ctx = DistributedContext(runtime=client_runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    sql = tpch.query(q)
    graph = ctx.sql(sql).stage_graph()
    got = pa.Table.from_batches(list(client_runtime.execute(graph)))
    expected = oracle_result(oracle, sql)
    assert_same_result(got.rename_columns(expected.column_names), expected, is_ordered(sql))
    jobs = _jobs(spark_session, connect_session, job_group(graph.query_id))
    assert len(jobs) == _rounds(graph)  # a job per round, none for the head
    _nothing_held(client_runtime)  # the head cancelled the query on every worker, from here


def test_heads_run_on_the_client_by_default_only_next_to_a_local_server(runtime, client_runtime):
    assert client_runtime.server_host == "127.0.0.1" and client_runtime.head_on_client
    assert not runtime.head_on_client  # asked for
    assert executors_next_to_client("local[2]", "localhost")
    assert not executors_next_to_client("local[*]", "spark.example")  # the executors are there
    assert not executors_next_to_client("yarn", "127.0.0.1")  # a cluster's executors
    assert not executors_next_to_client(None, "127.0.0.1")  # the server does not say


def test_the_query_runs_as_tagged_jobs_and_frees_every_output(
    ctx, runtime, spark_session, connect_session, oracle
):
    sql = tpch.query(3)
    df = ctx.sql(sql)
    graph = df.stage_graph()
    got = pa.Table.from_batches(list(runtime.execute(graph)))
    expected = oracle_result(oracle, sql)
    assert_same_result(got.rename_columns(expected.column_names), expected, is_ordered(sql))
    jobs = _jobs(spark_session, connect_session, job_group(graph.query_id))
    assert len(jobs) == _rounds(graph) + 1  # a job per round, one for the head
    assert all(str(j.status()) == "SUCCEEDED" for j in jobs)
    assert job_group(graph.query_id) not in connect_session.getTags()
    _nothing_held(runtime)  # the head task cancelled the query on every worker


def test_failed_attempts_run_again(ctx, runtime, fail_connect_task, oracle, spark_session):
    sql = tpch.query(3)
    df = ctx.sql(sql)
    leaf = _leaf(df)
    fail_connect_task(f"{leaf.stage_id}:1:2")  # task 1 of the leaf stage fails twice
    assert_same_result(df.to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
    _nothing_held(runtime)


def test_always_failing_task_names_stage_task_and_traceback(ctx, runtime, fail_connect_task):
    df = ctx.sql(tpch.query(1))
    leaf = _leaf(df)
    fail_connect_task(f"{leaf.stage_id}:0:always")
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    err = info.value
    assert (err.stage_id, err.task_index) == (leaf.stage_id, 0)
    assert err.worker.startswith("grpc://")
    last_line = err.remote_traceback.strip().splitlines()[-1]
    assert last_line.startswith("RuntimeError: injected failure")
    assert "gave up after 4 attempts" in str(err)
    _nothing_held(runtime)  # the failed query's outputs are freed by a cleanup job


def test_closing_a_running_query_interrupts_its_spark_jobs(
    runtime, tpch_dir, spark_session, connect_session
):
    """A query closed while its join stage runs: its job ends and the executors stop working."""
    ctx = DistributedContext(runtime=runtime, config=SHUFFLED)
    tpch.register_tpch(ctx, tpch_dir)
    graph = ctx.sql(STREAMED_JOIN).stage_graph()
    run = runtime.start_query(graph.query_id)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run.run_stages(graph, [s.stage_id for s in graph.stages[:-1]])
        except BaseException as exc:  # the cancellation, expected
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    tag = job_group(graph.query_id)
    # The first stage after the leaves: the join, which runs for minutes (the next
    # stages start only once it ended).
    join = min(s.stage_id for s in graph.stages[:-1] if s.inputs)
    # Event: the leaf round's job finished and the join's job runs.
    start = time.monotonic()
    while not (
        join in run._started
        and _running(_jobs(spark_session, connect_session, tag))
        and len(_jobs(spark_session, connect_session, tag)) >= 2
    ):
        assert thread.is_alive(), errors
        assert time.monotonic() - start < 180, "the join did not start"
        time.sleep(0.1)
    # Asked directly from here, not with runtime.stats(): its control job would wait
    # for a free task slot, and the join's tasks hold both.
    transport = runtime.access.transport()
    pids = [transport.stats(u, timeout_s=10.0)["pid"] for u in sorted(runtime.executor_urls)]
    assert sum(cpu_in(pid, 1.0) for pid in pids) > IDLE_CPU_S, "the join was not running"
    run.close()
    thread.join(STOP_TIMEOUT_S)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], QueryCancelled), errors
    jobs = _jobs(spark_session, connect_session, tag)
    start = time.monotonic()
    while _running(jobs):  # Spark ends the interrupted job
        assert time.monotonic() - start < STOP_TIMEOUT_S, [str(j.status()) for j in jobs]
        time.sleep(0.1)
        jobs = _jobs(spark_session, connect_session, tag)
    statuses = [(j.jobId(), str(j.status())) for j in jobs]
    assert statuses[-1][1] == "FAILED", statuses  # the join's job: interrupted, not finished
    wait_until_idle(pids, STOP_WITHIN_S)
    _nothing_held(runtime)


def test_closing_the_result_iterator_leaves_nothing_behind(
    ctx, runtime, spark_session, connect_session
):
    df = ctx.sql("SELECT l_orderkey, l_comment FROM lineitem")
    stream = iter(df.execute_stream())
    first = next(stream)
    assert first.num_rows > 0
    stream.close()
    assert not [t for t in connect_session.getTags() if t.startswith("distfusion")]
    _nothing_held(runtime)


def test_a_work_unit_feed_is_refused_clearly(runtime, tpch_dir, tmp_path):
    import glob
    import os

    from distfusion.work_unit_feed import ListingFeed

    files = sorted(glob.glob(os.path.join(tpch.table_path(tpch_dir, "nation"), "*.parquet")))
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("t", ListingFeed(lambda: [files]))
    with pytest.raises(PlanningError, match="executors cannot reach the client"):
        ctx.sql("SELECT count(*) FROM t").to_arrow_table()


def test_write_parquet_runs_the_head_parts_on_the_executors(ctx, runtime, tmp_path, oracle):
    sql = "SELECT o_orderkey, o_orderstatus FROM orders WHERE o_totalprice > 400000"
    files = ctx.sql(sql).write_parquet(tmp_path / "out")
    assert len(files) == 2  # a row-wise head: one part per producer task (each has rows)
    import pyarrow.parquet as pq

    got = pq.read_table(tmp_path / "out")
    assert_same_result(got, oracle_result(oracle, sql), ordered=False, check_types=False)
    _nothing_held(runtime)


def _plus_one(x: pa.Array) -> pa.Array:
    return pc.add(x, 1)


def test_a_udf_of_the_head_runs_in_the_head_task_and_its_parts(runtime, tmp_path):
    """The head's plan ships with its UDFs: the head task (``run_head``) and its parts.

    A head part travels pickled with its session, as a stage does
    (:mod:`distfusion.worker.spark_codec`): its JSON carries no UDF.
    """
    ctx = DistributedContext(
        runtime=runtime, config=DistributedConfig(tasks_per_stage=2, in_place_bytes=0)
    )
    rows = list(range(1, 9))
    ctx.register_record_batches(
        "t", [[pa.record_batch({"x": rows[:4]})], [pa.record_batch({"x": rows[4:]})]]
    )
    ctx.register_udf(distfusion.udf(_plus_one, [pa.int64()], pa.int64(), "immutable", name="f"))
    # f in the head stage (a Spark job here: head_on_client=False), over the partial sums.
    assert ctx.sql("SELECT f(sum(x)) AS y FROM t").to_pylist() == [{"y": sum(rows) + 1}]
    files = ctx.sql("SELECT f(sum(x)) AS y FROM t").write_parquet(tmp_path / "out")
    assert files
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out").to_pylist() == [{"y": sum(rows) + 1}]
    _nothing_held(runtime)
