"""Stopping the local runtime's work from outside (issue #25, item 5).

- Ctrl-C: a process running a heavy local query ends within seconds. The
  query is a join done inside a leaf stage (a broadcast side against a scan,
  ~3.6 billion matches at SF0.1) feeding an aggregate: DataFusion yields
  nothing until the task ends, minutes later. Before, the interpreter waited
  for the worker threads, each blocked in DataFusion until then (155 s on a
  TPC-H SF1 join); now no thread waits in native code (worker/interrupt.py).
- Another thread closes the result stream while the reading thread waits
  for the next batch: the reader raises QueryCancelledError and the work stops
  (before: ``ValueError: generator already executing``, and the query ran on).

Events, not wall time: the signal goes once the process burns CPU in the
join; the bounds (:data:`EXIT_WITHIN_S`) are wide for a busy machine, far
below the minutes the query takes uncancelled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from distfusion import DistributedConfig, DistributedContext, QueryCancelledError, tpch
from distfusion.runtime.local import LocalRuntime
from tests.cpu import cpu_s, wait_until_idle

REPO = Path(__file__).resolve().parents[2]

# Four suppliers per key: ~3,000 matches per lineitem row, aggregated.
HEAVY_JOIN = (
    "SELECT count(*) AS n, sum(a.l_quantity * b.l_quantity) AS s FROM lineitem a "
    "JOIN lineitem b ON a.l_suppkey % 100 = b.l_suppkey % 100"
)
EXIT_WITHIN_S = 10.0
"""Bound for the process to end after SIGINT. The issue asks for 5 s; measured 3.0-3.9 s
on two cores at load 9-10 (most of it Python's finalization, sharing the cores with the
abandoned DataFusion threads), so twice the issue's bound for a busier machine."""
BUSY_CPU_S = 3.0
"""CPU seconds the child uses in the query before it is interrupted (the join runs)."""

CHILD = textwrap.dedent(
    """
    import sys
    from distfusion import DistributedConfig, DistributedContext, LocalRuntime, tpch

    config = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=2**40, adaptive=False)
    ctx = DistributedContext(runtime=LocalRuntime(workers=2), config=config)
    tpch.register_tpch(ctx, sys.argv[1])
    df = ctx.sql(sys.argv[2])
    assert len(df.stage_graph().stages) == 3, df.explain()  # the join in the leaf stage
    print("started", flush=True)
    print(df.to_arrow_table(), flush=True)
    """
)


def _wait_for_cpu(pid: int, seconds: float, timeout_s: float = 120.0) -> None:
    start, deadline = cpu_s(pid), time.monotonic() + timeout_s
    while cpu_s(pid) - start < seconds:
        assert time.monotonic() < deadline, f"the query used no {seconds} s of CPU"
        time.sleep(0.1)


def test_sigint_ends_a_process_running_a_heavy_local_query(tpch_dir, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tpch_dir), HEAVY_JOIN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()
        _wait_for_cpu(proc.pid, BUSY_CPU_S)
        assert proc.poll() is None, "the query ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        try:
            proc.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process still ran {EXIT_WITHIN_S} s after SIGINT")
        took = time.monotonic() - start
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    # Ended by the interrupt (Python re-raises SIGINT at exit), not by a crash at exit.
    assert proc.returncode == -signal.SIGINT, (proc.returncode, took, err[-2000:])
    assert "KeyboardInterrupt" in err
    for crash in ("Fatal Python error", "Segmentation fault", "panicked", "Aborted"):
        assert crash not in err, err[-2000:]


# A shuffle join in a stage of its own, its probe side replayed from memory: the
# pulls are where DataFusion stops (tests/runtime/test_cancellation.py); the head
# stage waits for the aggregate of it, tens of seconds uncancelled.
STREAMED_JOIN = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s "
    "FROM (SELECT l_suppkey % 10 AS k, l_quantity FROM lineitem WHERE l_linenumber = 1) b "
    "JOIN lineitem a ON a.l_suppkey % 10 = b.k"
)
SHUFFLED = DistributedConfig(
    tasks_per_stage=2, broadcast_threshold_bytes=0, max_broadcast_bytes=0, adaptive=False
)


def test_closing_the_result_stream_from_another_thread_stops_the_query(tpch_dir):
    runtime = LocalRuntime(workers=2)
    try:
        ctx = DistributedContext(runtime=runtime, config=SHUFFLED)
        tpch.register_tpch(ctx, tpch_dir)
        stream = ctx.sql(STREAMED_JOIN).execute_stream()
        closed: list[BaseException | None] = []

        def close_when_the_join_runs() -> None:
            deadline = time.monotonic() + 120
            while not any(s["running_tasks"] for s in runtime.stats().values()):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            _wait_for_cpu(os.getpid(), BUSY_CPU_S)
            try:
                stream.close()
                closed.append(None)
            except BaseException as exc:  # "generator already executing", before
                closed.append(exc)

        closer = threading.Thread(target=close_when_the_join_runs)
        closer.start()
        with pytest.raises(QueryCancelledError):
            next(stream)  # waits for the aggregate of the join
        closer.join(EXIT_WITHIN_S)
        assert closed == [None]
        wait_until_idle([os.getpid()], EXIT_WITHIN_S)
        assert all(s["live_tasks"] == 0 for s in runtime.stats().values())
        with pytest.raises(StopIteration):
            next(stream)
    finally:
        runtime.close()
