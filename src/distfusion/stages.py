"""The stage graph: what the distributed planner produces and every runtime runs.

```
 Stage 3 (head, 1 task, on the coordinator)
   Sort
     <- coalesce from stage 2 (2 tasks)
 Stage 2 (2 tasks)                      output: coalesce -> 1 partition
   Aggregate (final)
     <- shuffle from stage 1 (4 tasks)  partition i goes to task i
 Stage 1 (4 tasks, leaf)                output: shuffle by [c0] -> 2 partitions
   Aggregate (partial)
     Read lineitem (work units split across the 4 tasks)
```

Everything here is plain data (frozen dataclasses, Substrait bytes, Arrow
schemas), so a graph can be printed, compared in tests and sent to workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from distfusion.io.sources import TableSource, WorkUnit
from distfusion.session import SessionSettings

__all__ = [
    "SHUFFLE",
    "COALESCE",
    "BROADCAST",
    "RESULT",
    "OutputPartitioning",
    "StageInput",
    "SourceScan",
    "Stage",
    "StageGraph",
]

SHUFFLE = "shuffle"
"""Hash-partition by key columns (round-robin when there are none)."""
COALESCE = "coalesce"
"""Gather every task's output into the one consumer task."""
BROADCAST = "broadcast"
"""Every consumer task receives all rows."""
RESULT = "result"
"""The head stage's output: the query result, streamed to the caller."""


@dataclass(frozen=True)
class OutputPartitioning:
    """How a stage's tasks split their output for the consumer stage.

    Attributes:
        kind: ``shuffle``, ``coalesce``, ``broadcast`` or ``result``.
        num_partitions: partitions each task produces (the consumer's task count
            for a shuffle, else 1).
        key_columns: for a shuffle, the output columns hashed (xxhash64, as Spark)
            to pick a partition; empty means round-robin.
        num_columns: columns kept after partitioning; key columns appended only
            for hashing sit past this index and are dropped.
        readers: how many consumer tasks read each partition (a broadcast is read
            by every consumer task; other partitions once).
    """

    kind: str
    num_partitions: int = 1
    key_columns: tuple[int, ...] = ()
    num_columns: int | None = None
    readers: int = 1

    def describe(self) -> str:
        """One line for ``explain()``."""
        if self.kind == SHUFFLE:
            how = (
                f"hash {[f'c{k}' for k in self.key_columns]}" if self.key_columns else "round-robin"
            )
            return f"shuffle ({how}) -> {self.num_partitions} partitions"
        if self.kind == BROADCAST:
            return f"broadcast -> {self.readers} tasks"
        return self.kind


@dataclass(frozen=True)
class StageInput:
    """An input of a stage: the output of another stage, read as a table.

    Attributes:
        table: the table name the fragment's ``ReadRel`` uses (``__stage_N``).
        stage_id: the producing stage.
        boundary: ``shuffle`` (task *i* reads partition *i* of every producer task),
            ``coalesce`` or ``broadcast`` (every task reads partition 0 of every
            producer task).
        schema: the declared Arrow schema (columns ``c0..``, all nullable).
        partitions: output partitions of each producer task. A broadcast read
            takes all of them: a stage may be read as a broadcast by one
            consumer (a runtime filter) while another reads its shuffle.
        groups: for a shuffle read whose partitions adaptive execution
            coalesced (Spark's ``CoalesceShufflePartitions``): ``groups[i]`` are
            the producer partitions consumer task *i* reads. None: task *i*
            reads partition *i*.
    """

    table: str
    stage_id: int
    boundary: str
    schema: pa.Schema
    partitions: int = 1
    groups: tuple[tuple[int, ...], ...] | None = None

    def partitions_for(self, task_index: int) -> list[int]:
        """The producer partitions that consumer task ``task_index`` reads."""
        if self.boundary == SHUFFLE:
            return list(self.groups[task_index]) if self.groups is not None else [task_index]
        if self.boundary == BROADCAST:
            return list(range(self.partitions))
        return [0]


@dataclass(frozen=True)
class SourceScan:
    """A source table read by a leaf stage, with each task's work units.

    Attributes:
        source: the table.
        task_units: ``task_units[i]`` are the units task *i* reads; every unit of
            the table appears in exactly one task, unless ``replicated``.
        replicated: every task reads the whole (small) table: a broadcast of a
            source without a stage of its own.
    """

    source: TableSource
    task_units: tuple[tuple[WorkUnit, ...], ...]
    replicated: bool = False


