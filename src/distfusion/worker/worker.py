"""A worker: runs the tasks it is given and serves their output partitions.

The same class backs the in-process runtime (one :class:`Worker` per simulated
worker, reached through :class:`~distfusion.transport.in_memory.InMemoryTransport`)
and a network worker server (which forwards its requests to a :class:`Worker`).

Lifecycle of a task on a worker::

    set_plan(plan) ──> queued ──> running ──> done: partitions held, their
                                      │            │ rows and bytes counted
                                      │            │ each partition freed after
                                      │            │ ``output.readers`` reads (or
                                      │            │ kept until cancel_query when
                                      │            │ ``plan.keep_output``)
                                      └─> failed: the TaskError is served instead
    cancel_query(query_id): stops running tasks, drops queued ones and every
    partition of the query.

A leaf task reading a work unit feed takes its units from an inbox per
(task, table) (:mod:`distfusion.worker.feed_inbox`): filled by
:meth:`Worker.receive_feed` when the coordinator pushes the feed (local and
Flight runtimes), or by a thread pulling from the coordinator's feed endpoint
when the plan names one (Spark).

Memory: each task runs DataFusion within a memory budget (the plan's
``memory_per_task_bytes``, else the worker's), spilling to a directory of its
query (:mod:`distfusion.worker.memory`). Its output partitions are a
:class:`~distfusion.worker.task_output.TaskOutput`: in memory while small,
Arrow IPC files in the query's directory once the task's output passes the
task's budget or the outputs held together pass ``output_memory_bytes``. The
query's directory is deleted by :meth:`Worker.cancel_query` (every runtime
calls it when a query ends, fails or is cancelled) and by the task that
notices the cancellation last.

Cancellation: a task checks its query's cancel flag between batches and
stops at DataFusion's next batch (:func:`~distfusion.worker.execute_task.stream_batches`);
a task waiting in DataFusion for a batch that does not come (an aggregate
over a join) is interrupted there (:mod:`distfusion.worker.interrupt`), so
its thread is free within about a second. :meth:`Worker.close` does not
wait for it. Every worker of the process is closed when the interpreter
exits, before Python joins the pools' threads: a process ended by Ctrl-C
does not wait for its tasks.

Tasks run in a FIFO thread pool of ``slots`` threads. A task blocks while it
reads its inputs from producer tasks; the coordinator submits every task of a
stage before any task of a later stage, so with FIFO pools the earliest
unfinished task always holds a thread and can make progress: no deadlock, even
with one slot.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from distfusion.errors import DistfusionError, QueryCancelledError, TaskError
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import is_task_failure, task_error
from distfusion.protocol.task_plan import ScanShare, TaskKey, TaskPlan
from distfusion.transport.feed_endpoint import pull_feed
from distfusion.work_unit_feed.unit import WorkUnit
from distfusion.worker.execute_task import run_task_into, task_meter
from distfusion.worker.feed_inbox import FeedInbox, RemoteWorkUnitFeed
from distfusion.worker.interrupt import Interruptible
from distfusion.worker.memory import SpillDirs, TaskMemory, default_memory_per_task_bytes
from distfusion.worker.stream_inputs import InputStreams
from distfusion.worker.task_output import TaskOutput

__all__ = ["Worker", "pulled_feed_chunks"]

_CANCELLED_KEPT = 4096

log = logging.getLogger("distfusion.worker")


@dataclass
class _Task:
    plan: TaskPlan
    output: TaskOutput
    done: threading.Event = field(default_factory=threading.Event)
    reads_left: list[int] = field(default_factory=list)  # reads not started, per partition
    reads_done: list[int] = field(default_factory=list)  # reads read to the end, per partition
    error: BaseException | None = None
    metrics: TaskMetrics | None = None  # rows and bytes per output partition among them
    running: Interruptible | None = None  # the thread running it, while it runs


CLOSE_WAIT_S = 1.0
"""Longest :meth:`Worker.close` waits for its threads to end, seconds: the task threads
end within 0.1 s of it (their waits are interruptible); the helper threads inside
DataFusion when their call returns (see :mod:`distfusion.worker.interrupt`)."""


class _TaskThreads:
    """A FIFO pool of ``n`` daemon threads running the tasks of one worker.

    Unlike ``ThreadPoolExecutor`` it can be joined with a bound, and an
    exiting interpreter does not join it (the workers are closed first, see
    :func:`_close_live_workers`).
    """

    def __init__(self, n: int, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.threads = [
            threading.Thread(target=self._loop, name=f"{name}_{i}", daemon=True) for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` in a thread of the pool, after what was submitted before."""
        if not self._closed:
            self._queue.put((fn, args))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._closed:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # a bug: the task's consumers learnt it failed already
                log.exception("a task thread failed")

    def close(self) -> None:
        """Drop what was not started; every thread ends after its current task."""
        self._closed = True
        for _ in self.threads:
            self._queue.put(None)


