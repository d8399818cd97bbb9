"""The head stage cut into parts that run where the data is: results that stay distributed.

A query's head stage normally runs once, on the coordinator, over every
producer task's output. When its result is not wanted on the coordinator
(``SparkDataFrame.to_spark``, ``DistributedDataFrame.write_parquet``), the
head's fragment is run as **parts** instead, each over a share of the inputs,
by whoever reads it (a Spark task, a writer thread)::

    Stage 2 (4 tasks)  ──coalesce──>  head: Project/Filter over __stage_2
                                        part 0 reads stage 2 task 0 ─> file / Spark partition 0
                                        part 1 reads stage 2 task 1 ─> file / Spark partition 1
                                        ...

The cut keeps the query's meaning only when the head is **row-wise**: its
fragment is reads of its stage inputs under projections, filters and
``UNION ALL`` (no aggregate, sort, limit, join, window or subquery), it scans
no source itself, and it reads every input through a coalesce. Then running
the fragment over each producer task's output and concatenating the results
gives the same rows (a union of row-wise functions distributes over the
union of their inputs). Any other head (a final aggregate without keys, a
global ``ORDER BY``, a ``LIMIT``) is one part over every input: its order and
its all-rows semantics are kept, and it still runs where the caller runs it
(on an executor, not necessarily the coordinator).

A head of more than one task is a write's head fused into the stage that
produces its rows (:mod:`distfusion.planner.write_from_producer`): each of
its tasks is a part, reading that task's share of the inputs (its shuffle
partitions, broadcasts whole) and the task's work units, as the stage's task
would::

    Stage 4 [head, 4 tasks]  <- shuffle from stages 1, 2
      part j = task j: partition j of every task of stages 1 and 2 ─> files
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from substrait.proto import Expression, Plan, SetRel

from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.task_plan import TaskKey, TaskPlan
from distfusion.stages import COALESCE, Stage
from distfusion.substrait_plan.walk import is_subquery, own_contains, rel_kind, relations
from distfusion.transport.base import WorkerTransport
from distfusion.worker.execute_task import stream_head_stage
from distfusion.worker.memory import TaskMemory
from distfusion.worker.stream_inputs import InputStreams

__all__ = ["HeadPart", "head_parts", "row_wise", "run_part"]

_ROW_WISE = {"read", "project", "filter"}


@dataclass(frozen=True)
class HeadPart:
    """One part of a head stage: its fragment over a share of the head's inputs.

    Attributes:
        index: the part's number, 0-based (a Spark partition, a file's task number).
        plan: the head's task plan (fragment, inputs, the workers holding them);
            its key's task index is ``index``.
        tasks: per input of the head, the producer tasks this part reads
            (``None``: all of them).
    """

    index: int
    plan: TaskPlan
    tasks: tuple[tuple[int, ...] | None, ...]

    def to_json(self) -> str:
        """The part as JSON (its task plan as :meth:`TaskPlan.to_json`)."""
        tasks = [None if t is None else list(t) for t in self.tasks]
        return json.dumps({"index": self.index, "plan": self.plan.to_json(), "tasks": tasks})

    @classmethod
    def from_json(cls, data: str) -> HeadPart:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: ``data`` is not a head part.
        """
        try:
            d = json.loads(data)
            tasks = tuple(None if t is None else tuple(int(x) for x in t) for t in d["tasks"])
            return cls(int(d["index"]), TaskPlan.from_json(d["plan"]), tasks)
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"not a distfusion head part: {exc}"
            raise ValueError(msg) from exc

    def read_input(self, transport: WorkerTransport) -> Callable[[int], InputStreams]:
        """``read_input(i)`` for :func:`stream_head_stage`: this part's share of input ``i``.

        As streams: the part's fragment pulls them batch by batch where the
        process has pull slots for them, else reads them whole first
        (:meth:`~distfusion.worker.stream_inputs.InputBinding.stream`).
        """

        def opener(url: str, key: TaskKey, p: int) -> Callable[[], Iterator[pa.RecordBatch]]:
            return lambda: transport.execute_partition(url, key, p)

        def read(i: int) -> InputStreams:
            want = self.tasks[i]
            reads = self.plan.input_reads(i)
            return InputStreams(
                opener(*r) for r in reads if want is None or r[1].task_index in want
            )

        return read