@dataclass(frozen=True)
class Stage:
    """A fragment of the plan between network boundaries, run as ``num_tasks`` tasks.

    Attributes:
        stage_id: unique within the query; producers have lower ids.
        num_tasks: how many tasks run the fragment (>= 1).
        fragment: the Substrait plan bytes every task executes.
        inputs: the stage outputs this fragment reads.
        scans: the source tables this fragment reads.
        output: how the output is partitioned for the consumer.
        plan_text: DataFusion's rendering of the fragment, for ``explain()``.
        output_schema: the Arrow schema of the stage output the consumer reads.
        estimated_rows: the planner's estimate of the output's rows.
        estimated_bytes: the planner's estimate of the output's Arrow bytes.
        estimated_max_bytes: the output's Arrow bytes if every filter below
            kept every row (``estimated_bytes`` over the kept fraction): what
            the stage could be when the selectivity guesses are wrong.
        computation: a digest of what the stage computes (fragment, task
            count, inputs), whatever its output partitioning: adaptive
            execution recognises a stage that ran when it plans again.
        operator_metrics: its tasks report DataFusion's metrics of every
            operator they ran (``DistributedConfig.operator_metrics``).
        stream_inputs: its tasks on workers stream their inputs rather than
            read them whole first (``DistributedConfig.stream_task_inputs``,
            resolved when the graph was planned); None: each worker's own
            default (:func:`~distfusion.worker.stream_inputs.streams_task_inputs`).
        unbounded_memory_retry: a task of it still over its memory budget
            after a run with sort-merge joins runs once more without a bound
            (``DistributedConfig.unbounded_memory_retry``).
        session: the UDFs its fragment calls and the object stores of the
            query's context, registered in each task's session
            (:mod:`distfusion.session`); None: none.
    """

    stage_id: int
    num_tasks: int
    fragment: bytes
    inputs: tuple[StageInput, ...]
    scans: tuple[SourceScan, ...]
    output: OutputPartitioning
    plan_text: str
    output_schema: pa.Schema
    estimated_rows: float = 0.0
    estimated_bytes: float = 0.0
    estimated_max_bytes: float = 0.0
    computation: str = ""
    operator_metrics: bool = True
    stream_inputs: bool | None = None
    unbounded_memory_retry: bool = False
    session: SessionSettings | None = field(default=None, compare=False, repr=False)

    @property
    def is_leaf(self) -> bool:
        """True when the stage reads source data and no other stage."""
        return not self.inputs


@dataclass(frozen=True)
class StageGraph:
    """The stages of one query, producers before consumers, the head stage last.

    Attributes:
        query_id: a UUID naming the query on every worker.
        stages: all stages; ``stages[-1]`` is the head stage (1 task, its output is
            the result).
        memory_per_task_bytes: every task's DataFusion memory pool, bytes
            (``DistributedConfig.memory_per_task_bytes``); None: the runtime's
            default.
    """

    query_id: str
    stages: tuple[Stage, ...]
    memory_per_task_bytes: int | None = None

    @property
    def head(self) -> Stage:
        """The head stage, run on the coordinator."""
        return self.stages[-1]

    def stage(self, stage_id: int) -> Stage:
        """The stage with ``stage_id``.

        Raises:
            KeyError: no such stage.
        """
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        raise KeyError(stage_id)

    def consumers(self, stage_id: int) -> list[Stage]:
        """The stages reading ``stage_id``'s output."""
        return [s for s in self.stages if any(i.stage_id == stage_id for i in s.inputs)]

    def render(self) -> str:
        """The graph as text: one block per stage, head first, fragments indented."""
        lines: list[str] = []
        for s in reversed(self.stages):
            role = "head" if s is self.head else ("leaf" if s.is_leaf else "")
            tasks = f"{s.num_tasks} task" + ("s" if s.num_tasks != 1 else "")
            header = f"Stage {s.stage_id} [{', '.join(x for x in (role, tasks) if x)}]"
            if s is not self.head:
                header += f"  output: {s.output.describe()}"
            lines.append(header)
            for inp in s.inputs:
                producer = self.stage(inp.stage_id)
                lines.append(
                    f"  <- {inp.boundary} from stage {inp.stage_id} "
                    f"({producer.num_tasks} tasks) as {inp.table}"
                )
            for scan in s.scans:
                n: int | str = len(scan.source.units)
                if "all_units" in scan.source.options:  # a read pruned (partitions, statistics)
                    n = f"{n} of {scan.source.options['all_units']}"
                if scan.source.is_feed:
                    chunked = scan.source.options.get("chunked")
                    how = "chunks as units arrive" if chunked else "whole"
                    lines.append(
                        f"  <- feed scan {scan.source.name} (work unit feed "
                        f"{scan.source.options['feed_id'][:8]}, one partition per task, "
                        f"streamed while the query runs; run over {how})"
                    )
                elif scan.source.is_spark:
                    chunked = scan.source.options.get("chunked")
                    how = "chunks as batches arrive" if chunked else "whole"
                    parts = scan.source.options.get("partitions")
                    parts = "?" if parts is None else parts
                    lines.append(
                        f"  <- spark scan {scan.source.name} (Spark DataFrame, {parts} "
                        f"partitions read by Spark into {s.num_tasks} tasks; run over {how})"
                    )
                elif scan.replicated:
                    lines.append(
                        f"  <- broadcast scan {scan.source.name} ({n} work units, "
                        "every task reads all)"
                    )
                else:
                    counts = [len(u) for u in scan.task_units]
                    pruned = ""
                    if "all_units" in scan.source.options:
                        how = scan.source.options.get("pruned", "partitions pruned")
                        pruned = f" as {scan.source.name}, {how}"
                    lines.append(
                        f"  <- scan {scan.source.options.get('table', scan.source.name)} "
                        f"({n} work units{pruned}, per task {counts})"
                    )
            lines.extend("    " + ln for ln in s.plan_text.rstrip().splitlines())
        return "\n".join(lines)

    def summary(self) -> dict:
        """Counts for tests and logs: stages, tasks and boundaries by kind."""
        kinds: dict[str, int] = {}
        for s in self.stages:
            for inp in s.inputs:
                kinds[inp.boundary] = kinds.get(inp.boundary, 0) + 1
            for scan in s.scans:
                if scan.replicated:
                    kinds["broadcast scan"] = kinds.get("broadcast scan", 0) + 1
        return {
            "stages": len(self.stages),
            "tasks": sum(s.num_tasks for s in self.stages),
            "boundaries": kinds,
        }

    def __str__(self) -> str:
        return self.render()


def schema_to_json(schema: pa.Schema) -> str:
    """Arrow schema as hex IPC bytes, for JSON task descriptors."""
    return schema.serialize().to_pybytes().hex()


def schema_from_json(data: str) -> pa.Schema:
    """Inverse of :func:`schema_to_json`."""
    return pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(data)))