_LIVE: weakref.WeakSet[Worker] = weakref.WeakSet()


def _close_live_workers() -> None:
    """Close every worker of the process (interpreter exit): their tasks stop, nothing waits.

    The helpers still inside DataFusion then get a grace period
    (:func:`distfusion.worker.interrupt._wait_for_helpers`, run after this).
    """
    for worker in list(_LIVE):
        try:
            worker.close(wait_s=0.0)
        except Exception:  # exiting: a worker that cannot close leaves its threads
            log.debug("closing %r at exit failed", worker, exc_info=True)


# Run by threading._shutdown before Python finalizes, the last registered first: this
# hook (registered after the one of distfusion.worker.interrupt, imported above) stops
# every task before the helpers' grace period. Without it an interpreter exiting
# (Ctrl-C while a result was not being read) waited for its running tasks. A private
# hook of the threading module (used by concurrent.futures itself); atexit otherwise.
getattr(threading, "_register_atexit", atexit.register)(_close_live_workers)


class Worker:
    """Runs tasks in a thread pool and holds their output until it is read.

    Args:
        url: how this worker is named in task plans and errors (``local://0``).
        transport: used by tasks to read their inputs from producer tasks (any
            :class:`~distfusion.transport.base.WorkerTransport`).
        slots: tasks run at the same time (threads in the pool).
        input_timeout_s: longest a task waits for a producer task's plan
            before failing (its batches then come as it makes them); None
            waits as long as the query runs.
        memory_per_task_bytes: DataFusion memory pool of a task whose plan
            sets none, bytes; None: :func:`~distfusion.worker.memory.default_memory_per_task_bytes`
            of ``slots`` (half the machine's memory shared by the slots).
        output_memory_bytes: outputs held in memory by this worker past which
            finished outputs spill to disk, bytes; None:
            ``memory_per_task_bytes * slots``. After a task of a query that
            sets ``memory_per_task_bytes``, at most that budget times ``slots``.
        spill_dir: the directory this worker makes its spill directory in;
            None: the system's temp directory.

    Raises:
        ValueError: a budget is not positive.
    """

    def __init__(
        self,
        url: str,
        transport,
        slots: int = 1,
        input_timeout_s: float | None = None,
        memory_per_task_bytes: int | None = None,
        output_memory_bytes: int | None = None,
        spill_dir: str | None = None,
    ):
        for name, value in (
            ("memory_per_task_bytes", memory_per_task_bytes),
            ("output_memory_bytes", output_memory_bytes),
        ):
            if value is not None and value <= 0:
                msg = f"{name} must be positive, got {value}"
                raise ValueError(msg)
        self.url = url
        self.transport = transport
        self.input_timeout_s = input_timeout_s
        self.slots = max(1, slots)
        self.memory_per_task_bytes = memory_per_task_bytes or default_memory_per_task_bytes(
            self.slots
        )
        self.output_memory_bytes = output_memory_bytes or self.memory_per_task_bytes * self.slots
        self.spill = SpillDirs(spill_dir)
        self._pool = _TaskThreads(self.slots, f"distfusion-{url}")
        self._helpers: list[threading.Thread] = []  # helper threads of tasks that ran here
        self._lock = threading.Condition()
        self._tasks: dict[TaskKey, _Task] = {}
        # Recently cancelled query ids (insertion-ordered, bounded).
        self._cancelled: dict[str, None] = {}
        self._inboxes: dict[tuple[TaskKey, str], FeedInbox] = {}
        self._closed = False
        self._running = 0
        self._running_tasks: dict[TaskKey, _Task] = {}  # tasks whose thread runs them now
        # Cumulative since start: what DataFusion spilled, and outputs written to disk.
        self._spilled_bytes = 0
        self._spill_count = 0
        self._output_spilled_bytes = 0
        # query id -> (stage, task) -> metrics of every task that succeeded here;
        # kept until cancel_query (tasks whose output was read are gone from _tasks).
        self._metrics: dict[str, dict[tuple[int, int], TaskMetrics]] = {}
        _LIVE.add(self)

    # ---------------------------------------------------------------- protocol
    def set_plan(self, plan: TaskPlan) -> None:
        """Accept a task and queue it for execution (returns at once).

        Its output exists from now on: consumers may start reading it (they
        wait for its batches).
        """
        n = plan.output.num_partitions
        task = _Task(
            plan,
            self._task_output(plan),
            reads_left=[plan.output.readers] * n,
            reads_done=[0] * n,
        )
        with self._lock:
            self._tasks[plan.key] = task
            self._lock.notify_all()
        self._pool.submit(self._run, task)

    def execute_partition(
        self, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The batches of output ``partition`` of task ``key``, as the task produces them.

        Waits for the task's plan (at most ``timeout_s``), then returns an
        iterator that yields each batch as soon as the task added it and ends
        when the task finished (streamed exchange; the task may still be
        queued or running when this returns). Waits between batches have no
        bound: the producer's end, failure or cancellation ends them. The partition is freed once
        all its readers read it to the end, unless the plan says
        ``keep_output`` (then it is held until :meth:`cancel_query`).

        Raises:
            TaskError: the task failed (its own error, with stage, task,
                worker), here or while iterating.
            QueryCancelledError: the query was cancelled on this worker (here or
                while iterating).
            TimeoutError: ``timeout_s`` seconds passed without the plan arriving.
            KeyError: no such task or partition (already read by all its readers).
        """
        task = self._wait(key, timeout_s, done=False)
        with self._lock:
            if task.error is not None:
                raise task.error
            output = task.output
            if not 0 <= partition < output.num_partitions or task.reads_left[partition] <= 0:
                msg = f"partition {partition} of task {key} is not held by worker {self.url}"
                raise KeyError(msg)
            if not task.plan.keep_output:
                task.reads_left[partition] -= 1
        return self._stream(task, partition)

    def _stream(self, task: _Task, partition: int):
        qid = task.plan.key.query_id
        try:
            yield from task.output.stream(partition, lambda: self.is_cancelled(qid))
        except KeyError:  # freed under the reader: the query was cancelled
            raise QueryCancelledError(f"query {qid} was cancelled") from None
        if task.plan.keep_output:
            return
        with self._lock:
            task.reads_done[partition] += 1
            last = task.reads_done[partition] == task.plan.output.readers
            if task.done.is_set() and self._all_read(task):
                self._tasks.pop(task.plan.key, None)
        if last:
            task.output.free(partition)

    def task_stats(
        self, key: TaskKey, timeout_s: float | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """What task ``key`` produced, once it is done: rows and bytes per output partition.

        Blocks until the task finishes. Reads nothing and frees nothing.

        Returns:
            ``(partition_rows, partition_bytes)``, one entry per output
            partition each: rows, and Arrow bytes (``RecordBatch.nbytes``).

        Raises:
            TaskError: the task failed (its own error, with stage, task, worker).
            QueryCancelledError: the query was cancelled on this worker.
            TimeoutError: ``timeout_s`` seconds passed without the task finishing.
        """
        metrics = self.task_metrics(key, timeout_s)
        return metrics.partition_rows, metrics.partition_bytes

    def task_metrics(self, key: TaskKey, timeout_s: float | None = None) -> TaskMetrics:
        """The metrics of task ``key``, once it is done (blocks like :meth:`task_stats`).

        Raises:
            TaskError: the task failed.
            QueryCancelledError: the query was cancelled on this worker.
            TimeoutError: ``timeout_s`` seconds passed without the task finishing.
        """
        task = self._wait(key, timeout_s, done=True)
        with self._lock:
            if task.error is not None:
                raise task.error
            assert task.metrics is not None  # set with the output
            return task.metrics

    def query_metrics(self, query_id: str) -> list[TaskMetrics]:
        """Metrics of every task of ``query_id`` that finished here so far (no waiting).

        Kept until :meth:`cancel_query`; one list per call, in no fixed order.
        """
        with self._lock:
            return list(self._metrics.get(query_id, {}).values())

    def failed_tasks(self, query_id: str) -> list[TaskError]:
        """The errors of the tasks of ``query_id`` that failed here so far (no waiting).

        Cancelled tasks are not failed ones. The coordinator polls this to fail
        the query the moment one of its tasks does, rather than when a reader
        gets to the task's output (:class:`~distfusion.coordinator.query_run.WorkerQueryRun`).
        """
        with self._lock:
            return [
                t.error
                for k, t in self._tasks.items()
                if k.query_id == query_id and isinstance(t.error, TaskError)
            ]

    def receive_feed(self, key: TaskKey, table: str, units: Iterable[bytes]) -> None:
        """Take the feed of ``table`` for task ``key`` as the coordinator streams it.

        Called by a transport (in process, or a Flight ``DoPut``), possibly
        before the task's plan arrives. Blocks while the task's inbox is full
        (back-pressure); returns when the stream ended, or early when the task
        ended. ``units`` raising a FeedError or QueryCancelledError ends the stream
        with that error: the task raises it.

        Raises:
            QueryCancelledError: the query was cancelled while the stream blocked.
        """
        inbox = self._inbox(key, table)
        try:
            for raw in units:
                if not inbox.put(raw):
                    return
        except DistfusionError as exc:
            inbox.finish(exc)
            return
        except Exception as exc:  # the stream was cut or garbled: never a finished feed
            cause = f"the feed stream of {table!r} broke: {type(exc).__name__}: {exc}"
            inbox.finish(TaskError(key.stage_id, key.task_index, self.url, cause))
            return
        inbox.finish()

    def cancel_query(self, query_id: str) -> None:
        """Stop every task of ``query_id`` and drop all its state on this worker.

        Running tasks stop at DataFusion's next batch, or at their next pull
        of a streamed input (inside a hash join's build or an aggregate), or
        are interrupted where they wait in DataFusion (within about a second,
        :mod:`~distfusion.worker.interrupt`); readers of their outputs raise
        QueryCancelledError; the outputs and the query's spill directory are
        deleted. Returns without waiting.
        """
        outputs = []
        running = []
        with self._lock:
            for k in [k for k in self._inboxes if k[0].query_id == query_id]:
                self._inboxes.pop(k).close()
            self._cancelled[query_id] = None
            self._metrics.pop(query_id, None)
            while len(self._cancelled) > _CANCELLED_KEPT:
                del self._cancelled[next(iter(self._cancelled))]
            for key in [k for k in self._tasks if k.query_id == query_id]:
                task = self._tasks.pop(key)
                if not task.done.is_set():
                    task.error = QueryCancelledError(f"query {query_id} was cancelled")
                outputs.append(task.output)
            running = [
                t.running
                for t in self._running_tasks.values()
                if t.plan.key.query_id == query_id and t.running is not None
            ]
            self._lock.notify_all()
        for scope in running:
            scope.interrupt(QueryCancelledError(f"query {query_id} was cancelled"))
        for output in outputs:
            output.fail(QueryCancelledError(f"query {query_id} was cancelled"))
            output.close()
        self.spill.remove_query(query_id)

    def stats(self) -> dict:
        """What this worker holds now, and what it spilled since it started.

        Returns:
            ``{"live_tasks": tasks held (queued, running or with unread output),
            "running_tasks": tasks running now, "bytes_held": bytes of outputs
            held (in memory and on disk), "bytes_on_disk": bytes of the spilled
            outputs held, "spill_files": files under its spill directory now,
            "spilled_bytes": bytes DataFusion's operators spilled (cumulative),
            "spill_count": their spill events (cumulative),
            "output_spilled_bytes": bytes of outputs written to disk (cumulative),
            "memory_per_task_bytes": the default task budget}``.
        """
        with self._lock:
            outputs = [t.output for t in self._tasks.values()]
            on_disk = sum(o.spilled_bytes for o in outputs)
            in_memory = sum(o.held_bytes for o in outputs)
            stats = {
                "live_tasks": len(self._tasks),
                "running_tasks": self._running,
                "bytes_held": in_memory + on_disk,
                "bytes_on_disk": on_disk,
                "spilled_bytes": self._spilled_bytes,
                "spill_count": self._spill_count,
                "output_spilled_bytes": self._output_spilled_bytes,
                "memory_per_task_bytes": self.memory_per_task_bytes,
            }
        stats["spill_files"] = len(self.spill.files())
        return stats

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Cancel everything, stop the threads and delete the spill directory.

        Running tasks are interrupted where they wait (DataFusion's calls run
        in helper threads, :mod:`~distfusion.worker.interrupt`): their threads
        end at once. Waits at most ``wait_s`` seconds for them and for the
        helper threads; a helper inside a DataFusion call that yields nothing
        for longer is left to end with it (a daemon thread).
        """
        with self._lock:
            self._closed = True
            for qid in {k.query_id for k in self._tasks}:
                self._cancelled[qid] = None
            outputs = [t.output for t in self._tasks.values()]
            running = [t.running for t in self._running_tasks.values() if t.running is not None]
            self._tasks.clear()
            self._metrics.clear()
            self._lock.notify_all()
        _LIVE.discard(self)
        for scope in running:
            scope.interrupt(QueryCancelledError(f"worker {self.url} closed"))
        self._pool.close()
        for output in outputs:
            output.fail(QueryCancelledError(f"worker {self.url} closed"))
            output.close()
        self.join(wait_s)
        self.spill.close()

    def join(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` seconds for this closed worker's threads to end.

        Returns:
            Whether every task thread and helper thread ended.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = [*self._pool.threads, *self._helpers]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads if t is not threading.current_thread())

    # ---------------------------------------------------------------- internals
    def _wait(self, key: TaskKey, timeout_s: float | None, done: bool) -> _Task:
        """Task ``key`` once its plan arrived (``done``: once it finished)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while True:
                if key.query_id in self._cancelled or self._closed:
                    raise QueryCancelledError(f"query {key.query_id} was cancelled")
                task = self._tasks.get(key)
                if task is not None and (task.done.is_set() or not done):
                    return task
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    what = "finish" if done else "arrive"
                    msg = f"task {key} on worker {self.url} did not {what} within {timeout_s} s"
                    raise TimeoutError(msg)
                self._lock.wait(0.5 if remaining is None else min(0.5, remaining))

    def is_cancelled(self, query_id: str) -> bool:
        """Whether ``query_id`` was cancelled here (one of the last 4096), or the worker closed."""
        return self._closed or query_id in self._cancelled

    def _inbox(self, key: TaskKey, table: str) -> FeedInbox:
        """The inbox of ``table``'s feed for task ``key`` (made on first use)."""
        with self._lock:
            inbox = self._inboxes.get((key, table))
            if inbox is None:
                inbox = FeedInbox(cancelled=lambda: self.is_cancelled(key.query_id))
                task = self._tasks.get(key)
                if self.is_cancelled(key.query_id) or (task is not None and task.done.is_set()):
                    inbox.close()  # nobody will read it
                    return inbox
                self._inboxes[(key, table)] = inbox
            return inbox

    def _feed_chunks(self, plan: TaskPlan, share: ScanShare):
        """The units of feed scan ``share`` for ``plan``'s task, in chunks as they arrive."""
        if share.source.options.get("endpoint"):  # pulled: executors cannot be pushed to (Spark)
            return pulled_feed_chunks(plan.key, share, lambda: self.is_cancelled(plan.key.query_id))
        o = share.source.options
        inbox = self._inbox(plan.key, share.source.name)
        feed = RemoteWorkUnitFeed(o["feed_id"], share.source.name, plan.key.task_index, inbox)
        return feed.chunks()

    def _read_input(self, plan: TaskPlan, i: int) -> InputStreams:
        """Input ``i`` of ``plan``: one stream per producer partition, opened when pulled."""

        def opener(url: str, producer: TaskKey, part: int):
            return lambda: self.transport.execute_partition(
                url, producer, part, timeout_s=self.input_timeout_s
            )

        return InputStreams(opener(*read) for read in plan.input_reads(i))

    @staticmethod
    def _all_read(task: _Task) -> bool:
        """Whether every partition of ``task`` was read to the end by all its readers."""
        readers = task.plan.output.readers
        return not task.plan.keep_output and all(d >= readers for d in task.reads_done)

    def _task_output(self, plan: TaskPlan) -> TaskOutput:
        """An empty output for ``plan``'s task, spilling in its query's spill directory."""
        key = plan.key
        budget = plan.memory_per_task_bytes or self.memory_per_task_bytes

        def spill_path(p: int) -> str:
            directory = self.spill.query_dir(key.query_id)
            return os.path.join(directory, f"s{key.stage_id}-t{key.task_index}-p{p}.arrow")

        return TaskOutput(plan.output.num_partitions, spill_path, budget)

    def task_memory(self, plan: TaskPlan) -> TaskMemory:
        """The memory pool of ``plan``'s task: its budget, spilling under its query's directory."""
        budget = plan.memory_per_task_bytes or self.memory_per_task_bytes
        return TaskMemory(budget, self.spill.query_dir(plan.key.query_id))

    def _run(self, task: _Task) -> None:
        with Interruptible() as running:
            with self._lock:
                task.running = running
                self._running_tasks[task.plan.key] = task
            try:
                self._run_task(task)
            finally:
                with self._lock:
                    self._running_tasks.pop(task.plan.key, None)
                    task.running = None
                    alive = [t for t in self._helpers + running.helpers if t.is_alive()]
                    self._helpers = alive

    def _run_task(self, task: _Task) -> None:
        plan = task.plan
        key = plan.key
        qid = key.query_id
        output = task.output
        with self._lock:
            self._running += 1
        finished = False
        try:
            if self.is_cancelled(qid):
                raise QueryCancelledError(f"query {qid} was cancelled")
            memory = self.task_memory(plan)
            meter = task_meter(plan, self.url)
            metrics = run_task_into(
                output,
                plan,
                lambda i: self._read_input(plan, i),
                cancelled=lambda: self.is_cancelled(qid),
                worker=self.url,
                feed_chunks=lambda share: self._feed_chunks(plan, share),
                memory=memory,
                meter=meter,
            )
            output.finish()
            finished = True
            task_metrics = meter.finish(sizes=(tuple(output.rows), tuple(output.nbytes)))
            with self._lock:
                task.metrics = task_metrics
                self._spilled_bytes += metrics.spilled_bytes
                self._spill_count += metrics.spill_count
                self._output_spilled_bytes += output.spilled_bytes
                if not self.is_cancelled(qid):
                    at = (plan.key.stage_id, plan.key.task_index)
                    self._metrics.setdefault(qid, {})[at] = task_metrics
        except QueryCancelledError as exc:
            # Without its traceback: the frames it holds keep the task's DataFusion
            # plan alive, and with it the partition tasks DataFusion spawned.
            task.error = exc.with_traceback(None)
        except TaskError as exc:
            task.error = exc
        except BaseException as exc:  # reading an input failed, a bug, a native panic
            task.error = task_error(key.stage_id, key.task_index, self.url, exc)
            if not is_task_failure(exc):  # its consumers still learn it failed (finally)
                raise
        finally:
            if task.error is None and not finished:  # never leave consumers waiting
                ended = RuntimeError("the task ended before its output was finished")
                task.error = task_error(key.stage_id, key.task_index, self.url, ended)
            with self._lock:
                self._running -= 1
                for k in [k for k in self._inboxes if k[0] == key]:
                    self._inboxes.pop(k).close()
                task.done.set()
                cancelled = self.is_cancelled(qid)
                if cancelled or self._all_read(task):
                    self._tasks.pop(key, None)
                self._lock.notify_all()
            if task.error is not None:
                output.fail(task.error)
            if task.error is not None or cancelled:
                output.close()
            if cancelled:  # cancel_query may have run while this task still wrote
                self.spill.remove_query(qid)
            elif task.error is None:
                self._limit_outputs_held(self._output_limit(plan))

    def _output_limit(self, plan: TaskPlan) -> int:
        """Bytes of outputs held in memory past which finished ones spill, after ``plan``'s task.

        ``output_memory_bytes``; for a query that sets ``memory_per_task_bytes``,
        no more than that budget times the slots (the budget bounds the query
        on this worker: a worker's default is sized for the machine).
        """
        if plan.memory_per_task_bytes is None:
            return self.output_memory_bytes
        return min(self.output_memory_bytes, plan.memory_per_task_bytes * self.slots)

    def _limit_outputs_held(self, limit: int) -> None:
        """Spill finished outputs, largest first, while those held pass ``limit`` bytes."""
        with self._lock:
            outputs = [t.output for t in self._tasks.values()]
        held = sum(o.held_bytes for o in outputs)
        if held <= limit:
            return
        for output in sorted(outputs, key=lambda o: o.held_bytes, reverse=True):
            try:
                before = output.spilled_bytes
                held -= output.spill()
                with self._lock:
                    self._output_spilled_bytes += output.spilled_bytes - before
            except OSError as exc:  # disk full: keep it in memory
                log.warning("worker %s: cannot spill a task output: %s", self.url, exc)
                return
            if held <= limit:
                return


def pulled_feed_chunks(
    key: TaskKey, share: ScanShare, cancelled: Callable[[], bool] = lambda: False
) -> Iterator[list[WorkUnit]]:
    """Units of feed scan ``share`` for task ``key``, pulled from the coordinator's feed endpoint.

    ``share.source.options`` names the endpoint and the query's secret (set by
    the Spark runtime). A thread pulls into a bounded inbox; the task takes
    chunks as they arrive.

    Raises:
        FeedError: (while iterating) the endpoint cannot be reached or refused
            the secret (the message names the endpoint, the feed and the
            partition), or the provider failed.
    """
    o = share.source.options
    inbox = FeedInbox(cancelled=cancelled)
    feed = RemoteWorkUnitFeed(o["feed_id"], share.source.name, key.task_index, inbox)
    threading.Thread(
        target=pull_feed,
        args=(o["endpoint"], o.get("secret", ""), key, share.source.name, feed),
        kwargs={"tls_root": o.get("endpoint_tls_root"), "tls_name": o.get("endpoint_tls_name")},
        name=f"distfusion-feed-pull-{key}",
        daemon=True,
    ).start()
    try:
        yield from feed.chunks()
    finally:
        inbox.close()
