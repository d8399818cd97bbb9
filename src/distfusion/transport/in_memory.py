"""WorkerTransport for workers living in this process (the local runtime)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from distfusion.errors import WorkerUnavailableError
from distfusion.stages import TaskKey
from distfusion.worker.task_plan import TaskPlan
from distfusion.worker.worker import Worker

__all__ = ["InMemoryTransport"]


class InMemoryTransport:
    """Calls :class:`~distfusion.worker.worker.Worker` objects directly, by URL.

    Batches are passed by reference (no serialisation), so the in-process
    runtime pays no network cost; everything else follows the protocol of
    :class:`~distfusion.transport.base.WorkerTransport`.
    """

    def __init__(self) -> None:
        self.workers: dict[str, Worker] = {}

    def add_worker(self, worker: Worker) -> None:
        """Make ``worker`` reachable at ``worker.url``."""
        self.workers[worker.url] = worker

    def _worker(self, url: str) -> Worker:
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

    def cancel_query(self, url: str, query_id: str) -> None:
        """See :meth:`WorkerTransport.cancel_query`."""
        worker = self.workers.get(url)
        if worker is not None:
            worker.cancel_query(query_id)

    def stats(self, url: str) -> dict:
        """See :meth:`WorkerTransport.stats`."""
        return self._worker(url).stats()
