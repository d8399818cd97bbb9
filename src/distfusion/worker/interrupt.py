"""Waiting on DataFusion's native work so that another thread can stop the wait.

A task's thread used to spend its time inside datafusion-python's
``RecordBatchStream.__next__``: the GIL released, Python running again only
when DataFusion yields a batch. A task that yields nothing for a long time
(an aggregate over a join, a join's build side) could not be stopped: the
query's cancel flag was read between batches only, so a cancelled task,
``ctx.close()`` and an interpreter exiting after Ctrl-C all waited for the
task's end (155 s on a heavy TPC-H SF1 join, both cores busy).

Nothing in datafusion-python stops a call from another thread. Its
``wait_for_future`` runs a no-op Python statement once a second (to let
``KeyboardInterrupt`` through, datafusion-python ``crates/util/src/lib.rs``),
which would deliver an asynchronous exception (``PyThreadState_SetAsyncExc``),
but that second is a tokio timer, and tokio turns its timers only between
polls: partition tasks that run for seconds without returning ``Pending``
(a join making millions of rows of each input batch) starve it. Measured:
TPC-H SF1 ``lineitem JOIN partsupp`` aggregated, two tasks of four
partitions on two cores: the exception scheduled 12 s in was raised at the
task's end, 155 s later.

So the thread that waits (a worker's task thread, the thread reading a
result) never waits in native code: :func:`iterate_native` and
:func:`call_native` hand the native calls to a helper thread and wait on a
queue, checking every :data:`POLL_S` whether the waiting thread's
:class:`Interruptible` was interrupted (or its query cancelled)::

    waiting thread (task / result reader)      helper thread (daemon)
      with Interruptible() as scope:             stream = df.execute_stream()
        for batch in iterate_native(...):  <──── next(stream) ... ──> queue
          ...                                        (DataFusion works)
      another thread: scope.interrupt(err)
        the wait raises err within POLL_S;       abandoned: the helper drops the
        the helper is abandoned ───────────────>  stream after its call returns

The waiting thread is free at once (its worker slot too); a Ctrl-C in the
main thread is seen at once. DataFusion's work itself stops only where
DataFusion yields: the helper drops the stream when its call returns (it is
also sent an asynchronous exception, which lands within a second when the
runtime's timers run), and DataFusion's partition tasks end at their next
yield once their stream is dropped. Until then its cores stay busy:
DataFusion offers no way to stop an operator between two of its yields.

At interpreter exit (:func:`_wait_for_helpers`, before Python finalizes)
helpers still inside DataFusion get :data:`EXIT_GRACE_S` seconds to return;
the others are left to the process's end (they are daemon threads).
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from distfusion.errors import QueryCancelledError

__all__ = ["EXIT_GRACE_S", "POLL_S", "Interruptible", "call_native", "current", "iterate_native"]

T = TypeVar("T")

POLL_S = 0.1
"""Seconds between two checks of a waiting thread for an interrupt or a cancelled query."""

EXIT_GRACE_S = 1.0
"""Seconds an exiting interpreter waits for helper threads still inside DataFusion."""

log = logging.getLogger("distfusion.worker")

_LOCK = threading.Lock()
_LOCAL = threading.local()
_HELPERS: set[threading.Thread] = set()  # helper threads alive now
_NAMES = itertools.count()


class _Interrupted(QueryCancelledError):
    """Raised in an interrupted helper's native call (an asynchronous exception)."""

    def __init__(self, message: str = "the native call was abandoned") -> None:
        super().__init__(message)


def _send(thread_id: int, exc: type[BaseException] | None) -> bool:
    """Schedule ``exc`` in thread ``thread_id`` (None clears a scheduled one); whether it exists."""
    target = ctypes.py_object(exc) if exc is not None else None
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), target) == 1


