"""Starting an embedded Spark session so that its JVM ends with this process (issue 25, item 6).

PySpark's ``launch_gateway`` starts the JVM; interrupted during start-up it can
leave the JVM running (see :func:`gateway_ends_with_this_process`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from distfusion.worker.memory import is_running, remove_stale_roots

__all__ = ["gateway_ends_with_this_process", "parent_death_signal", "stop_session"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal() -> Callable[[], None] | None:
    """What a child calls before ``exec`` to get SIGTERM when its parent thread ends.

    ``PR_SET_PDEATHSIG``; None where there is no ``prctl`` (not Linux). Looked
    up here, in the parent: the child of a threaded process must not load
    libraries or take locks before ``exec``; the call itself allocates nothing.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    sigterm = int(signal.SIGTERM)
    return lambda: prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)


@contextlib.contextmanager
def gateway_ends_with_this_process() -> Iterator[None]:
    """Within it, a Spark JVM that PySpark launches (an embedded session) ends with this process.

    PySpark's ``launch_gateway`` gives the JVM a pipe on standard input, to end
    it when Python goes; interrupted during start-up (Ctrl-C), it deletes the
    directory the JVM writes its connection file to, the JVM's main thread
    fails before reading that pipe, and py4j's server thread keeps the JVM
    alive (issue 25: still running 16 minutes later). So: a JVM started here
    is killed when the start-up fails or is interrupted (a Ctrl-C while
    ``Popen`` runs is held until it returned, so the process is known); and,
    started from the main thread, it gets SIGTERM when this process dies
    however it ends (``PR_SET_PDEATHSIG``; Spark's shutdown hooks stop it as
    on a normal exit). Wraps the module's ``Popen`` for the call only:
    ``launch_gateway`` overwrites a ``preexec_fn`` given to it.
    """
    import pyspark.java_gateway as java_gateway

    started: list = []
    original = java_gateway.Popen
    main = threading.current_thread() is threading.main_thread()
    die_with_parent = parent_death_signal() if main else None  # a thread's end would kill it

    def popen(command, **kwargs):
        inner = kwargs.get("preexec_fn")

        def preexec() -> None:
            if inner is not None:
                inner()
            if die_with_parent is not None:
                die_with_parent()

        kwargs["preexec_fn"] = preexec
        held: list = []
        previous = signal.signal(signal.SIGINT, lambda *a: held.append(a)) if main else None
        try:
            proc = original(command, **kwargs)
            started.append(proc)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(*held[0])  # Python's handler raises KeyboardInterrupt
            raise KeyboardInterrupt
        return proc

    java_gateway.Popen = popen  # type: ignore[misc, assignment]  # py4j's module attribute
    try:
        yield
    except BaseException:
        for proc in started:  # the start failed or was interrupted: no JVM left behind
            proc.kill()
            proc.wait()
        raise
    finally:
        java_gateway.Popen = original  # type: ignore[misc]  # py4j's module attribute


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (read from Linux's ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def stop_session(spark, wait_s: float = 5.0) -> None:
    """Stop an embedded SparkSession, then delete the spill roots its Python workers left.

    Spark ends its Python workers without running their finalizers, so a
    worker's spill root (:class:`~distfusion.worker.memory.SpillDirs`) stays
    until another root is made in the same directory. Waits up to ``wait_s``
    seconds for the JVM's child processes to end first.
    """
    gateway = spark.sparkContext._gateway  # noqa: SLF001 (the JVM's process: no public API)
    proc = getattr(gateway, "proc", None)
    workers = _descendants(proc.pid) if proc is not None else set()
    spark.stop()
    deadline = time.monotonic() + wait_s
    while workers and time.monotonic() < deadline:
        time.sleep(0.05)
        workers = {p for p in workers if is_running(p)}
    remove_stale_roots(tempfile.gettempdir())
