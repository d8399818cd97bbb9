"""What every runtime provides, and the coordinator loop shared by worker runtimes.

```
coordinator                                   workers (via a WorkerTransport)
  assign each task a worker URL (routing)
  set_plan(task) for every task, ────────────> tasks queue, run, read inputs
    stage by stage, producers first               from producer tasks, hold output
  head stage: read its inputs  <────────────── execute_partition(task, partition)
    run the fragment here, stream batches
  finally: cancel_query on every worker ─────> free whatever is left
```
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa

from distfusion.stages import Stage, StageGraph
from distfusion.transport.base import WorkerTransport
from distfusion.worker.execute_task import stream_head_stage
from distfusion.worker.task_plan import TaskPlan

__all__ = [
    "Runtime",
    "QueryRun",
    "StageStats",
    "Routing",
    "round_robin",
    "execute_graph",
    "task_threads",
]


@dataclass(frozen=True)
class StageStats:
    """What a finished stage produced, measured on the workers.

    Adaptive execution plans the rest of a query with these figures instead
    of estimates (Spark's AQE reads ``MapOutputStatistics`` the same way).

    Attributes:
        stage_id: the stage.
        partition_rows: rows of each output partition, summed over the tasks
            (``len == stage.output.num_partitions``).
        partition_bytes: Arrow bytes (``RecordBatch.nbytes``, the in-memory
            size estimates also use) of each output partition, summed over
            the tasks.
        elapsed_s: wall seconds from the stage's start to its last task's end.
    """

    stage_id: int
    partition_rows: tuple[int, ...]
    partition_bytes: tuple[int, ...]
    elapsed_s: float = 0.0

    @property
    def rows(self) -> int:
        """Rows of the whole output."""
        return sum(self.partition_rows)

    @property
    def bytes(self) -> int:
        """Arrow bytes of the whole output."""
        return sum(self.partition_bytes)


@runtime_checkable
class QueryRun(Protocol):
    """One query's execution on a runtime, stage by stage (adaptive execution).

    ```
    run = runtime.start_query(query_id)
    stats = run.run_stages(graph_1, [1, 2])     # run stages 1 and 2, keep outputs
    ...                                         # plan again with stats
    for batch in run.stream_head(graph_2): ...  # the rest, then the head stage
    run.close()                                 # free every output of the query
    ```

    Stage ids stay valid across graphs: a stage that ran keeps its id, output
    and workers in every later graph of the query, where consumers may read it
    differently than first planned (a shuffle output read as a broadcast, its
    partitions coalesced into fewer tasks, see :attr:`StageInput.groups`).
    """

    def run_stages(self, graph: StageGraph, stage_ids: list[int]) -> dict[int, StageStats]:
        """Run the stages ``stage_ids`` of ``graph`` and wait for them to finish.

        Every input of those stages ran in an earlier call or is in
        ``stage_ids`` (producers first). Outputs are kept until :meth:`close`.

        Returns:
            Stage id -> its :class:`StageStats`.

        Raises:
            TaskError: a task failed (names the stage, the task and the worker).
            TransportError: a worker could not be reached.
        """
        ...

    def stream_head(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """Run the stages of ``graph`` that have not run yet, then the head stage.

        Yields the head stage's batches. Raises as :meth:`run_stages`.
        """
        ...

    def close(self) -> None:
        """Cancel whatever still runs and free every output of the query. Idempotent."""
        ...


Routing = Callable[[StageGraph, list[str]], dict[tuple[int, int], str]]
"""Assigns every non-head task ``(stage_id, task_index)`` a worker URL."""


@runtime_checkable
class Runtime(Protocol):
    """Runs a :class:`StageGraph` and streams the head stage's batches."""

    def num_workers(self) -> int:
        """Workers available now; caps the tasks per stage during planning.

        Raises:
            PlanningError: no worker is available.
        """
        ...

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """Run ``graph``; yields the result batches.

        Closing the iterator early cancels every task of the query.

        Raises:
            TaskError: a task failed (names the stage, the task and the worker).
            TransportError: a worker could not be reached.
        """
        ...

    def start_query(self, query_id: str) -> QueryRun:
        """Start running query ``query_id`` stage by stage (see :class:`QueryRun`)."""
        ...

    def close(self) -> None:
        """Release the runtime's threads, processes or sessions."""
        ...


def round_robin(graph: StageGraph, urls: list[str]) -> dict[tuple[int, int], str]:
    """Default routing: tasks go to consecutive workers, round-robin.

    Each stage continues where the previous one stopped, so one-task stages
    spread out too.
    """
    placement: dict[tuple[int, int], str] = {}
    i = 0
    for stage in graph.stages[:-1]:
        for t in range(stage.num_tasks):
            placement[(stage.stage_id, t)] = urls[i % len(urls)]
            i += 1
    return placement


def default_target_partitions() -> int:
    """Threads one task may use inside DataFusion: the machine's cores."""
    return max(1, os.cpu_count() or 1)


def task_threads(cores: int, num_tasks: int, slots: int) -> int:
    """DataFusion partitions per task: ``cores`` shared by a stage's concurrent tasks.

    Tasks of one stage already run in parallel (at most ``slots`` at once); giving
    each every core would make DataFusion repartition inside each task on top of
    the stage's own split. Used where tasks share cores: the local runtime's
    workers, a Spark executor's task slots.
    """
    return max(1, cores // max(1, min(num_tasks, slots)))


def _input_workers(
    stage: Stage, graph: StageGraph, placement: dict[tuple[int, int], str]
) -> tuple[tuple[str, ...], ...]:
    return tuple(
        tuple(placement[(inp.stage_id, j)] for j in range(graph.stage(inp.stage_id).num_tasks))
        for inp in stage.inputs
    )


def execute_graph(
    graph: StageGraph,
    transport: WorkerTransport,
    urls: list[str],
    routing: Routing = round_robin,
    target_partitions: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run ``graph`` on the workers at ``urls``; yield the head stage's batches.

    Every task plan is delivered before the head stage starts reading, stage by
    stage (the order the workers' FIFO pools rely on). Whatever happens — the
    result fully read, an error, the iterator closed early — every worker is
    told to cancel the query and free its state.

    Args:
        graph: the planned query.
        transport: reaches the workers.
        urls: worker URLs from the resolver (non-empty).
        routing: assigns tasks to URLs (default :func:`round_robin`).
        target_partitions: DataFusion threads per task (default: the cores).

    Raises:
        TaskError: a task failed, here or on a worker.
        QueryCancelled: a worker cancelled the query.
        TransportError: a worker could not be reached.
    """
    tp = target_partitions or default_target_partitions()
    placement = routing(graph, urls)
    used = sorted(set(placement.values()))
    qid = graph.query_id
    try:
        for stage in graph.stages[:-1]:
            inputs = _input_workers(stage, graph, placement)
            for t in range(stage.num_tasks):
                plan = TaskPlan.for_task(
                    qid, stage, t, inputs, task_threads(tp, stage.num_tasks, len(urls))
                )
                transport.set_plan(placement[(stage.stage_id, t)], plan)
        head = graph.head
        plan = TaskPlan.for_task(qid, head, 0, _input_workers(head, graph, placement), tp)

        def read_input(i: int) -> list[pa.RecordBatch]:
            out: list[pa.RecordBatch] = []
            for url, producer, part in plan.input_reads(i):
                out.extend(transport.execute_partition(url, producer, part))
            return out

        yield from stream_head_stage(plan, read_input)
    finally:
        for url in used:
            transport.cancel_query(url, qid)
