"""Flight worker processes for tests.

Real ``python -m distfusion.worker.flight_cli`` processes on 127.0.0.1, started
by :func:`distfusion.runtime.flight.start_local_workers` (each on a free port
it announces), with this checkout's ``src`` on their path and their stderr in
a log file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from distfusion.runtime.flight import start_local_workers, stop_local_workers

REPO = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """One worker process; :attr:`url` is where it listens."""

    def __init__(self, proc, url: str, log_path: str) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def kill(self) -> None:
        """SIGKILL: the worker dies at once, as a crashed machine would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s`` seconds."""
        stop_local_workers([self.proc], timeout_s)

    def log(self) -> str:
        """What the worker wrote to stderr."""
        return Path(self.log_path).read_text(errors="replace")

    def __repr__(self) -> str:
        return f"WorkerProcess({self.url}, pid={self.proc.pid})"


def start_workers(
    n: int, *args: str, env: dict | None = None, timeout_s: float = 60.0
) -> list[WorkerProcess]:
    """Start ``n`` workers with extra command-line ``args`` (all stopped if one fails to start).

    Raises:
        RuntimeError: a worker exited or did not announce its URL; the message
            holds the log of each worker.
    """
    logs = []
    for _ in range(n):
        with tempfile.NamedTemporaryFile(
            prefix="distfusion-worker-", suffix=".log", delete=False
        ) as log:
            logs.append(log.name)
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    try:
        started = start_local_workers(
            n,
            list(args),
            env={"PYTHONPATH": path, **(env or {})},
            timeout_s=timeout_s,
            log_paths=logs,
        )
    except RuntimeError as exc:
        text = "\n".join(Path(p).read_text(errors="replace") for p in logs)
        for p in logs:
            Path(p).unlink(missing_ok=True)
        raise RuntimeError(f"{exc}\n{text}") from None
    return [WorkerProcess(proc, url, log) for (proc, url), log in zip(started, logs, strict=True)]


def start_worker(*args: str, env: dict | None = None, timeout_s: float = 60.0) -> WorkerProcess:
    """Start one worker (see :func:`start_workers`)."""
    return start_workers(1, *args, env=env, timeout_s=timeout_s)[0]


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Stop every worker (see :func:`~distfusion.runtime.flight.stop_local_workers`).

    Their log files are removed: nothing a test makes outlives it.
    """
    stop_local_workers([w.proc for w in workers])
    for w in workers:
        Path(w.log_path).unlink(missing_ok=True)
