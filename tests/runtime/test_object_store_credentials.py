"""Object store credentials (issue 24): from each worker's environment, or given explicitly.

Explicit keys reach Flight workers only over an authenticated channel (a
token), never appear in task plans, ``explain()``, logs or errors; a worker
without credentials fails its task clearly, naming what to do.
"""

from __future__ import annotations

import logging
import time

import pytest

from distfusion import DistributedConfig, DistributedContext, LocalRuntime, TaskError
from distfusion.errors import PlanningError
from distfusion.io import object_store as stores
from distfusion.protocol.task_plan import TaskPlan
from distfusion.runtime.flight import FlightRuntime
from tests.compare import assert_same_result, oracle_result
from tests.flight_cluster import start_workers, stop_workers

KEY_ID = "AKIAEXPLICIT0KEY0ID"
SECRET = "explicit-secret-access-key-0123456789"
AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
QUERY = "SELECT o_orderstatus, count(*) AS n FROM orders GROUP BY 1"


@pytest.fixture
def bare_workers(monkeypatch):
    """``bare_workers(n, token)``: Flight worker processes with no AWS credentials in their environment."""
    started = []

    def start(n: int, token: str | None = None):
        with monkeypatch.context() as m:
            for var in AWS_VARS:
                m.delenv(var, raising=False)
            m.delenv("DISTFUSION_TOKEN", raising=False)
            env = {"DISTFUSION_TOKEN": token} if token else None
            procs = start_workers(n, env=env)
        started.extend(procs)
        return procs

    yield start
    stop_workers(started)


@pytest.fixture
def keyed_store(s3_store):
    """The S3 test store with explicit keys, registered for this test only."""
    store = s3_store(access_key_id=KEY_ID, secret_access_key=SECRET)
    yield store
    stores.register("s3://", s3_store(), "tpch")  # the keyless store the other tests use


def _plans_json(df) -> str:
    graph = df.stage_graph()
    return "".join(
        TaskPlan.for_task(graph.query_id, s, t, ((),) * len(s.inputs), 1).to_json()
        for s in graph.stages
        for t in range(s.num_tasks)
    )


def test_explicit_keys_reach_authenticated_workers_and_stay_out_of_plans_and_logs(
    bare_workers, keyed_store, s3_tpch, oracle, caplog
):
    procs = bare_workers(2, token="object-store-test-token")
    runtime = FlightRuntime([p.url for p in procs], token="object-store-test-token")
    try:
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        ctx.register_object_store("s3://", keyed_store, "tpch")
        ctx.register_parquet("orders", f"{s3_tpch}/orders/")
        with caplog.at_level(logging.DEBUG, logger="distfusion"):
            df = ctx.sql(QUERY)
            got = df.to_arrow_table()  # the workers have no credentials but the keys sent
            text = df.explain() + df.explain(analyze=True, verbose=True) + _plans_json(df)
        assert_same_result(got, oracle_result(oracle, QUERY), ordered=False)
        assert all(s["plans_received"] > 0 for s in runtime.stats().values())  # tasks ran there
        assert KEY_ID not in text and SECRET not in text
        assert SECRET not in caplog.text and KEY_ID not in caplog.text
        for p in procs:
            assert SECRET not in p.log() and KEY_ID not in p.log()
        assert SECRET not in repr(keyed_store) and SECRET not in repr(keyed_store.spec())
    finally:
        runtime.close()


def test_explicit_keys_are_not_sent_to_workers_without_a_token(
    flight_workers, keyed_store, s3_tpch
):
    runtime = FlightRuntime(flight_workers, token="")
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    ctx.register_object_store("s3://", keyed_store, "tpch")
    ctx.register_parquet("orders", f"{s3_tpch}/orders/")
    with pytest.raises(PlanningError, match="explicit credentials") as info:
        ctx.sql(QUERY).to_arrow_table()
    assert "token" in str(info.value) and SECRET not in str(info.value)
    runtime.close()


def test_a_worker_without_credentials_fails_its_task_clearly(bare_workers, s3_store, s3_tpch):
    procs = bare_workers(2)
    runtime = FlightRuntime([p.url for p in procs], token="")
    try:
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        ctx.register_object_store("s3://", s3_store(), "tpch")  # keys from the environment
        ctx.register_parquet("orders", f"{s3_tpch}/orders/")  # here, the coordinator has some
        start = time.monotonic()
        with pytest.raises(TaskError) as info:
            ctx.sql(QUERY).to_arrow_table()
        assert time.monotonic() - start < 60
        message = str(info.value)
        assert any(p.url in message for p in procs) and "s3://tpch/" in message
        assert "no credentials" in message and "AWS_ACCESS_KEY_ID" in message
    finally:
        runtime.close()


def test_task_errors_blank_out_explicit_keys(keyed_store):
    from distfusion.protocol.errors import task_error

    ctx = DistributedContext(runtime=LocalRuntime(workers=2))
    ctx.register_object_store("s3://", keyed_store, "tpch")
    assert stores.redact(f"denied for {KEY_ID} / {SECRET}") == "denied for *** / ***"
    err = task_error(1, 0, "grpc://w", OSError(f"request signed with {KEY_ID}:{SECRET} refused"))
    assert SECRET not in str(err) and KEY_ID not in str(err) and "***" in str(err)
    assert SECRET not in err.remote_traceback


def test_plain_datafusion_stores_are_refused_with_the_class_to_use():
    from datafusion.object_store import AmazonS3

    ctx = DistributedContext(runtime=LocalRuntime(workers=1))
    with pytest.raises(TypeError, match="distfusion.io.object_store.AmazonS3"):
        ctx.register_object_store("s3://", AmazonS3(bucket_name="b"), "b")
