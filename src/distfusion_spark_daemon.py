"""PySpark's Python worker daemon, without the traceback of an idle worker's closed socket.

The embedded Spark session distfusion starts talks to its Python workers over
Unix sockets (``spark.python.unix.domain.socket.enabled``: ~40 ms less per
task than TCP here). Spark closes the socket of a Python worker idle for a
minute (``PythonWorkerFactory``'s idle timeout); the worker, waiting for its
next task, then writes its end-of-input error and flushes it into the closed
socket. Over a Unix socket that flush fails at once (``BrokenPipeError``;
over TCP the first write after the peer closed still succeeds), and with
``spark.python.daemon.killWorkerOnFlushFailure`` (Spark's default) the daemon
prints the traceback: one per idle worker, on a run where nothing failed
(issue 25: "a successful run prints no traceback").

This module runs PySpark's own daemon (:mod:`pyspark.daemon`) with its
``worker`` function wrapped: a worker whose socket is gone (broken pipe,
reset connection) ends with a non-zero code, which makes the daemon's child
wait for the socket to close and exit, as the exception did, minus the
traceback. Spark reads nothing more from such a worker either way. It is the
embedded session's ``spark.python.daemon.module``; a session the user made
keeps its own daemon.

A top-level module, not part of the ``distfusion`` package: importing that
loads pyarrow and DataFusion, which start threads, and the daemon must start
none before it forks its workers (see :mod:`pyspark.daemon`).
"""

from __future__ import annotations

import pyspark.daemon as _daemon

__all__ = ["worker"]

_pyspark_worker = _daemon.worker

GONE = 1
"""What :func:`worker` returns when the socket to the executor is gone: not 0,
so the daemon's child does not wait for another task on it."""


def worker(sock, authenticated: bool) -> int:
    """:func:`pyspark.daemon.worker`; ``GONE`` when its socket was closed by the executor."""
    try:
        return _pyspark_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return GONE


_daemon.worker = worker

if __name__ == "__main__":
    _daemon.manager()
