"""Flight worker processes for tests.

Real ``python -m distfusion.worker.flight_cli`` processes on 127.0.0.1, each
on a free port it picks itself (``--port 0``) and announces on its first stdout line.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
READY = "distfusion worker listening on "


class WorkerProcess:
    """One worker process; :attr:`url` is where it listens."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def kill(self) -> None:
        """SIGKILL: the worker dies at once, as a crashed machine would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s`` seconds.

        A task stuck inside DataFusion keeps its thread until its next batch.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()

    def log(self) -> str:
        """What the worker wrote to stderr."""
        return Path(self.log_path).read_text(errors="replace")

    def __repr__(self) -> str:
        return f"WorkerProcess({self.url}, pid={self.proc.pid})"


def start_worker(*args: str, env: dict | None = None, timeout_s: float = 60.0) -> WorkerProcess:
    """Start one worker process with extra command-line ``args``; wait until it listens.

    Raises:
        RuntimeError: it exited or did not announce its URL within ``timeout_s`` seconds.
    """
    log = tempfile.NamedTemporaryFile(prefix="distfusion-worker-", suffix=".log", delete=False)
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "distfusion.worker.flight_cli", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=log,
        env=full_env,
        text=True,
        cwd=REPO,
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            break
    if not line.startswith(READY):
        worker = WorkerProcess(proc, "", log.name)
        worker.kill()
        msg = f"worker did not start (exit code {proc.returncode}): {line!r}\n{worker.log()}"
        raise RuntimeError(msg)
    return WorkerProcess(proc, line[len(READY) :].strip(), log.name)


def start_workers(n: int, *args: str, env: dict | None = None) -> list[WorkerProcess]:
    """Start ``n`` workers (all stopped again if one fails to start)."""
    workers: list[WorkerProcess] = []
    try:
        for _ in range(n):
            workers.append(start_worker(*args, env=env))
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Stop every worker (see :meth:`WorkerProcess.stop`)."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        w.stop()