class Interruptible:
    """A thread's waits on DataFusion that another thread may stop (see the module).

    The thread that waits enters it (a context manager); :meth:`interrupt`
    is called from any thread, and every wait of the scope then raises the
    interrupter's error: :func:`iterate_native` and :func:`call_native`
    within :data:`POLL_S`. Once interrupted, a scope stays so.

    A helper thread's own scope is also sent an asynchronous exception when
    interrupted while inside its native call (``signal_native=True``).
    """

    def __init__(self, signal_native: bool = False) -> None:
        self.thread_id: int | None = threading.get_ident()  # re-read when entered
        self.error: QueryCancelledError | None = None
        self.helpers: list[threading.Thread] = []
        """Helper threads the scope's waits started (for a bounded join by their owner)."""
        self._signal_native = signal_native
        self._native = False  # the thread is inside its native call now
        self._sent = False  # an asynchronous exception is scheduled in the thread
        self.waker: Callable[[], None] | None = None  # ends the thread's current wait

    def __enter__(self) -> Interruptible:
        self.thread_id = threading.get_ident()
        stack = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = _LOCAL.stack
        if stack and stack[-1] is self:
            stack.pop()
        with _LOCK:
            self._native = False
            self._unsend()

    @property
    def interrupted(self) -> bool:
        """Whether :meth:`interrupt` was called."""
        return self.error is not None

    def interrupt(self, error: QueryCancelledError | None = None) -> None:
        """Stop the thread's wait now, or its next one, with ``error``.

        The first error given wins (default: a :class:`QueryCancelledError` saying
        the query was cancelled). Returns at once.
        """
        with _LOCK:
            if self.error is None:
                self.error = error or QueryCancelledError("the query was cancelled")
            if self._signal_native and self._native and not self._sent and self.thread_id:
                self._sent = _send(self.thread_id, _Interrupted)
            wake = self.waker
        if wake is not None:
            wake()

    def check(self) -> None:
        """Raise the interrupter's error when interrupted.

        Raises:
            QueryCancelledError: :meth:`interrupt` was called.
        """
        error = self.error
        if error is not None:
            raise error.with_traceback(None)

    def native_call(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` inside the helper's native section (asynchronous exceptions allowed)."""
        with _LOCK:
            if self.error is not None:
                raise self.error.with_traceback(None)
            self._native = True
        try:
            return fn(*args)
        finally:
            with _LOCK:
                self._native = False
                self._unsend()

    def _unsend(self) -> None:
        """Clear a scheduled exception not raised yet (lock held)."""
        if self._sent and self.thread_id is not None:
            _send(self.thread_id, None)
        self._sent = False

    def __repr__(self) -> str:
        state = "interrupted" if self.interrupted else "running"
        return f"Interruptible(thread={self.thread_id}, {state})"


def current() -> Interruptible | None:
    """The innermost :class:`Interruptible` the calling thread entered, if any."""
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1] if stack else None


_END = object()
_NEXT = object()
_STOP = object()


class _Helper:
    """A daemon thread making the native calls of one wait, and the queues it works through.

    It calls DataFusion only when asked (:meth:`ask`): between two asks it
    holds no call, so a waiting thread that leaves between batches lets it
    drop its stream at once (DataFusion's partition tasks then end).
    """

    def __init__(self, work: Callable[[_Helper], None], what: str) -> None:
        self.asks: queue.SimpleQueue = queue.SimpleQueue()
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.scope = Interruptible(signal_native=True)
        self.abandoned = False
        self.what = what
        self.thread = threading.Thread(
            target=self._main, args=(work,), name=f"distfusion-native-{next(_NAMES)}", daemon=True
        )
        with _LOCK:
            _HELPERS.add(self.thread)
        waiting = current()
        if waiting is not None:
            waiting.helpers[:] = [t for t in waiting.helpers if t.is_alive()]
            waiting.helpers.append(self.thread)
        self.thread.start()

    def _main(self, work: Callable[[_Helper], None]) -> None:
        try:
            with self.scope:
                work(self)
        except BaseException as exc:  # a native panic too: the waiting thread raises it
            # The frames of this thread's traceback hold the stream (the native call's
            # arguments): cleared, the stream is dropped now, so DataFusion's tasks end.
            traceback.clear_frames(exc.__traceback__)
            self.out.put(("error", exc))
        finally:
            with _LOCK:
                _HELPERS.discard(self.thread)

    def call(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in this helper, its native call interruptible (asynchronous exception)."""
        return self.scope.native_call(fn, *args)

    def wanted(self) -> bool:
        """Wait for the waiting thread's next ask; False when it left."""
        return self.asks.get() is _NEXT and not self.abandoned

    def ask(self, waiting: Interruptible | None, cancelled: Callable[[], bool]) -> tuple[str, Any]:
        """Have the helper make its next call; its answer.

        Raises:
            QueryCancelledError: the waiting thread was interrupted, or ``cancelled()``
                became true, before the answer came.
        """
        self.asks.put(_NEXT)
        if waiting is not None:
            waiting.waker = lambda: self.out.put(("wake", None))
        try:
            while True:
                if waiting is not None:
                    waiting.check()
                try:
                    kind, value = self.out.get(timeout=POLL_S)
                except queue.Empty:
                    kind = "wake"
                if kind != "wake":
                    return kind, value
                if cancelled():
                    msg = f"query cancelled while {self.what}"
                    raise QueryCancelledError(msg) from None
        finally:
            if waiting is not None:
                waiting.waker = None

    def abandon(self) -> None:
        """The waiting thread left: the helper stops after its call, or at once when idle."""
        self.abandoned = True
        self.asks.put(_STOP)
        self.scope.interrupt(QueryCancelledError("abandoned by the waiting thread"))


def iterate_native(
    open_stream: Callable[[], Any],
    cancelled: Callable[[], bool] = lambda: False,
    what: str = "waiting for DataFusion",
) -> Generator[Any, None, None]:
    """The items of a DataFusion record batch stream, pulled by a helper thread.

    ``open_stream()`` (``df.execute_stream``) and each ``next`` on its
    stream run in the helper, one call per item asked for; this generator
    waits for them. The stream is dropped in the helper when it ends, or
    once this generator is left (closed, or raising): at once when the helper
    is between two calls, else after its call returns.

    Args:
        open_stream: makes the stream (a call into DataFusion).
        cancelled: checked every :data:`POLL_S` while waiting.
        what: what the wait is, for the error message.

    Raises:
        QueryCancelledError: the calling thread's :class:`Interruptible` was
            interrupted, or ``cancelled()`` became true, while waiting.
        BaseException: what ``open_stream`` or the stream raised (DataFusion's
            error, a native panic), in this thread.
    """
    waiting = current()
    if waiting is not None:
        waiting.check()

    def pull(helper: _Helper) -> None:
        if not helper.wanted():
            return
        stream = helper.call(open_stream)
        try:
            item = helper.call(next, stream, _END)
            while True:
                helper.out.put(("item", item))
                if item is _END or not helper.wanted():
                    return
                item = helper.call(next, stream, _END)
        finally:
            del stream  # DataFusion's partition tasks end with their stream

    helper = _Helper(pull, what)
    try:
        while True:
            kind, value = helper.ask(waiting, cancelled)
            if kind == "error":
                raise value
            if value is _END:
                return
            yield value
    finally:
        helper.abandon()


def call_native(
    fn: Callable[..., T],
    *args,
    cancelled: Callable[[], bool] = lambda: False,
    what: str = "waiting for DataFusion",
) -> T:
    """``fn(*args)`` run by a helper thread; the calling thread waits interruptibly.

    For one long call into DataFusion (a write, a collect). See
    :func:`iterate_native`.

    Raises:
        QueryCancelledError: the calling thread's :class:`Interruptible` was
            interrupted, or ``cancelled()`` became true, while waiting.
        BaseException: what ``fn`` raised, in this thread.
    """
    waiting = current()
    if waiting is not None:
        waiting.check()

    def run(helper: _Helper) -> None:
        if helper.wanted():
            helper.out.put(("item", helper.call(fn, *args)))

    helper = _Helper(run, what)
    try:
        kind, value = helper.ask(waiting, cancelled)
        if kind == "error":
            raise value
        return value
    finally:
        helper.abandon()


def _wait_for_helpers(grace_s: float = EXIT_GRACE_S) -> None:
    """Give helpers still inside DataFusion ``grace_s`` seconds to return (interpreter exit).

    Every helper is abandoned by then (their waiting threads were stopped
    or closed first). One still inside DataFusion after that is left: a
    daemon thread, it ends with the process.
    """
    deadline = time.monotonic() + grace_s
    with _LOCK:
        helpers = list(_HELPERS)
    for thread in helpers:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in helpers if t.is_alive()]
    if left:
        log.debug("exiting with %d thread(s) still inside DataFusion: %s", len(left), left)


# threading._shutdown runs these before it joins non-daemon threads, the last
# registered first: the workers' hook (worker.py, imported after this module)
# stops the waiting threads, then this waits for their helpers. A private hook
# of the threading module (concurrent.futures uses it too); atexit otherwise.
getattr(threading, "_register_atexit", atexit.register)(_wait_for_helpers)
