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

Tasks run in a FIFO thread pool of ``slots`` threads. A task blocks while it
reads its inputs from producer tasks; the coordinator submits every task of a
stage before any task of a later stage, so with FIFO pools the earliest
unfinished task always holds a thread and can make progress: no deadlock, even
with one slot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from distfusion.errors import DistfusionError, QueryCancelled, TaskError
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import task_error
from distfusion.protocol.task_plan import ScanShare, TaskKey, TaskPlan
from distfusion.transport.feed_endpoint import pull_feed
from distfusion.work_unit_feed.unit import WorkUnit
from distfusion.worker.execute_task import run_task
from distfusion.worker.feed_inbox import FeedInbox, RemoteWorkUnitFeed

__all__ = ["Worker", "pulled_feed_chunks"]

_CANCELLED_KEPT = 4096


@dataclass
class _Task:
    plan: TaskPlan
    done: threading.Event = field(default_factory=threading.Event)
    partitions: list[list[pa.RecordBatch]] | None = None
    reads_left: list[int] = field(default_factory=list)
    error: BaseException | None = None
    partition_rows: tuple[int, ...] = ()
    partition_bytes: tuple[int, ...] = ()
    metrics: TaskMetrics | None = None


class Worker:
    """Runs tasks in a thread pool and holds their output until it is read.

    Args:
        url: how this worker is named in task plans and errors (``local://0``).
        transport: used by tasks to read their inputs from producer tasks (any
            :class:`~distfusion.transport.base.WorkerTransport`).
        slots: tasks run at the same time (threads in the pool).
        input_timeout_s: longest a task waits for a producer partition before
            failing; None waits as long as the producer runs.
    """

    def __init__(self, url: str, transport, slots: int = 1, input_timeout_s: float | None = None):
        self.url = url
        self.transport = transport
        self.input_timeout_s = input_timeout_s
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, slots), thread_name_prefix=f"distfusion-{url}"
        )
        self._lock = threading.Condition()
        self._tasks: dict[TaskKey, _Task] = {}
        # Recently cancelled query ids (insertion-ordered, bounded).
        self._cancelled: dict[str, None] = {}
        self._inboxes: dict[tuple[TaskKey, str], FeedInbox] = {}
        # query id -> (stage, task) -> metrics of every task that succeeded here;
        # kept until cancel_query (tasks whose output was read are gone from _tasks).
        self._metrics: dict[str, dict[tuple[int, int], TaskMetrics]] = {}

    # ---------------------------------------------------------------- protocol
    def set_plan(self, plan: TaskPlan) -> None:
        """Accept a task and queue it for execution (returns at once)."""
        task = _Task(plan, reads_left=[plan.output.readers] * plan.output.num_partitions)
        with self._lock:
            self._tasks[plan.key] = task
            self._lock.notify_all()
        self._pool.submit(self._run, task)

    def execute_partition(
        self, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The batches of output ``partition`` of task ``key``, once the task is done.

        Blocks until the task finishes. The partition is freed after it has been
        read by all its readers, unless the plan says ``keep_output`` (then it
        is held until :meth:`cancel_query`).

        Raises:
            TaskError: the task failed (its own error, with stage, task, worker).
            QueryCancelled: the query was cancelled on this worker.
            TimeoutError: ``timeout_s`` seconds passed without the task finishing.
            KeyError: no such task or partition (already read by all its readers).
        """
        task = self._wait(key, timeout_s)
        with self._lock:
            if task.error is not None:
                raise task.error
            if (
                task.partitions is None
                or not 0 <= partition < len(task.partitions)
                or task.reads_left[partition] <= 0
            ):
                msg = f"partition {partition} of task {key} is not held by worker {self.url}"
                raise KeyError(msg)
            batches = task.partitions[partition]
            if task.plan.keep_output:
                return iter(batches)
            task.reads_left[partition] -= 1
            if task.reads_left[partition] == 0:
                task.partitions[partition] = []
            if not any(task.reads_left):
                self._tasks.pop(key, None)
        return iter(batches)

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
            QueryCancelled: the query was cancelled on this worker.
            TimeoutError: ``timeout_s`` seconds passed without the task finishing.
        """
        task = self._wait(key, timeout_s)
        with self._lock:
            if task.error is not None:
                raise task.error
            return task.partition_rows, task.partition_bytes

    def task_metrics(self, key: TaskKey, timeout_s: float | None = None) -> TaskMetrics:
        """The metrics of task ``key``, once it is done (blocks like :meth:`task_stats`).

        Raises:
            TaskError: the task failed.
            QueryCancelled: the query was cancelled on this worker.
            TimeoutError: ``timeout_s`` seconds passed without the task finishing.
        """
        task = self._wait(key, timeout_s)
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

    def receive_feed(self, key: TaskKey, table: str, units: Iterable[bytes]) -> None:
        """Take the feed of ``table`` for task ``key`` as the coordinator streams it.

        Called by a transport (in process, or a Flight ``DoPut``), possibly
        before the task's plan arrives. Blocks while the task's inbox is full
        (back-pressure); returns when the stream ended, or early when the task
        ended. ``units`` raising a FeedError or QueryCancelled ends the stream
        with that error: the task raises it.

        Raises:
            QueryCancelled: the query was cancelled while the stream blocked.
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
        """Stop every task of ``query_id`` and drop all its state on this worker."""
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
                    task.error = QueryCancelled(f"query {query_id} was cancelled")
            self._lock.notify_all()

    def stats(self) -> dict:
        """``{"live_tasks": tasks held (queued, running or with unread output), "bytes_held": bytes}``."""
        with self._lock:
            held = sum(
                b.nbytes for t in self._tasks.values() for p in (t.partitions or []) for b in p
            )
            return {"live_tasks": len(self._tasks), "bytes_held": held}

    def close(self) -> None:
        """Cancel everything and stop the thread pool."""
        with self._lock:
            for qid in {k.query_id for k in self._tasks}:
                self._cancelled[qid] = None
            self._tasks.clear()
            self._metrics.clear()
            self._lock.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- internals
    def _wait(self, key: TaskKey, timeout_s: float | None) -> _Task:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while True:
                if key.query_id in self._cancelled:
                    raise QueryCancelled(f"query {key.query_id} was cancelled")
                task = self._tasks.get(key)
                if task is not None and task.done.is_set():
                    return task
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    msg = f"task {key} on worker {self.url} did not finish within {timeout_s} s"
                    raise TimeoutError(msg)
                self._lock.wait(0.5 if remaining is None else min(0.5, remaining))

    def is_cancelled(self, query_id: str) -> bool:
        """Whether ``query_id`` was cancelled here (the last 4096 cancelled queries)."""
        return query_id in self._cancelled

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
            return pulled_feed_chunks(
                plan.key, share, lambda: self.is_cancelled(plan.key.query_id)
            )
        o = share.source.options
        inbox = self._inbox(plan.key, share.source.name)
        feed = RemoteWorkUnitFeed(o["feed_id"], share.source.name, plan.key.task_index, inbox)
        return feed.chunks()

    def _read_input(self, plan: TaskPlan, i: int) -> list[pa.RecordBatch]:
        batches: list[pa.RecordBatch] = []
        for url, producer, part in plan.input_reads(i):
            batches.extend(
                self.transport.execute_partition(
                    url, producer, part, timeout_s=self.input_timeout_s
                )
            )
        return batches

    def _run(self, task: _Task) -> None:
        plan = task.plan
        qid = plan.key.query_id
        try:
            if self.is_cancelled(qid):
                raise QueryCancelled(f"query {qid} was cancelled")
            measured: list[TaskMetrics] = []
            partitions = run_task(
                plan,
                lambda i: self._read_input(plan, i),
                cancelled=lambda: self.is_cancelled(qid),
                worker=self.url,
                feed_chunks=lambda share: self._feed_chunks(plan, share),
                on_metrics=measured.append,
            )
            (metrics,) = measured
            with self._lock:
                task.partitions = partitions
                task.partition_rows = metrics.partition_rows
                task.partition_bytes = metrics.partition_bytes
                task.metrics = metrics
                if not self.is_cancelled(qid):
                    key = (plan.key.stage_id, plan.key.task_index)
                    self._metrics.setdefault(qid, {})[key] = metrics
        except (TaskError, QueryCancelled) as exc:
            task.error = exc
        except Exception as exc:  # reading an input failed, or a bug: name the task
            task.error = task_error(plan.key.stage_id, plan.key.task_index, self.url, exc)
        finally:
            with self._lock:
                for k in [k for k in self._inboxes if k[0] == plan.key]:
                    self._inboxes.pop(k).close()
                task.done.set()
                if self.is_cancelled(qid):
                    self._tasks.pop(plan.key, None)
                self._lock.notify_all()


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
        name=f"distfusion-feed-pull-{key}",
        daemon=True,
    ).start()
    try:
        yield from feed.chunks()
    finally:
        inbox.close()
