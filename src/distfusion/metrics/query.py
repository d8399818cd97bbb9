"""A query's metrics: per task, per stage (sum and skew), per network boundary.

Built on the coordinator from the :class:`~distfusion.metrics.task.TaskMetrics`
every task returned, over the stage graph that ran
(:func:`build_query_metrics`); :meth:`DistributedDataFrame.metrics()
<distfusion.DistributedDataFrame.metrics>` returns it::

    QueryMetrics                       query_id, runtime, elapsed_s
      stages: StageMetrics, ...        head first, as explain() prints them
        tasks: TaskMetrics, ...        one per task, by task index
        output_rows, output_bytes,     sums over the tasks
        cpu_s, source_bytes, ...
        task_elapsed_s: Distribution   sum, min, median, max over the tasks
      boundaries: BoundaryMetrics      producer -> consumer: kind, rows, bytes moved
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from distfusion.metrics.task import TaskMetrics
from distfusion.stages import StageGraph

__all__ = ["BoundaryMetrics", "Distribution", "QueryMetrics", "StageMetrics", "build_query_metrics"]


@dataclass(frozen=True)
class Distribution:
    """One measure over the tasks of a stage: its sum, minimum, median and maximum.

    ``max / median`` is the stage's skew in that measure (1.0: even).
    """

    sum: float
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Distribution:
        """The distribution of ``values`` (all zero when empty)."""
        if not values:
            return cls(0, 0, 0, 0)
        return cls(sum(values), min(values), statistics.median(values), max(values))

    @property
    def skew(self) -> float:
        """``max / median`` (1.0 when the median is 0 and so is the max, else inf)."""
        if self.median:
            return self.max / self.median
        return 1.0 if not self.max else float("inf")


@dataclass(frozen=True)
class StageMetrics:
    """What a stage's tasks did, summed and spread.

    Attributes:
        stage_id: the stage.
        num_tasks: tasks the stage ran.
        output: how its output was cut (``shuffle (hash [c0]) -> 4 partitions``,
            ``coalesce``, ``broadcast -> 2 tasks``; ``result`` for the head).
        tasks: one entry per task, by task index (fewer only when a task's
            metrics were lost with its worker).
        output_rows: rows produced, all tasks.
        output_bytes: Arrow bytes produced, all tasks.
        cpu_s: CPU seconds, all tasks (see :attr:`TaskMetrics.cpu_s`).
        input_wait_s: seconds tasks spent reading their inputs, all tasks.
        source_bytes: bytes read from sources, all tasks.
        spilled_bytes: bytes spilled to disk, all tasks.
        task_elapsed_s: wall seconds per task.
        task_output_rows: output rows per task.
        task_output_bytes: output bytes per task.
    """

    stage_id: int
    num_tasks: int
    output: str
    tasks: tuple[TaskMetrics, ...]
    output_rows: int
    output_bytes: int
    cpu_s: float
    input_wait_s: float
    source_bytes: int
    spilled_bytes: int
    task_elapsed_s: Distribution
    task_output_rows: Distribution
    task_output_bytes: Distribution


@dataclass(frozen=True)
class BoundaryMetrics:
    """What crossed one network boundary: a producer stage read by a consumer stage.

    Attributes:
        producer_stage_id: the stage whose output crossed.
        consumer_stage_id: the stage that read it.
        kind: ``shuffle``, ``coalesce`` or ``broadcast``.
        rows: rows the consumer's tasks read, all tasks (a broadcast counts
            once per consumer task).
        bytes: Arrow bytes (``RecordBatch.nbytes``) the consumer's tasks read.
    """

    producer_stage_id: int
    consumer_stage_id: int
    kind: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class QueryMetrics:
    """Everything measured in one run of a distributed query.

    Attributes:
        query_id: the run's query id (names its Spark job group, its tasks on workers).
        runtime: the runtime's name (``local``, ``flight``, ``spark``).
        elapsed_s: wall seconds from the start of the run to its last result batch.
        rows: rows of the result the caller read.
        stages: one entry per stage of the plan that ran, head first.
        boundaries: one entry per (producer, consumer) pair of stages.
    """

    query_id: str
    runtime: str
    elapsed_s: float
    rows: int
    stages: tuple[StageMetrics, ...]
    boundaries: tuple[BoundaryMetrics, ...]

    def stage(self, stage_id: int) -> StageMetrics:
        """The metrics of stage ``stage_id``.

        Raises:
            KeyError: no such stage ran.
        """
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        raise KeyError(stage_id)

    def tasks(self) -> list[TaskMetrics]:
        """Every task's metrics, stage by stage (head first), by task index."""
        return [t for s in self.stages for t in s.tasks]

    @property
    def bytes_moved(self) -> int:
        """Arrow bytes read across every network boundary."""
        return sum(b.bytes for b in self.boundaries)


def build_query_metrics(
    graph: StageGraph,
    tasks: list[TaskMetrics],
    query_id: str,
    runtime: str,
    elapsed_s: float,
    rows: int = 0,
) -> QueryMetrics:
    """Aggregate the tasks' metrics over ``graph``, the stage graph that ran to the end.

    Stages that ran in an earlier adaptive wave keep their ids in ``graph``;
    metrics of stages no longer in it (a stage planned, run and replaced) are
    left out. A task reported twice (a retry) counts once: the last report.

    Returns:
        The query's metrics, stages head first.
    """
    by_key = {(m.stage_id, m.task_index): m for m in tasks}
    stages = []
    boundaries: dict[tuple[int, int], list] = {}
    for stage in reversed(graph.stages):
        mine = sorted(
            (m for (sid, _), m in by_key.items() if sid == stage.stage_id),
            key=lambda m: m.task_index,
        )
        mine = [m for m in mine if m.task_index < stage.num_tasks]
        output = "result" if stage is graph.head else stage.output.describe()
        stages.append(
            StageMetrics(
                stage_id=stage.stage_id,
                num_tasks=stage.num_tasks,
                output=output,
                tasks=tuple(mine),
                output_rows=sum(m.output_rows for m in mine),
                output_bytes=sum(m.output_bytes for m in mine),
                cpu_s=sum(m.cpu_s for m in mine),
                input_wait_s=sum(m.input_wait_s for m in mine),
                source_bytes=sum(m.source_bytes for m in mine),
                spilled_bytes=sum(m.spilled_bytes for m in mine),
                task_elapsed_s=Distribution.of([m.elapsed_s for m in mine]),
                task_output_rows=Distribution.of([m.output_rows for m in mine]),
                task_output_bytes=Distribution.of([m.output_bytes for m in mine]),
            )
        )
        for i, inp in enumerate(stage.inputs):
            edge = boundaries.setdefault((inp.stage_id, stage.stage_id), [inp.boundary, 0, 0])
            for m in mine:
                if i < len(m.input_rows):
                    edge[1] += m.input_rows[i]
                    edge[2] += m.input_bytes[i]
    return QueryMetrics(
        query_id=query_id,
        runtime=runtime,
        elapsed_s=elapsed_s,
        rows=rows,
        stages=tuple(stages),
        boundaries=tuple(
            BoundaryMetrics(p, c, kind, rows, nbytes)
            for (p, c), (kind, rows, nbytes) in boundaries.items()
        ),
    )
