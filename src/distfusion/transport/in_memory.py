"""WorkerTransport for workers living in this process (the local runtime)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import pyarrow as pa

from distfusion.errors import WorkerUnavailableError
from distfusion.protocol.task_plan import TaskKey, TaskPlan

__all__ = ["InMemoryTransport", "LocalWorker"]


class LocalWorker(Protocol):
    """What the transport calls on a worker of this process.

    :class:`~distfusion.worker.worker.Worker` implements it; the transport does
    not import it (``transport/`` sits below ``worker/``, see docs/architecture.md).
    """

    url: str

    def set_plan(self, plan: TaskPlan) -> None: ...  # noqa: D102

    def execute_partition(  # noqa: D102
        self, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]: ...

    def task_stats(  # noqa: D102
        self, key: TaskKey, timeout_s: float | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]: ...

    def query_metrics(self, query_id: str) -> list: ...  # noqa: D102

    def failed_tasks(self, query_id: str) -> list: ...  # noqa: D102

    def receive_feed(  # noqa: D102
        self, key: TaskKey, table: str, units: Iterator[bytes]
    ) -> None: ...

    def cancel_query(self, query_id: str) -> None: ...  # noqa: D102

    def stats(self) -> dict: ...  # noqa: D102

    def close(self, wait_s: float = ...) -> None: ...  # noqa: D102

    def join(self, timeout_s: float) -> bool: ...  # noqa: D102


class InMemoryTransport:
    """Calls :class:`LocalWorker` objects directly, by URL.

    Batches are passed by reference (no serialisation), so the in-process
    runtime pays no network cost; everything else follows the protocol of
    :class:`~distfusion.transport.base.WorkerTransport`.
    """

    def __init__(self) -> None:
        self.workers: dict[str, LocalWorker] = {}

    def add_worker(self, worker: LocalWorker) -> None:
        """Make ``worker`` reachable at ``worker.url``."""
        self.workers[worker.url] = worker

    def _worker(self, url: str) -> LocalWorker:
        try:
            return self.workers[url]
        except KeyError:
            raise WorkerUnavailableError(url, "no in-process worker has this URL") from None

    def set_plan(self, url: str, plan: TaskPlan) -> None:
        """See :meth:`WorkerTransport.set_plan`."""
        self._worker(url).set_plan(plan)

    def execute_partition(
        self, url: str, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]:
        """See :meth:`WorkerTransport.execute_partition`."""
        return self._worker(url).execute_partition(key, partition, timeout_s)

    def task_stats(
        self, url: str, key: TaskKey, timeout_s: float | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """See :meth:`WorkerTransport.task_stats`."""
        return self._worker(url).task_stats(key, timeout_s)

    def query_metrics(self, url: str, query_id: str) -> list:
        """See :meth:`WorkerTransport.query_metrics` (the worker's own objects)."""
        return self._worker(url).query_metrics(query_id)

    def failed_tasks(self, url: str, query_id: str) -> list:
        """See :meth:`WorkerTransport.failed_tasks` (the worker's own error objects)."""
        return self._worker(url).failed_tasks(query_id)

    def stream_feed(self, url: str, key: TaskKey, table: str, units: Iterator[bytes]) -> None:
        """See :meth:`WorkerTransport.stream_feed` (the inbox is a bounded in-process queue)."""
        self._worker(url).receive_feed(key, table, units)

    def cancel_query(self, url: str, query_id: str) -> None:
        """See :meth:`WorkerTransport.cancel_query`."""
        worker = self.workers.get(url)
        if worker is not None:
            worker.cancel_query(query_id)

    def stats(self, url: str) -> dict:
        """See :meth:`WorkerTransport.stats`."""
        return self._worker(url).stats()