def row_wise(head: Stage) -> bool:
    """Whether ``head`` may run as one part per producer task (see the module docstring).

    Its fragment's relations are reads of its stage inputs (named tables, no
    literal rows), projections and filters without window functions or
    subqueries, and ``UNION ALL``; it scans no source and reads every input
    through a coalesce.
    """
    if head.scans or not head.inputs or any(i.boundary != COALESCE for i in head.inputs):
        return False
    plan = Plan()
    plan.ParseFromString(head.fragment)
    if len(plan.relations) != 1:
        return False
    rel = plan.relations[0]
    root = rel.root.input if rel.HasField("root") else rel.rel
    inputs = {i.table for i in head.inputs}

    def not_row_wise(m) -> bool:
        return isinstance(m, Expression.WindowFunction) or is_subquery(m)

    for r in relations(root):
        kind = rel_kind(r)
        if kind == "set":
            if r.set.op != SetRel.SET_OP_UNION_ALL:
                return False
            continue
        if kind not in _ROW_WISE:
            return False
        if kind == "read" and (
            not r.read.HasField("named_table") or ".".join(r.read.named_table.names) not in inputs
        ):
            return False
        if own_contains(r, not_row_wise):
            return False
    return True


def head_parts(plan: TaskPlan, head: Stage, split: bool = True) -> list[HeadPart]:
    """The parts of ``head`` whose task plan (task 0, input workers filled in) is ``plan``.

    Args:
        plan: the head's task plan, as the coordinator would run it.
        head: the head stage.
        split: cut a row-wise head into one part per producer task; False:
            one part over every input.

    Returns:
        One part per task of a head of several tasks (whatever ``split``);
        else one part per producer task of every input, inputs in order, when
        ``split`` and :func:`row_wise`; else one part reading everything.
    """
    if head.num_tasks > 1:
        return [
            HeadPart(
                j,
                TaskPlan.for_task(
                    plan.key.query_id,
                    head,
                    j,
                    plan.input_workers,
                    plan.target_partitions,
                    plan.keep_output,
                    plan.memory_per_task_bytes,
                ),
                (None,) * len(head.inputs),
            )
            for j in range(head.num_tasks)
        ]
    if not (split and row_wise(head)):
        return [HeadPart(0, plan, (None,) * len(head.inputs))]
    parts: list[HeadPart] = []
    for i, workers in enumerate(plan.input_workers):
        for j in range(len(workers)):
            tasks = tuple((j,) if k == i else () for k in range(len(head.inputs)))
            key = TaskKey(plan.key.query_id, plan.key.stage_id, len(parts))
            parts.append(HeadPart(len(parts), dataclasses.replace(plan, key=key), tasks))
    return parts or [HeadPart(0, plan, (None,) * len(head.inputs))]


def run_part(
    part: HeadPart,
    transport: WorkerTransport,
    memory: TaskMemory | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    target_partitions: int | None = None,
    on_metrics: Callable[[TaskMetrics], None] | None = None,
    producers_done: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Run ``part``: read its inputs through ``transport``, run the head fragment, yield batches.

    Columns are named as the stage output (``c0..``); the caller names them.
    The inputs stream into the fragment where the process has pull slots for
    them, else they are read whole first.

    Args:
        part: the part.
        transport: reaches the workers holding the head's inputs.
        memory: the part's DataFusion memory pool and spill directory.
        cancelled: polled between batches.
        target_partitions: DataFusion threads (default: the plan's).
        on_metrics: called with the part's metrics after its last batch.
        producers_done: every producer task finished before the part runs (as
            on Spark): the inputs stream through every DataFusion thread but
            one, as inputs from other processes do
            (:class:`~distfusion.worker.stream_inputs.PullSlots`); a pull never
            waits on a producer, and the part holds a few batches, not its input.

    Raises:
        TaskError: reading an input failed (its producer failed, or the query
            was released on the workers) or the fragment failed.
        TransportError: a worker could not be reached.
    """
    plan = part.plan
    if target_partitions is not None:
        plan = dataclasses.replace(plan, target_partitions=max(1, target_partitions))
    yield from stream_head_stage(
        plan,
        part.read_input(transport),
        memory=memory,
        cancelled=cancelled,
        on_metrics=on_metrics,
        remote_inputs=producers_done,
    )
