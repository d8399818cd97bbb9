"""The Flight runtime beyond the contract: coordinators, security, faults, resolvers.

What every runtime promises is in tests/contract/; here: a coordinator that is
interrupted or disappears, tokens and TLS, killed workers, resolvers.

Every test uses real worker processes on 127.0.0.1 (tests/flight_cluster.py).
Tests that damage workers (kill, interrupt, time-to-live) start their own; the
others share the session's three workers (``flight_workers``).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distfusion import (
    DistributedConfig,
    DistributedContext,
    PlanningError,
    TaskError,
    TransportError,
    WorkerUnavailableError,
    tpch,
)
from distfusion.errors import AuthenticationError
from distfusion.runtime.flight import FlightRuntime
from distfusion.runtime.resolver import DynamicWorkerResolver
from distfusion.transport.flight import FlightWorkerTransport
from tests.compare import assert_same_result, oracle_result
from tests.cpu import wait_until_idle
from tests.flight_cluster import REPO, start_worker, start_workers, stop_workers

# Runs for seconds on every worker (a self-join on a low-cardinality key): long
# enough to interrupt or kill a worker while its tasks run.
HEAVY = "SELECT count(*) AS n FROM lineitem a JOIN lineitem b ON a.l_suppkey = b.l_suppkey"
# About a second on three workers, with joins, shuffles and a final sort.
MEDIUM = tpch.query(9)

COORDINATOR = """
import sys
from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.runtime.flight import FlightRuntime
data, urls = sys.argv[1], sys.argv[2:]
ctx = DistributedContext(runtime=FlightRuntime(urls), config=DistributedConfig(tasks_per_stage=len(urls)))
tpch.register_tpch(ctx, data)
print("planned", flush=True)
ctx.sql(sys.stdin.read()).to_arrow_table()
"""


def _context(runtime, tpch_dir, tasks: int | None = None) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=tasks))
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _wait_until(predicate, timeout_s: float, interval_s: float = 0.02) -> float:
    """Poll ``predicate`` until true; returns the seconds it took. Fails after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start


def _idle(transport: FlightWorkerTransport, urls: list[str]) -> bool:
    stats = [transport.stats(u) for u in urls]
    return all(
        s["live_tasks"] == 0 and s["bytes_held"] == 0 and s["live_queries"] == 0 for s in stats
    )


def _busy(transport: FlightWorkerTransport, urls: list[str]) -> bool:
    return any(transport.stats(u)["live_tasks"] > 0 for u in urls)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def own_workers(request):
    """``own_workers(n, *args)``: worker processes for one test, killed at its end."""
    started = []

    def start(n: int, *args: str, env: dict | None = None):
        procs = start_workers(n, *args, env=env)
        started.extend(procs)
        return procs

    yield start
    stop_workers(started)


@pytest.fixture
def probe():
    transport = FlightWorkerTransport(token="")
    yield transport
    transport.close()


