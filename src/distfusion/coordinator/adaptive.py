"""Adaptive execution: plan, run what decides the rest, plan the rest again with actual sizes.

Static estimates (footers, default selectivities) are often wrong by an order
of magnitude, and at scale a wrong one moves gigabytes through a shuffle that
a broadcast would have avoided. As in Spark's AQE, the stage graph is planned
again as stages finish, over their measured output instead of the estimate:

```
plan (static)            Stage 3 (join) <- shuffle 1 (orders ⋈ customer, est 300 MB)
                                        <- shuffle 2 (lineitem, est 1.2 GB)
wave 1: run stage 1      the smaller side of the undecided shuffle join; stage 2 waits
                         measured: 25 MB
plan again               stage 1 is now a leaf of known size: the join reads it as a
                         broadcast, inside the lineitem stage (nothing of lineitem
                         crosses the network before the join)
rest + head              coalesce small shuffle partitions by measured bytes, run
```

What changes between plans, all decided by the planner over measured sizes
(:class:`~distfusion.planner.fragment.MaterializedStage`):

- a shuffle join whose finished side is small becomes a broadcast join;
- semi-join reductions (runtime filters) are decided on the finished side's size;
- the task counts of stages reading finished outputs follow the measured
  bytes: small shuffle partitions are read together (Spark's
  ``CoalesceShufflePartitions``), as contiguous groups of similar bytes.

A wave is run only when a decision waits on it: a stage whose consumer also
reads, by hash shuffle, another stage that has not run and is estimated
smaller, waits for that one (:func:`next_wave`). Queries with no such join run
in one go, as without adaptive execution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pyarrow as pa

from distfusion.coordinator.query_run import Runtime, StageStats
from distfusion.planner.config import PlannerConfig
from distfusion.planner.fragment import MaterializedStage
from distfusion.stages import BROADCAST, SHUFFLE, Stage, StageGraph

__all__ = ["AdaptiveReport", "run_adaptive", "plan_final", "next_wave", "coalesce_partitions"]

MAX_WAVES = 16
"""Waves run before the rest of the query runs in one go whatever is undecided."""

Planner = Callable[[dict[str, MaterializedStage], int], StageGraph]
"""Plans the query over the stages that ran (by :attr:`Stage.computation`), new
stages numbered from the given id on."""


@dataclass
class AdaptiveReport:
    """What adaptive execution did in one run of a query, for ``explain()``.

    Attributes:
        graphs: every stage graph planned, the static one first; the last is
            the one that ran to the end.
        stats: measured output of every stage that ran in a wave, by stage id.
        decisions: one line per adaptive decision, with the sizes it rests on.
    """

    graphs: list[StageGraph] = field(default_factory=list)
    stats: dict[int, StageStats] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)

    @property
    def final(self) -> StageGraph:
        """The graph that ran to the end."""
        return self.graphs[-1]

    def render(self) -> str:
        """The final graph with measured sizes, then the decisions."""
        lines = [self.final.render()]
        if self.stats:
            lines.append("Measured (stages run before planning the rest):")
            for sid, st in sorted(self.stats.items()):
                stage = _find(self.graphs, sid)
                lines.append(
                    f"  stage {sid}: {st.rows} rows, {_mib(st.bytes)} "
                    f"(estimated {stage.estimated_rows:.0f} rows, {_mib(stage.estimated_bytes)})"
                )
        lines.append("Adaptive decisions:")
        lines.extend(f"  - {d}" for d in self.decisions or ["none (the static plan ran as is)"])
        return "\n".join(lines)


def _mib(nbytes: float) -> str:
    """``nbytes`` in MiB, or KiB below one MiB."""
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.1f} KiB"
    return f"{nbytes / 2**20:.1f} MiB"


def _find(graphs: list[StageGraph], stage_id: int) -> Stage:
    for g in reversed(graphs):
        for s in g.stages:
            if s.stage_id == stage_id:
                return s
    raise KeyError(stage_id)


def next_wave(
    graph: StageGraph, ran: set[int], max_broadcast_bytes: float, shuffle_bytes: float
) -> list[int]:
    """The stages to run before planning again; empty when no decision waits on one.

    Three kinds of stage decide something with their measured size:

    - the smaller side of a join both of whose sides are hash shuffles that
      have not run (by ``estimated_bytes``, then stage id): small, it becomes
      a broadcast, and the larger side is never shuffled. The larger sides wait.
    - a broadcast side that could be larger than ``max_broadcast_bytes`` if
      the planner's selectivity guesses are wrong (``estimated_max_bytes``):
      measured too large, its join is shuffled instead. Its consumer waits.
    - a hash shuffle estimated at ``shuffle_bytes`` or more: its consumer
      waits, to get as many tasks as the measured bytes need (coalesced
      partitions) and its joins decided on the measured size. Smaller ones
      run with their consumers: planning again costs more than it can save.

    The wave is every stage that has not run and neither waits nor reads one
    that does; the head stage never runs in a wave.

    Returns:
        Stage ids, producers first.
    """
    by_id = {s.stage_id: s for s in graph.stages}
    waiting: set[int] = set()
    for consumer in graph.stages:
        sides = {
            i.stage_id
            for i in consumer.inputs
            if i.boundary == SHUFFLE
            and i.stage_id not in ran
            and by_id[i.stage_id].output.key_columns
        }
        if len(sides) >= 2:
            first = min(sides, key=lambda sid: (by_id[sid].estimated_bytes, sid))
            waiting |= sides - {first}
        for i in consumer.inputs:
            producer = by_id[i.stage_id]
            if i.stage_id in ran:
                continue
            if (
                i.boundary == BROADCAST
                and producer.output.kind == BROADCAST
                and producer.estimated_max_bytes > max_broadcast_bytes
            ) or (i.boundary == SHUFFLE and producer.estimated_bytes >= shuffle_bytes):
                waiting.add(consumer.stage_id)
    waiting.discard(graph.head.stage_id)
    if not waiting:
        return []
    blocked = set(waiting)
    for s in graph.stages:  # producers first: blocked propagates downstream
        if any(i.stage_id in blocked for i in s.inputs):
            blocked.add(s.stage_id)
    return [
        s.stage_id for s in graph.stages[:-1] if s.stage_id not in ran and s.stage_id not in blocked
    ]


def coalesce_partitions(
    graph: StageGraph, stats: dict[int, StageStats], config: PlannerConfig, ran: set[int]
) -> tuple[StageGraph, list[str]]:
    """Give stages reading measured shuffles as many tasks as their bytes need.

    A stage that has not run, reads every shuffle input from a stage with
    measured partitions (all ``n`` of them, ``n`` = its task count), and
    splits no source scan, gets ``config.estimator.shuffle_tasks(bytes,
    config.workers)`` tasks when that is fewer than ``n``: task *j* reads a contiguous group of
    partitions holding about ``bytes / tasks`` bytes (Spark's
    ``CoalesceShufflePartitions``, whose groups are contiguous too). Every
    shuffle input gets the same groups, so co-partitioned inputs stay aligned.

    Returns:
        The graph with those stages rewritten, and one line per rewrite.
    """
    notes: list[str] = []
    stages = []
    for s in graph.stages:
        shuffled = [i for i in s.inputs if i.boundary == SHUFFLE]
        if (
            s.stage_id in ran
            or s.num_tasks < 2
            or not shuffled
            or any(i.groups is not None or i.stage_id not in stats for i in shuffled)
            or any(not scan.replicated for scan in s.scans)
            or any(len(stats[i.stage_id].partition_bytes) != s.num_tasks for i in shuffled)
        ):
            stages.append(s)
            continue
        producers = {i.stage_id for i in shuffled}
        sizes = [
            sum(stats[sid].partition_bytes[p] for sid in producers) for p in range(s.num_tasks)
        ]
        total = sum(sizes)
        want = max(1, min(s.num_tasks, config.tasks.shuffle_tasks(total, config.workers)))
        if want >= s.num_tasks:
            stages.append(s)
            continue
        groups = _contiguous_groups(sizes, want)
        inputs = tuple(replace(i, groups=groups) if i.boundary == SHUFFLE else i for i in s.inputs)
        stages.append(replace(s, num_tasks=len(groups), inputs=inputs))
        notes.append(
            f"stage {s.stage_id}: {s.num_tasks} -> {len(groups)} tasks, shuffle partitions "
            f"coalesced ({_mib(total)} measured)"
        )
    return replace(graph, stages=tuple(stages)), notes


def _contiguous_groups(sizes: list[int], groups: int) -> tuple[tuple[int, ...], ...]:
    """``range(len(sizes))`` cut into at most ``groups`` contiguous runs of similar total size."""
    target = sum(sizes) / groups
    out: list[tuple[int, ...]] = []
    current: list[int] = []
    acc = 0.0
    for p, size in enumerate(sizes):
        if current and acc + size > target * 1.2 and len(out) < groups - 1:
            out.append(tuple(current))
            current, acc = [], 0.0
        current.append(p)
        acc += size
    out.append(tuple(current))
    return tuple(out)


def _describe_changes(
    before: StageGraph, after: StageGraph, stats: dict[int, StageStats]
) -> list[str]:
    """What planning again over ``stats`` changed from ``before`` to ``after``, one line each.

    A stage that ran and is now read another way than its output was cut (a
    shuffle read as a broadcast), and every stage of ``before`` that had not
    run and is gone from ``after`` (planned again over the measured sizes).
    """
    notes = []
    before_ids = {s.stage_id for s in before.stages}
    for s in after.stages:
        for i in s.inputs:
            st = stats.get(i.stage_id)
            producer = after.stage(i.stage_id)
            if st is None or i.stage_id not in before_ids or i.boundary != BROADCAST:
                continue
            if producer.output.kind != BROADCAST:
                notes.append(
                    f"stage {producer.stage_id} ({producer.output.kind} output, estimated "
                    f"{_mib(producer.estimated_bytes)}) measured {_mib(st.bytes)}, {st.rows} "
                    f"rows: read as a broadcast by stage {s.stage_id}"
                )
    measured = ", ".join(
        f"stage {sid} {_mib(st.bytes)}" for sid, st in stats.items() if sid in before_ids
    )
    kept = {s.computation for s in after.stages}
    for s in before.stages[:-1]:
        if s.computation not in kept and s.stage_id not in stats:
            notes.append(
                f"stage {s.stage_id} as planned (estimated {_mib(s.estimated_bytes)}, output "
                f"{s.output.describe()}) planned again over the measured sizes ({measured})"
            )
    return notes


def run_adaptive(
    plan: Planner,
    runtime: Runtime,
    query_id: str,
    config: PlannerConfig,
    shuffle_bytes: float,
    report: AdaptiveReport | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run a query adaptively on ``runtime``; yield the head stage's batches.

    Args:
        plan: plans the query over the stages that ran (called once, plus once
            per wave).
        runtime: runs the stages (:meth:`Runtime.start_query`).
        query_id: the query's UUID.
        config: the planner's settings: its task estimator sizes coalesced
            stages, ``max_broadcast_bytes`` bounds broadcasts (:func:`next_wave`).
        shuffle_bytes: a shuffle estimated this large is measured before its
            consumers are planned (:func:`next_wave`).
        report: filled in as the query runs (graphs, measured sizes, decisions).

    Raises:
        PlanningError: a plan over measured sizes cannot be made.
        TaskError, TransportError: as :meth:`Runtime.execute`.
    """
    report = report if report is not None else AdaptiveReport()
    run = runtime.start_query(query_id)
    try:
        graph = plan_final(plan, run, config, shuffle_bytes, report)
        yield from run.stream_head(graph)
    finally:
        run.close()


