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
from typing import Protocol, runtime_checkable

import pyarrow as pa

from distfusion.stages import Stage, StageGraph
from distfusion.transport.base import WorkerTransport
from distfusion.worker.execute_task import stream_head_stage
from distfusion.worker.task_plan import TaskPlan

__all__ = ["Runtime", "Routing", "round_robin", "execute_graph", "task_threads"]


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
