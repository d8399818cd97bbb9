"""Flight workers a runtime started die with the process that started them (issue 25).

However the parent ends -- it returns without ``close()``, or is SIGKILLed --
its workers stop within seconds: each watches a pipe from the parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

PARENT = """
import sys, time
from distfusion.runtime.flight import FlightRuntime
runtime = FlightRuntime.with_local_workers(2)
print(" ".join(str(p.pid) for p in runtime._processes), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _start_parent(mode: str) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    return parent, pids


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_workers_die_when_their_parent_is_killed():
    parent, pids = _start_parent("sleep")
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        assert _gone_within(pids, 5.0), [p for p in pids if _alive(p)]
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_workers_die_when_their_parent_returns_without_closing_the_runtime():
    parent, pids = _start_parent("return")
    parent.wait(timeout=60)
    try:
        assert _gone_within(pids, 5.0), [p for p in pids if _alive(p)]
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