def plan_final(
    plan: Planner,
    run,
    config: PlannerConfig,
    shuffle_bytes: float,
    report: AdaptiveReport,
) -> StageGraph:
    """Run the waves adaptive execution needs on ``run``; the final graph (head not run).

    What :func:`run_adaptive` does before it streams the head stage, for
    callers that run the head themselves (results that stay distributed).
    ``run`` is a :class:`~distfusion.coordinator.query_run.QueryRun`; the caller closes it.

    Raises:
        PlanningError, TaskError, TransportError: as :func:`run_adaptive`.
    """
    materialized: dict[str, MaterializedStage] = {}
    ran: set[int] = set()
    graph = plan(materialized, 1)
    report.graphs.append(graph)
    for _ in range(MAX_WAVES):
        wave = next_wave(graph, ran, config.broadcast_limit, shuffle_bytes)
        if not wave:
            break
        graph, notes = coalesce_partitions(graph, report.stats, config, ran)
        report.decisions.extend(notes)
        stats = run.run_stages(graph, wave)
        report.stats.update(stats)
        for sid in wave:
            stage = graph.stage(sid)
            st = stats[sid]
            # A computation planned twice in one graph (cut two ways) ran
            # twice: later plans read the first; the second stays known
            # (under its id) to stages that read it.
            key = stage.computation
            if key in materialized:
                key = f"{key}@{sid}"
            materialized[key] = MaterializedStage(stage, st.rows, st.bytes)
            ran.add(sid)
        before = graph
        graph = plan(materialized, max(ran) + 1)
        changes = _describe_changes(before, graph, report.stats)
        report.decisions.extend(c for c in changes if c not in report.decisions)
        report.graphs.append(graph)
    graph, notes = coalesce_partitions(graph, report.stats, config, ran)
    report.decisions.extend(notes)
    report.graphs[-1] = graph
    return graph