def _coordinator_running_heavy_query(tpch_dir, urls, probe, capture: bool) -> subprocess.Popen:
    """A coordinator process running HEAVY on ``urls``, returned once the workers are busy."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    coordinator = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, str(tpch_dir), *urls],
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=out,
        text=True,
        cwd=REPO,
    )
    try:
        coordinator.stdin.write(HEAVY)
        coordinator.stdin.close()
        _wait_until(lambda: _busy(probe, urls), timeout_s=60)
    except BaseException:
        coordinator.kill()
        coordinator.wait()
        raise
    return coordinator


def test_interrupting_the_coordinator_stops_the_workers_datafusion_work(
    own_workers, tpch_dir, probe
):
    """Events and CPU time, not wall time: a busy machine slows the cancellation down.

    The workers free the query (an event, waited for with a wide bound), then
    use almost no CPU: their DataFusion work stopped, not only the bookkeeping.
    """
    workers = own_workers(2)
    urls = [w.url for w in workers]
    coordinator = _coordinator_running_heavy_query(tpch_dir, urls, probe, capture=True)
    try:
        time.sleep(0.5)  # let the tasks get deep into the join
        assert _busy(probe, urls), "the query ended before it could be interrupted"
        coordinator.send_signal(signal.SIGINT)  # what Ctrl-C does
        _wait_until(lambda: _idle(probe, urls), timeout_s=30.0)
        _wait_until(lambda: not any(probe.stats(u)["running_tasks"] for u in urls), timeout_s=30.0)
        wait_until_idle([w.proc.pid for w in workers], timeout_s=30.0)
        assert coordinator.wait(timeout=10) != 0
        assert "KeyboardInterrupt" in coordinator.stderr.read()
    finally:
        coordinator.kill()
        coordinator.wait()


def test_state_expires_when_the_coordinator_disappears(own_workers, tpch_dir, probe):
    urls = [w.url for w in own_workers(2, "--query-ttl", "1")]
    coordinator = _coordinator_running_heavy_query(tpch_dir, urls, probe, capture=False)
    try:
        coordinator.kill()  # no cancel_query, no more keepalives
        coordinator.wait()
        # time-to-live 1 s, checked every 0.25 s; a consumer task stops polling its
        # producer once its own query expired, then the producer's expires too.
        _wait_until(lambda: _idle(probe, urls), timeout_s=5.0)
    finally:
        coordinator.kill()
        coordinator.wait()


# ------------------------------------------------------------------ security
def test_wrong_or_missing_token_is_rejected_and_nothing_runs(own_workers, tpch_dir, oracle):
    urls = [w.url for w in own_workers(2, "--token", "s3cret")]
    admin = FlightWorkerTransport(token="s3cret")
    for token in ("wrong", ""):
        runtime = FlightRuntime(urls, token=token)
        with pytest.raises(AuthenticationError) as info:
            _context(runtime, tpch_dir, tasks=2).sql(tpch.query(6)).to_arrow_table()
        assert info.value.url in urls and info.value.url in str(info.value)
        runtime.close()
        for url in urls:
            stats = admin.stats(url)
            assert stats["plans_received"] == 0 and stats["live_tasks"] == 0, stats
    runtime = FlightRuntime(urls, token="s3cret")
    got = _context(runtime, tpch_dir, tasks=2).sql(tpch.query(6)).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, tpch.query(6)), ordered=False)
    assert sum(admin.stats(url)["plans_received"] for url in urls) > 0
    runtime.close()
    admin.close()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "worker.crt", tmp / "worker.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_with_a_self_signed_certificate(own_workers, tpch_dir, oracle, tmp_path):
    cert, key = _self_signed(tmp_path)
    workers = own_workers(
        2, "--tls-cert", str(cert), "--tls-key", str(key), "--token", "t0k", env={}
    )
    urls = [w.url for w in workers]
    assert all(u.startswith("grpc+tls://127.0.0.1:") for u in urls)
    runtime = FlightRuntime(urls, token="t0k", tls_root_certs=cert.read_bytes())
    sql = tpch.query(3)  # shuffles: workers read each other over TLS too
    got = _context(runtime, tpch_dir, tasks=2).sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=True)
    runtime.close()
    with pytest.raises(TransportError) as info:  # checked when the runtime starts
        FlightRuntime(urls, token="t0k")  # system roots do not trust the cert
    assert urls[0] in str(info.value) or urls[1] in str(info.value)


# ------------------------------------------------------------------ faults
def _run_and_kill(workers, tpch_dir, max_retries: int):
    """Run MEDIUM on ``workers``; SIGKILL the last one once it holds a task.

    Returns (result or error, seconds from the kill to the end, victim URL).
    """
    urls = [w.url for w in workers]
    victim = workers[-1]
    runtime = FlightRuntime(urls, max_retries=max_retries)
    ctx = _context(runtime, tpch_dir, tasks=len(urls))
    df = ctx.sql(MEDIUM)
    df.stage_graph()
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = df.to_arrow_table()
        except Exception as exc:
            outcome["error"] = exc
        outcome["end"] = time.monotonic()

    thread = threading.Thread(target=run)
    probe = FlightWorkerTransport(token="")
    thread.start()
    _wait_until(
        lambda: "end" in outcome or probe.stats(victim.url)["plans_received"] > 0, 60, 0.005
    )
    assert "end" not in outcome, "the query ended before the worker could be killed"
    victim.kill()
    killed = time.monotonic()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the query hangs after a worker died"
    probe.close()
    runtime.close()
    return outcome, outcome["end"] - killed, victim.url


def test_killed_worker_is_retried_on_the_remaining_workers(own_workers, tpch_dir, oracle, probe):
    workers = own_workers(3)
    outcome, took, victim = _run_and_kill(workers, tpch_dir, max_retries=1)
    assert "error" not in outcome, outcome.get("error")
    assert_same_result(outcome["result"], oracle_result(oracle, MEDIUM), ordered=True)
    assert took < 30, f"retry took {took:.1f} s"
    survivors = [w.url for w in workers if w.url != victim]
    _wait_until(lambda: _idle(probe, survivors), timeout_s=5.0)


def test_killed_worker_fails_within_10s_naming_url_stage_and_task(own_workers, tpch_dir):
    workers = own_workers(3)
    outcome, took, victim = _run_and_kill(workers, tpch_dir, max_retries=0)
    err = outcome.get("error")
    assert isinstance(err, TaskError | TransportError), err
    assert took < 10, f"the error took {took:.1f} s"
    assert victim in str(err)
    assert "stage" in str(err) and "task" in str(err)


def test_unreachable_url_gives_a_clear_error_naming_it():
    urls = [f"grpc://127.0.0.1:{_closed_port()}", f"grpc://127.0.0.1:{_closed_port()}"]
    start = time.monotonic()
    with pytest.raises(WorkerUnavailableError) as info:
        FlightRuntime(urls)  # the runtime checks its workers when it starts
    assert time.monotonic() - start < 10
    assert info.value.url in urls
    assert all(url in str(info.value) for url in urls)


def test_a_single_wrong_url_fails_when_the_runtime_starts():
    # Issue 25, item 10: with one worker the query ran on the coordinator; a wrong
    # URL went unnoticed.
    url = f"grpc://127.0.0.1:{_closed_port()}"
    with pytest.raises(WorkerUnavailableError, match=url):
        FlightRuntime([url])


def test_a_single_worker_does_the_work(own_workers, tpch_dir, oracle, probe):
    # Issue 25, item 10: one worker, a query of one task (over 16 MiB of lineitem,
    # so not run in place): its scan runs on the worker, not in the head stage.
    (worker,) = own_workers(1)
    runtime = FlightRuntime([worker.url])
    try:
        sql = tpch.query(1)
        got = _context(runtime, tpch_dir).sql(sql).to_arrow_table()
        assert_same_result(got, oracle_result(oracle, sql), ordered=True)
        assert probe.stats(worker.url)["plans_received"] > 0
    finally:
        runtime.close()


def test_unreachable_url_among_live_ones_is_skipped(flight_workers, tpch_dir, oracle):
    url = f"grpc://127.0.0.1:{_closed_port()}"
    runtime = FlightRuntime([*flight_workers, url])
    got = _context(runtime, tpch_dir, tasks=4).sql(tpch.query(5)).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, tpch.query(5)), ordered=True)
    runtime.close()


def test_url_of_another_scheme_is_rejected():
    with pytest.raises(WorkerUnavailableError, match="not an Arrow Flight URL"):
        FlightRuntime(["http://127.0.0.1:1", "local://0"])


# ------------------------------------------------------------------ resolvers
def test_empty_resolver_fails_at_planning(tpch_dir):
    resolver = DynamicWorkerResolver(lambda: [], interval_s=60)
    runtime = FlightRuntime(resolver)
    df = _context(runtime, tpch_dir).sql(tpch.query(6))
    with pytest.raises(PlanningError, match="no Flight worker"):
        df.explain()
    resolver.close()
    runtime.close()


def test_dynamic_resolver_picks_up_an_added_worker(
    flight_workers, own_workers, tpch_dir, oracle, tmp_path
):
    listing = tmp_path / "workers.txt"
    listing.write_text("\n".join(flight_workers[:2]))
    resolver = DynamicWorkerResolver(lambda: listing.read_text().split(), interval_s=0.1)
    runtime = FlightRuntime(resolver)
    ctx = _context(runtime, tpch_dir)
    sql = tpch.query(3)
    ctx.sql(sql).to_arrow_table()
    (added,) = own_workers(1)
    listing.write_text("\n".join([*flight_workers[:2], added.url]))
    _wait_until(lambda: added.url in resolver.get_urls(), timeout_s=5)
    ctx.config = DistributedConfig(tasks_per_stage=3)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=True)
    assert runtime.transport.stats(added.url)["plans_received"] > 0
    resolver.close()
    runtime.close()


def test_a_worker_started_from_python(tpch_dir, oracle):
    from distfusion.worker.flight_server import FlightWorker

    with FlightWorker(port=0) as a, FlightWorker(port=0) as b:
        assert a.url.startswith("grpc://127.0.0.1:")
        runtime = FlightRuntime([a.url, b.url])
        got = _context(runtime, tpch_dir, tasks=2).sql(tpch.query(1)).to_arrow_table()
        assert_same_result(got, oracle_result(oracle, tpch.query(1)), ordered=True)
        assert all(s["live_tasks"] == 0 for s in runtime.stats().values())
        runtime.close()


def test_a_worker_runs_a_task_of_its_own_process_without_json(tpch_dir, monkeypatch):
    # Issue 26: a Spark executor's worker ran its task plan through set_plan's JSON
    # (to_json, then from_json in the same process). The plan object is used now.
    from distfusion.protocol.task_plan import TaskPlan
    from distfusion.runtime.local import LocalRuntime
    from distfusion.worker.flight_server import FlightWorker

    runtime = LocalRuntime(workers=1)
    try:
        ctx = _context(runtime, tpch_dir, tasks=1)
        graph = ctx.sql("SELECT count(*) FROM region").stage_graph()
    finally:
        runtime.close()
    leaf = next(s for s in graph.stages if s.scans)
    plan = TaskPlan.for_task("q-in-process", leaf, 0, ((),) * len(leaf.inputs), 1)

    def decoded(*args):
        raise AssertionError("an in-process task plan was decoded from JSON")

    monkeypatch.setattr(TaskPlan, "from_json", decoded)
    with FlightWorker(port=0) as worker:
        metrics = worker.run_task(plan)
        assert sum(metrics.partition_rows) > 0
        assert worker._plans_received == 1


def test_a_started_worker_does_not_start_twice_on_a_taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match="did not start"):
            start_worker("--port", str(port), timeout_s=30)


# ------------------------------------------------------------------ stray calls
def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_stray_doget_calls_leave_the_worker_thread_count_flat(own_workers):
    # Issue 25, item 9: a DoGet for a task that never arrives held a worker thread
    # until the query's TTL (120 s): 64 such calls took a worker from 20 to 88 threads.
    # Each client here gives up after 0.5 s; the worker's threads must go back.
    from pyarrow import flight

    from distfusion.protocol.messages import encode_ticket
    from distfusion.protocol.task_plan import TaskKey

    (worker,) = own_workers(1)
    pid = worker.proc.pid
    before = _threads(pid)

    def stray(i: int) -> None:
        client = flight.FlightClient(worker.url)
        ticket = flight.Ticket(encode_ticket(TaskKey(f"stray-{i}", 1, 0), 0, None))
        try:
            client.do_get(ticket, flight.FlightCallOptions(timeout=0.5)).read_all()
        except flight.FlightError:
            pass  # timed out, or answered "not yet"
        finally:
            client.close()

    callers = [threading.Thread(target=stray, args=(i,)) for i in range(64)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    # Events, not a fixed wait: the count goes back well before the 120 s TTL.
    _wait_until(lambda: _threads(pid) <= before + 4, timeout_s=20, interval_s=0.2)


def test_a_sigtermed_worker_cleans_up_its_spill_directory(own_workers, tpch_dir, tmp_path):
    # Issue 25, item 8: SIGTERM (how runtimes stop their workers) ended the worker
    # without its cleanup, leaving its spill directory behind.
    spill = tmp_path / "spill"
    (worker,) = own_workers(1, "--spill-dir", str(spill))
    runtime = FlightRuntime([worker.url])
    try:
        _context(runtime, tpch_dir).sql(tpch.query(1)).to_arrow_table()
    finally:
        runtime.close()
    assert list(spill.iterdir()), "the worker made no spill directory to clean up"
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(30) == 0, worker.log()[-2000:]
    assert list(spill.iterdir()) == []
