"""The WorkerTransport protocol: how the coordinator and tasks talk to workers.

The split point is low and mirrors the worker protocol, so planning and stage
execution never know which transport runs:

=====================  ======================================================
``set_plan``           deliver one task's plan to a worker; it starts the task
``execute_partition``  read one output partition of a task as Arrow batches, as made
``task_stats``         wait for a task; rows and bytes of each output partition
``stream_feed``        stream a work unit feed's partition to the leaf task reading it
``cancel_query``       stop every task of a query on a worker, free its state
``stats``              live tasks and bytes a worker holds
=====================  ======================================================

Optional abilities, each a protocol of its own that a transport declares by
having its method (``isinstance(transport, ReportsQueryMetrics)``): the
coordinator (:class:`~distfusion.coordinator.query_run.WorkerQueryRun`) uses
an ability a transport has and does without it otherwise:

========================  ===================================================
:class:`ReportsFailedTasks`   ``failed_tasks``: failed tasks of a query, polled while
                              it runs; without: a failure surfaces when a reader
                              reaches its output
:class:`ReportsQueryMetrics`  ``query_metrics``: metrics of every task of a query a
                              worker finished; without: the tasks have no metrics
:class:`AbortsReads`          ``abort_query``: end this process's reads of a query's
                              streams at once (Flight); without: they end with
                              ``cancel_query``
:class:`WritesParts`          ``write_part``: a worker writes one head part of a
                              ``write_*`` (Flight), with the query's object stores;
                              without: the parts run in the coordinator's threads
========================  ===================================================

Implementations: :class:`~distfusion.transport.in_memory.InMemoryTransport`
(workers in this process) and the Arrow Flight transport (workers over gRPC).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import pyarrow as pa

from distfusion.errors import TaskError
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.task_plan import TaskKey, TaskPlan

__all__ = [
    "AbortsReads",
    "ReportsFailedTasks",
    "ReportsQueryMetrics",
    "WorkerTransport",
    "WritesParts",
]


@runtime_checkable
class WorkerTransport(Protocol):
    """Delivers task plans to workers and reads task output partitions back."""

    def set_plan(self, url: str, plan: TaskPlan) -> None:
        """Deliver ``plan`` to the worker at ``url``, which queues the task.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
        """
        ...

    def execute_partition(
        self, url: str, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream output ``partition`` of task ``key`` from the worker at ``url``.

        Streamed exchange: waits for the task's plan (at most ``timeout_s``
        seconds when given), then yields each batch as the task produces it
        (the task may still run) and ends when the task ends. Errors come
        here or while iterating.

        Raises:
            TaskError: the task failed; stage, task, worker and cause are kept.
            QueryCancelledError: the query was cancelled.
            TimeoutError: the task's plan did not arrive within ``timeout_s``.
            WorkerUnavailableError: the worker cannot be reached.
        """
        ...

    def task_stats(
        self, url: str, key: TaskKey, timeout_s: float | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Wait for task ``key`` on the worker at ``url``; what it produced.

        Used by :class:`~distfusion.coordinator.query_run.QueryRun` to measure a
        finished stage (adaptive execution). Reads and frees nothing.
        Waits for the task to finish (at most ``timeout_s`` seconds when given).

        Returns:
            ``(partition_rows, partition_bytes)``, one entry per output
            partition of the task each: rows, and Arrow bytes
            (``RecordBatch.nbytes``).

        Raises:
            TaskError: the task failed; stage, task, worker and cause are kept.
            QueryCancelledError: the query was cancelled.
            TimeoutError: the task did not finish within ``timeout_s`` seconds.
            WorkerUnavailableError: the worker cannot be reached.
        """
        ...

    def stream_feed(self, url: str, key: TaskKey, table: str, units: Iterator[bytes]) -> None:
        """Stream the feed of ``table`` to task ``key`` on the worker at ``url``.

        The coordinator pushes: ``units`` are serialised work units
        (:meth:`WorkUnit.to_bytes`) of partition ``key.task_index``, read from
        the coordinator's feed session as the provider yields them. Blocks
        until ``units`` ends, the worker stops taking units (the task ended),
        or the worker's bounded inbox applies back-pressure for as long as the
        task reads slowly. When ``units`` raises a FeedError or
        QueryCancelledError, the stream ends with that error and the task raises it.
        The worker may get the stream before the task's plan.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            QueryCancelledError: the query was cancelled on the worker.
        """
        ...

    def cancel_query(self, url: str, query_id: str) -> None:
        """Stop the tasks of ``query_id`` on the worker at ``url`` and free its state.

        Idempotent; a worker that cannot be reached is ignored (it frees the
        state itself after a time-to-live).
        """
        ...

    def stats(self, url: str) -> dict:
        """``{"live_tasks": int, "bytes_held": int}`` of the worker at ``url``."""
        ...


@runtime_checkable
class ReportsQueryMetrics(Protocol):
    """A transport that reads the metrics of a query's finished tasks (optional ability)."""

    def query_metrics(self, url: str, query_id: str) -> list[TaskMetrics]:
        """Metrics of every task of ``query_id`` the worker at ``url`` finished so far.

        Does not wait. The coordinator asks each worker once, when a query
        ends (before ``cancel_query``, which drops them), and, while a
        progress display is on, about once a second.

        Returns:
            One :class:`~distfusion.metrics.TaskMetrics` per task, in no fixed order.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            TransportError: the worker's answer is not a list of metrics.
        """
        ...


@runtime_checkable
class ReportsFailedTasks(Protocol):
    """A transport the coordinator polls for a query's failed tasks (optional ability)."""

    def failed_tasks(self, url: str, query_id: str) -> list[TaskError]:
        """The errors of the tasks of ``query_id`` that failed on the worker at ``url`` so far.

        Does not wait. The coordinator polls it while a query runs
        (:data:`~distfusion.coordinator.query_run.FAILURE_POLL_S`) and fails the query
        with the first error found: the query's other tasks are cancelled at
        once rather than when a reader gets to the failed task's output.
        Without it the failures are left to the readers.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
        """
        ...


@runtime_checkable
class AbortsReads(Protocol):
    """A transport that ends this process's reads of a query at once (optional ability)."""

    def abort_query(self, query_id: str, error: Exception) -> None:
        """Make every read of ``query_id`` through this transport raise ``error``.

        The coordinator calls it when a query closes, before ``cancel_query``:
        reads blocked on a stream of a worker that died end now, not when the
        worker's stream times out.
        """
        ...


@runtime_checkable
class WritesParts(Protocol):
    """A transport whose workers write head parts of a ``write_*`` (optional ability)."""

    def write_part(
        self,
        url: str,
        body: str,
        what: str,
        query_id: str = "",
        stores: tuple = (),
    ) -> list[dict]:
        """Have the worker at ``url`` run a head part and write its rows; the files written.

        ``body``: the part and the write's spec as JSON; ``what`` names the
        part in errors; ``stores``: the query's object stores, by URL prefix.

        Raises:
            TaskError: the worker failed to write the part.
            WorkerUnavailableError: the worker cannot be reached.
        """
        ...
