"""Safe defaults of Flight workers (issue #14): they read any file a task plan names.

A worker refuses a non-loopback address without a token unless
``--insecure`` (then warns); the token comes from ``--token-file`` or
``$DISTFUSION_WORKER_TOKEN`` as well as ``--token``; a wrong token is
rejected before any plan is read; remote tracebacks go only to callers that
are authenticated (or local).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from distfusion import DistributedConfig, DistributedContext, TaskError, tpch
from distfusion.errors import AuthenticationError
from distfusion.runtime.flight import FlightRuntime
from distfusion.transport.flight import FlightWorkerTransport
from distfusion.worker.flight_server import FlightWorker, is_loopback
from tests.compare import assert_same_result, oracle_result
from tests.flight_cluster import REPO, start_worker, start_workers, stop_workers

CLEAN_ENV = {
    k: v for k, v in os.environ.items() if k not in ("DISTFUSION_TOKEN", "DISTFUSION_WORKER_TOKEN")
}


def _worker_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "distfusion.worker.flight_cli", "--port", "0", *args],
        env={**CLEAN_ENV, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _local_url(url: str) -> str:
    """``grpc://0.0.0.0:P`` -> ``grpc://127.0.0.1:P`` (where a client reaches it)."""
    return "grpc://127.0.0.1:" + url.rsplit(":", 1)[1]


def test_loopback_addresses_are_recognised():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::")


def test_a_worker_on_all_interfaces_without_a_token_exits_with_a_clear_message():
    done = _worker_cli("--host", "0.0.0.0")
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in done.stderr
    assert "--token-file" in done.stderr and "--insecure" in done.stderr
    assert "listening" not in done.stdout


def test_token_options_are_checked_before_listening(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = _worker_cli("--host", "0.0.0.0", "--token-file", str(empty))
    assert done.returncode == 2 and "is empty" in done.stderr
    done = _worker_cli("--token", "a", "--token-file", str(empty))
    assert done.returncode == 2 and "not both" in done.stderr
    done = _worker_cli("--token-file", str(tmp_path / "missing"))
    assert done.returncode == 2 and "missing" in done.stderr


@pytest.mark.parametrize("source", ["token_file", "environment"])
def test_a_worker_with_a_token_from_a_file_or_the_environment_serves_only_that_token(
    source, tmp_path, tpch_dir, oracle
):
    secret = "from-" + source
    if source == "token_file":
        path = tmp_path / "token"
        path.write_text(secret + "\n")
        workers = start_workers(2, "--host", "0.0.0.0", "--token-file", str(path), env=CLEAN_ENV)
    else:
        env = {**CLEAN_ENV, "DISTFUSION_WORKER_TOKEN": secret}
        workers = start_workers(2, "--host", "0.0.0.0", env=env)
    urls = [_local_url(w.url) for w in workers]
    admin = FlightWorkerTransport(token=secret)
    try:
        for wrong in ("wrong", ""):
            runtime = FlightRuntime(urls, token=wrong)
            ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
            tpch.register_tpch(ctx, tpch_dir)
            with pytest.raises(AuthenticationError):
                ctx.sql(tpch.query(3)).to_arrow_table()
            runtime.close()
            assert all(admin.stats(u)["plans_received"] == 0 for u in urls), "a plan was read"
        runtime = FlightRuntime(urls, token=secret)
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        tpch.register_tpch(ctx, tpch_dir)
        got = ctx.sql(tpch.query(3)).to_arrow_table()
        assert_same_result(got, oracle_result(oracle, tpch.query(3)), ordered=True)
        assert sum(admin.stats(u)["plans_received"] for u in urls) > 0
        runtime.close()
    finally:
        admin.close()
        stop_workers(workers)


def test_an_insecure_worker_warns_and_serves():
    worker = start_worker("--host", "0.0.0.0", "--insecure", env=CLEAN_ENV)
    try:
        probe = FlightWorkerTransport(token="")
        assert probe.stats(_local_url(worker.url))["live_tasks"] == 0
        probe.close()
    finally:
        worker.stop()
    try:
        assert "insecure" in worker.log()
    finally:
        Path(worker.log_path).unlink(missing_ok=True)  # nothing a test makes outlives it


def _failing_query_error(urls: list[str], token: str) -> TaskError:
    """The TaskError of a query whose leaf task fails on a worker (a bad cast)."""
    runtime = FlightRuntime(urls, token=token)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    ctx.register_table(
        "s", pa.table({"k": [1, 2, 3, 4], "s": ["1", "2", "x", "4"]}), max_rows_per_unit=1
    )
    try:
        with pytest.raises(TaskError) as info:
            ctx.sql("SELECT k, CAST(s AS INT) AS i FROM s").to_arrow_table()
        assert info.value.worker != "coordinator", "the failing task ran on the coordinator"
        return info.value
    finally:
        runtime.close()


def test_remote_tracebacks_go_only_to_authenticated_callers():
    with FlightWorker("0.0.0.0", token="t0ken") as a, FlightWorker("0.0.0.0", token="t0ken") as b:
        err = _failing_query_error([_local_url(a.url), _local_url(b.url)], "t0ken")
        assert "Traceback" in err.remote_traceback
    with FlightWorker("0.0.0.0", insecure=True) as a, FlightWorker("0.0.0.0", insecure=True) as b:
        assert not a.sends_tracebacks
        err = _failing_query_error([_local_url(a.url), _local_url(b.url)], "")
        assert err.remote_traceback == ""
        assert "cast" in str(err).lower()
    with pytest.raises(ValueError, match="without a token"):
        FlightWorker("0.0.0.0", token="")
