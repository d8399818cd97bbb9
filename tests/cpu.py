"""CPU time of a process, for tests that check work stopped (not only its bookkeeping).

Wall-clock bounds are flaky on a busy machine; CPU time of an idle process is
not: a process whose DataFusion work stopped uses a few milliseconds a second,
one still running a join a core or more.
"""

from __future__ import annotations

import os
import time

IDLE_CPU_S = 0.1
"""CPU seconds a process may use per second and still count as idle (an idle
worker uses ~0.01; a running join up to a core per thread, at least a few
tenths even when niced on a busy machine)."""

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far, every thread counted."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def cpu_in(pid: int, seconds: float = 1.0) -> float:
    """CPU seconds process ``pid`` uses during the next ``seconds``."""
    start = cpu_s(pid)
    time.sleep(seconds)
    return cpu_s(pid) - start


def wait_until_idle(pids: list[int], timeout_s: float, window_s: float = 1.0) -> float:
    """Seconds until every process of ``pids`` used under :data:`IDLE_CPU_S` per second.

    Measured in windows of ``window_s`` seconds; a process that exited counts as
    idle. DataFusion stops a dropped stream at its next yield point (an input
    batch, an I/O wait), so a cancelled join may run on for a moment: wait for
    the fact, with a wide ``timeout_s``, rather than bound a wall time.

    Raises:
        AssertionError: still busy after ``timeout_s`` (names the CPU use seen).
    """
    start = time.monotonic()
    while True:
        used = {}
        for pid in pids:
            try:
                used[pid] = cpu_in(pid, window_s) / window_s
            except FileNotFoundError:
                used[pid] = 0.0
        if all(u < IDLE_CPU_S for u in used.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            msg = f"still busy after {timeout_s} s: CPU s per s by pid {used}"
            raise AssertionError(msg)
