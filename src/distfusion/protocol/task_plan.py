"""The task plan a worker receives: what one task of one stage must do.

A :class:`TaskPlan` is plain data: the stage's Substrait fragment bytes, this
task's work units, where its inputs live (the worker URL of every producer
task), and how to partition its output. It round-trips through JSON
(:meth:`TaskPlan.to_json`), so a network transport never needs pickle.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from distfusion.io.sources import TableSource, WorkUnit
from distfusion.session import SessionSettings
from distfusion.stages import (
    OutputPartitioning,
    Stage,
    StageInput,
    schema_from_json,
    schema_to_json,
)

__all__ = ["ScanShare", "TaskKey", "TaskPlan", "task_name"]


@dataclass(frozen=True)
class TaskKey:
    """Identifies one task of one query: ``(query_id, stage_id, task_index)``."""

    query_id: str
    stage_id: int
    task_index: int

    def __str__(self) -> str:
        return f"{self.query_id[:8]}/s{self.stage_id}/t{self.task_index}"


def task_name(key: TaskKey) -> str:
    """``"query 1a2b3c4d stage 1 task 0"``: how errors and logs name a task."""
    return f"query {key.query_id[:8]} stage {key.stage_id} task {key.task_index}"


@dataclass(frozen=True)
class ScanShare:
    """A source table and the work units this task reads of it.

    ``source.units`` is emptied (only ``units`` travel) to keep descriptors small.
    """

    source: TableSource
    units: tuple[WorkUnit, ...]


@dataclass(frozen=True)
class TaskPlan:
    """Everything a worker needs to run one task.

    Attributes:
        key: ``(query_id, stage_id, task_index)``.
        fragment: the stage's Substrait plan bytes.
        scans: the source tables of a leaf stage with this task's work units.
        inputs: the stage inputs the fragment reads.
        input_workers: ``input_workers[i][j]`` is the URL of the worker running
            task *j* of the stage feeding ``inputs[i]``.
        output: how the output is split into partitions.
        target_partitions: DataFusion's ``target_partitions`` inside the task
            (threads one task may use).
        keep_output: the worker keeps every output partition until the query
            is cancelled, however often it is read, instead of freeing each
            after ``output.readers`` reads. Set for tasks run stage by stage
            (:class:`~distfusion.coordinator.query_run.QueryRun`): a later plan of the
            query may read a finished stage again, differently (its shuffle
            output as a broadcast, its partitions coalesced).
        memory_per_task_bytes: the task's DataFusion memory pool, bytes
            (``DistributedConfig.memory_per_task_bytes``); None: the worker's
            own default (see :mod:`distfusion.worker.memory`).
        operator_metrics: report DataFusion's metrics of every operator
            (``Stage.operator_metrics``).
        stream_inputs: stream the task's inputs rather than read them whole
            first (``Stage.stream_inputs``); None: the worker's own default
            (:func:`~distfusion.worker.stream_inputs.streams_task_inputs`).
        unbounded_memory_retry: still over its budget after a run with
            sort-merge joins, the task runs once more without a bound
            (``Stage.unbounded_memory_retry``); False: it fails
            (:mod:`distfusion.worker.memory_retry`).
        session: the UDFs and object stores the task's session registers
            (``Stage.session``). Never in :meth:`to_json`: a Flight worker
            uses its own UDFs and the query's stores it was sent
            (:mod:`distfusion.session`).
    """

    key: TaskKey
    fragment: bytes
    scans: tuple[ScanShare, ...]
    inputs: tuple[StageInput, ...]
    input_workers: tuple[tuple[str, ...], ...]
    output: OutputPartitioning
    target_partitions: int = 1
    keep_output: bool = False
    memory_per_task_bytes: int | None = None
    operator_metrics: bool = True
    stream_inputs: bool | None = None
    unbounded_memory_retry: bool = False
    session: SessionSettings | None = field(default=None, compare=False, repr=False)

    @classmethod
    def for_task(
        cls,
        query_id: str,
        stage: Stage,
        task_index: int,
        input_workers: tuple[tuple[str, ...], ...],
        target_partitions: int,
        keep_output: bool = False,
        memory_per_task_bytes: int | None = None,
    ) -> TaskPlan:
        """The plan of task ``task_index`` of ``stage``.

        Args:
            query_id: the query's UUID.
            stage: the stage.
            task_index: 0-based, below ``stage.num_tasks``.
            input_workers: one tuple of producer-task URLs per ``stage.inputs``.
            target_partitions: threads the task may use (>= 1).
            keep_output: see :attr:`keep_output`.
            memory_per_task_bytes: see :attr:`memory_per_task_bytes`.
        """
        scans = tuple(
            ScanShare(_without_units(s.source), s.task_units[task_index]) for s in stage.scans
        )
        return cls(
            key=TaskKey(query_id, stage.stage_id, task_index),
            fragment=stage.fragment,
            scans=scans,
            inputs=stage.inputs,
            input_workers=input_workers,
            output=stage.output,
            target_partitions=max(1, target_partitions),
            keep_output=keep_output,
            memory_per_task_bytes=memory_per_task_bytes,
            operator_metrics=stage.operator_metrics,
            stream_inputs=stage.stream_inputs,
            unbounded_memory_retry=stage.unbounded_memory_retry,
            session=stage.session,
        )

    def input_reads(self, i: int) -> list[tuple[str, TaskKey, int]]:
        """What this task reads for ``inputs[i]``: ``(worker URL, producer task, partition)``.

        One entry per producer task and per partition this task takes of its
        output (:meth:`StageInput.partitions_for`), producer tasks in order.
        """
        inp = self.inputs[i]
        parts = inp.partitions_for(self.key.task_index)
        return [
            (url, TaskKey(self.key.query_id, inp.stage_id, j), p)
            for j, url in enumerate(self.input_workers[i])
            for p in parts
        ]

    def to_json(self) -> str:
        """The plan as a JSON document (fragment bytes base64-encoded)."""
        return json.dumps(
            {
                "key": [self.key.query_id, self.key.stage_id, self.key.task_index],
                "fragment": base64.b64encode(self.fragment).decode(),
                "scans": [
                    {
                        "name": s.source.name,
                        "format": s.source.format,
                        "schema": schema_to_json(s.source.schema),
                        "options": s.source.options,
                        "units": [u.to_json() for u in s.units],
                    }
                    for s in self.scans
                ],
                "inputs": [
                    [
                        i.table,
                        i.stage_id,
                        i.boundary,
                        schema_to_json(i.schema),
                        i.partitions,
                        None if i.groups is None else [list(g) for g in i.groups],
                    ]
                    for i in self.inputs
                ],
                "input_workers": [list(w) for w in self.input_workers],
                "output": {
                    "kind": self.output.kind,
                    "num_partitions": self.output.num_partitions,
                    "key_columns": list(self.output.key_columns),
                    "num_columns": self.output.num_columns,
                    "readers": self.output.readers,
                },
                "target_partitions": self.target_partitions,
                "keep_output": self.keep_output,
                "memory_per_task_bytes": self.memory_per_task_bytes,
                "operator_metrics": self.operator_metrics,
                "stream_inputs": self.stream_inputs,
                "unbounded_memory_retry": self.unbounded_memory_retry,
            }
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> TaskPlan:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: ``data`` is not a task plan document.
        """
        try:
            d = json.loads(data)
            scans = tuple(
                ScanShare(
                    TableSource(
                        s["name"], s["format"], schema_from_json(s["schema"]), (), {}, s["options"]
                    ),
                    tuple(WorkUnit.from_json(u) for u in s["units"]),
                )
                for s in d["scans"]
            )
            o = d["output"]
            return cls(
                key=TaskKey(*d["key"]),
                fragment=base64.b64decode(d["fragment"]),
                scans=scans,
                inputs=tuple(
                    StageInput(
                        t,
                        sid,
                        b,
                        schema_from_json(sc),
                        n,
                        None if g is None else tuple(tuple(x) for x in g),
                    )
                    for t, sid, b, sc, n, g in d["inputs"]
                ),
                input_workers=tuple(tuple(w) for w in d["input_workers"]),
                output=OutputPartitioning(
                    o["kind"],
                    o["num_partitions"],
                    tuple(o["key_columns"]),
                    o["num_columns"],
                    o["readers"],
                ),
                target_partitions=d["target_partitions"],
                keep_output=bool(d.get("keep_output", False)),
                memory_per_task_bytes=_budget(d.get("memory_per_task_bytes")),
                operator_metrics=bool(d.get("operator_metrics", True)),
                stream_inputs=_switch(d.get("stream_inputs")),
                unbounded_memory_retry=d.get("unbounded_memory_retry", False) is True,
            )
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"not a distfusion task plan: {exc}"
            raise ValueError(msg) from exc


def _budget(value) -> int | None:
    """A plan's memory budget: None or a positive int (anything else is not a plan)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        msg = f"memory_per_task_bytes must be a positive integer or null, got {value!r}"
        raise ValueError(msg)
    return value


def _switch(value) -> bool | None:
    """A plan's optional switch: None, True or False (anything else is not a plan)."""
    if value is None or isinstance(value, bool):
        return value
    msg = f"stream_inputs must be true, false or null, got {value!r}"
    raise ValueError(msg)


def _without_units(source: TableSource) -> TableSource:
    return TableSource(source.name, source.format, source.schema, (), {}, source.options)
