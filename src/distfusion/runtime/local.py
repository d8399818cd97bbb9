"""The in-process runtime: workers are thread pools in this process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pyarrow as pa

from distfusion.coordinator.query_run import (
    Routing,
    RuntimeProfile,
    WorkerQueryRun,
    execute_graph,
    round_robin,
)
from distfusion.planner.config import in_place_bytes
from distfusion.stages import StageGraph
from distfusion.transport.in_memory import InMemoryTransport
from distfusion.worker.memory import default_memory_per_task_bytes
from distfusion.worker.worker import CLOSE_WAIT_S, Worker

__all__ = ["LocalRuntime"]


class LocalRuntime:
    """Runs stage graphs on ``workers`` in-process workers.

    Each worker is a FIFO pool of ``slots`` threads reached through an
    :class:`~distfusion.transport.in_memory.InMemoryTransport` by the URL
    ``local://i``; DataFusion releases the GIL while it executes, so tasks on
    different workers run in parallel. Batches move between stages by reference.

    Args:
        workers: number of workers (default: the machine's cores). Caps the tasks
            of every stage.
        slots: tasks one worker runs at the same time.
        target_partitions: DataFusion threads per task (default: the cores).
        routing: assigns tasks to workers (default round-robin).
        memory_per_task_bytes: DataFusion memory pool of a task whose query
            sets none (``DistributedConfig.memory_per_task_bytes``), bytes;
            None: half of the machine's memory shared by every slot of every
            worker (:func:`~distfusion.worker.memory.default_memory_per_task_bytes`).
            Each worker also keeps at most ``memory_per_task_bytes * slots``
            of task outputs in memory; more spills to disk.
        spill_dir: where the workers make their spill directories (one each;
            deleted by :meth:`close`); None: the system's temp directory.

    Raises:
        ValueError: ``workers`` or ``slots`` is below 1, or a budget is not positive.
    """

    name = "local"

    def __init__(
        self,
        workers: int | None = None,
        slots: int = 1,
        target_partitions: int | None = None,
        routing: Routing = round_robin,
        memory_per_task_bytes: int | None = None,
        spill_dir: str | None = None,
    ) -> None:
        workers = workers if workers is not None else (os.cpu_count() or 1)
        if workers < 1 or slots < 1:
            msg = f"LocalRuntime needs workers >= 1 and slots >= 1, got {workers} and {slots}"
            raise ValueError(msg)
        self.memory_per_task_bytes = memory_per_task_bytes or default_memory_per_task_bytes(
            workers * slots
        )
        self.transport = InMemoryTransport()
        self.urls = [f"local://{i}" for i in range(workers)]
        for url in self.urls:
            worker = Worker(
                url,
                self.transport,
                slots=slots,
                memory_per_task_bytes=self.memory_per_task_bytes,
                spill_dir=spill_dir,
            )
            self.transport.add_worker(worker)
        self.target_partitions = target_partitions
        self.routing = routing

    def profile(self) -> RuntimeProfile:
        """See :meth:`Runtime.profile`: its tasks' memory budget; in place up to 320 MiB a core.

        Its workers are threads of this process, sharing its cores: a query
        reading at most :func:`~distfusion.planner.config.in_place_bytes` runs
        in place, as single-node DataFusion (distributing it would add no core,
        only its fixed cost).
        """
        return RuntimeProfile(
            task_memory_bytes=self.memory_per_task_bytes, in_place_bytes=in_place_bytes()
        )

    def num_workers(self) -> int:
        """The number of in-process workers."""
        return len(self.urls)

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """See :meth:`Runtime.execute`."""
        return execute_graph(graph, self.transport, self.urls, self.routing, self.target_partitions)

    def start_query(self, query_id: str) -> WorkerQueryRun:
        """See :meth:`Runtime.start_query`: a run on these workers keeping every output."""
        return WorkerQueryRun(
            query_id, self.transport, self.urls, self.routing, self.target_partitions
        )

    def stats(self) -> dict[str, dict]:
        """Live tasks and bytes held, per worker URL (zero between queries)."""
        return {url: self.transport.stats(url) for url in self.urls}

    def close(self) -> None:
        """Stop every worker's threads; waits at most ``CLOSE_WAIT_S`` seconds in all.

        Running tasks are interrupted (their threads end at once); a call into
        DataFusion that yields nothing for longer is left to end on its own
        (see :mod:`distfusion.worker.interrupt`).
        """
        deadline = time.monotonic() + CLOSE_WAIT_S
        workers = list(self.transport.workers.values())
        for worker in workers:
            worker.close(wait_s=0.0)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def __repr__(self) -> str:
        return f"LocalRuntime(workers={len(self.urls)})"
