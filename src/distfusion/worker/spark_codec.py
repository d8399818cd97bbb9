"""The one encoding of a Spark task: each stage once per job, each task as three numbers.

Every Spark job of distfusion (the classic Flight data plane, the shuffle data
plane, Spark Connect) describes its tasks the same way. The driver ships each
stage a job runs once, as a *stage record* (:func:`stage_record`, plain types
in the job's closure), and each task as a *task record* ``(stage id, task
index, attempt)``; the executor builds the task's
:class:`~distfusion.protocol.task_plan.TaskPlan` where it runs
(:func:`task_plan`). A head part (``to_spark``, ``write_parquet``, the head on
an executor) travels the same way: pickled by value, its plan's session with
it (:func:`head_part`)::

    driver                                        executor (Python worker)
    stage_record(by_value(stage), input workers,  task_plan(query id, stages[sid], t)
                 threads, memory, table, keep)      = TaskPlan.for_task(stage, t, ...)
    task records (sid, t, attempt) ─────────────>   run on this process's worker

The stage travels pickled by value (``runtime.spark.jobs.by_value``, with
its session: the query's UDFs and object stores), so a closure holding it
unpickles on an executor without distfusion, which the task then reports.
Which executor function runs the tasks is named from one registry
(:mod:`distfusion.worker.spark_entries`).
"""

from __future__ import annotations

import pickle

from distfusion.protocol.task_plan import TaskPlan
from distfusion.stages import Stage
from distfusion.worker.head_parts import HeadPart

__all__ = ["StageRecord", "TaskRecord", "head_part", "stage_of", "stage_record", "task_plan"]

StageRecord = tuple[bytes, tuple[tuple[str, ...], ...], int, "int | None", "str | None", bool]
"""``(pickled stage, input worker URLs, DataFusion threads, memory bytes or None,
Spark table or None, keep output)``: what every task of one stage in one job shares."""

TaskRecord = tuple[int, int, int]
"""``(stage id, task index, attempt)``: one task of a job (attempts counted by distfusion)."""


def stage_record(
    stage_bytes: bytes,
    input_workers: tuple[tuple[str, ...], ...],
    threads: int,
    memory_per_task_bytes: int | None,
    table: str | None,
    keep_output: bool,
) -> StageRecord:
    """A stage's record for one Spark job (driver side).

    Args:
        stage_bytes: the :class:`~distfusion.stages.Stage`, pickled by value.
        input_workers: worker URLs of each input's producer tasks (Flight data
            plane; ``()`` where Spark's shuffle carries the inputs).
        threads: DataFusion partitions of each task.
        memory_per_task_bytes: the plan's memory pool (None: the worker's default).
        table: the Spark table the stage reads (a partition is offered to
            each task), or None.
        keep_output: the worker keeps each task's output (Flight data plane).
    """
    return (stage_bytes, tuple(input_workers), threads, memory_per_task_bytes, table, keep_output)


_STAGES: dict[bytes, Stage] = {}
"""Stages unpickled in this Python worker, by their pickle (a job's tasks share them)."""

_STAGES_KEPT = 8
"""Most stages :data:`_STAGES` keeps (a job's stages; a new job's replace them)."""


def stage_of(record: StageRecord) -> Stage:
    """The stage of ``record``, unpickled once per job in this process (executor side)."""
    data = record[0]
    stage = _STAGES.get(data)
    if stage is None:
        if len(_STAGES) >= _STAGES_KEPT:
            _STAGES.clear()
        stage = _STAGES[data] = pickle.loads(data)
    return stage


def task_plan(query_id: str, record: StageRecord, task_index: int) -> TaskPlan:
    """Task ``task_index`` of ``record``'s stage, as the plan its worker runs (executor side)."""
    _, input_workers, threads, memory, _, keep_output = record
    return TaskPlan.for_task(
        query_id,
        stage_of(record),
        task_index,
        input_workers,
        threads,
        keep_output=keep_output,
        memory_per_task_bytes=memory,
    )


def head_part(data: bytes) -> HeadPart:
    """A head part shipped pickled by value (``by_value(part)``), with its session (executor side).

    Its plan's UDFs and object stores (``TaskPlan.session``) come with it, which
    the part's JSON (:meth:`HeadPart.to_json`) does not carry.
    """
    return pickle.loads(data)
