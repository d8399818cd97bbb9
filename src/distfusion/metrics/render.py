"""Pictures of a distributed plan and what it did: EXPLAIN ANALYZE text, Graphviz DOT, HTML.

All three take the stage graph that ran and, after a run, its
:class:`~distfusion.metrics.query.QueryMetrics`; without metrics they draw the
plan alone. Sizes are printed in binary units (KiB, MiB) and seconds.

The DOT picture (render with ``dot -Tsvg plan.dot -o plan.svg``)::

    ┌──────────────────────┐
    │ Stage 3 (head)       │      one box per stage: id, role, tasks, and after
    │ 1 task · 5 rows      │      a run rows, bytes, task seconds (min/median/max)
    └──────────▲───────────┘
               │ coalesce · 25 rows · 2.0 KiB        edges: the boundary and what crossed
    ┌──────────┴───────────┐
    │ Stage 2 · 2 tasks    │
    └──────────────────────┘
"""

from __future__ import annotations

import html
import re

from distfusion.metrics.query import QueryMetrics, StageMetrics
from distfusion.metrics.task import OperatorMetrics, TaskMetrics
from distfusion.stages import Stage, StageGraph

__all__ = [
    "analyzed_text",
    "format_bytes",
    "memory_line",
    "physical_plan_text",
    "to_dot",
    "to_html",
]


def format_bytes(nbytes: float) -> str:
    """``nbytes`` as ``512 B``, ``1.5 KiB``, ``3.2 MiB`` or ``1.1 GiB``."""
    if nbytes < 1024:
        return f"{int(nbytes)} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}"
    raise AssertionError("unreachable")


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s"


def _stage_line(sm: StageMetrics) -> str:
    """The metrics of one stage on one line."""
    parts = [f"{sm.output_rows:,} rows, {format_bytes(sm.output_bytes)} out"]
    t = sm.task_elapsed_s
    if sm.num_tasks > 1:
        r = sm.task_output_rows
        parts.append(
            f"task time min {_s(t.min)} / median {_s(t.median)} / max {_s(t.max)} "
            f"(skew {t.skew:.1f}x)"
        )
        parts.append(
            f"rows per task {r.min:,.0f} / {r.median:,.0f} / {r.max:,.0f} (skew {r.skew:.1f}x)"
        )
    else:
        parts.append(f"time {_s(t.max)}")
    parts.append(f"cpu {_s(sm.cpu_s)}")
    parts.append(f"input wait {_s(sm.input_wait_s)}")
    if sm.source_bytes:
        parts.append(f"read {format_bytes(sm.source_bytes)} from sources")
    if sm.spilled_bytes:
        parts.append(f"spilled {format_bytes(sm.spilled_bytes)}")
    again = [t for t in sm.tasks if t.memory_retries]
    if again:
        hows = [h for t in again for h in t.memory_retries]
        counts = ", ".join(f"{h} {hows.count(h)}" for h in dict.fromkeys(hows))
        parts.append(f"over the memory budget, {len(again)} ran again ({counts})")
    if len(sm.tasks) < sm.num_tasks:
        parts.append(f"metrics of {len(sm.tasks)} of {sm.num_tasks} tasks")
    return "; ".join(parts)


def memory_line(graph: StageGraph) -> str:
    """What a task of ``graph`` does over its memory budget, on one line (EXPLAIN ANALYZE).

    The budget (``StageGraph.memory_per_task_bytes``, else the runtime's) and
    whether a task still over it after sort-merge joins runs unbounded
    (``Stage.unbounded_memory_retry``) or fails.
    """
    budget = graph.memory_per_task_bytes
    size = "the runtime's" if budget is None else format_bytes(budget)
    unbounded = any(s.unbounded_memory_retry for s in graph.stages)
    last = "then without a bound" if unbounded else "else fails"
    return (
        f"Memory: {size} per task; over it a task spills, runs again with sort-merge "
        f"joins, {last} (unbounded_memory_retry {'on' if unbounded else 'off'})"
    )


def _task_line(m: TaskMetrics) -> str:
    return (
        f"task {m.task_index} on {m.worker}: {m.output_rows:,} rows, "
        f"{format_bytes(m.output_bytes)}, {_s(m.elapsed_s)}, cpu {_s(m.cpu_s)}, "
        f"input wait {_s(m.input_wait_s)}"
        + (f", read {format_bytes(m.source_bytes)}" if m.source_bytes else "")
    )


def _shape(task: TaskMetrics) -> list[tuple[int, str]]:
    """A task's plan as (depth, operator kind): tasks reading other files have the same shape."""
    return [(o.depth, o.operator.split(":", 1)[0].strip()) for o in task.operators]


def _summed_operators(tasks: tuple[TaskMetrics, ...]) -> tuple[list[OperatorMetrics], str]:
    """The operator tree of a stage's first task, metrics summed over the tasks of its shape."""
    if not tasks or not tasks[0].operators:
        return [], ""
    first = tasks[0].operators
    same = [t for t in tasks if _shape(t) == _shape(tasks[0])]
    out = []
    for i, op in enumerate(first):
        rows = [t.operators[i].output_rows for t in same]
        compute = [t.operators[i].elapsed_compute_s for t in same]
        spilled = [t.operators[i].spilled_bytes for t in same]
        out.append(
            OperatorMetrics(
                op.operator,
                op.depth,
                None if all(r is None for r in rows) else sum(r or 0 for r in rows),
                None if all(c is None for c in compute) else sum(c or 0 for c in compute),
                None if all(s is None for s in spilled) else sum(s or 0 for s in spilled),
            )
        )
    how = f"task {tasks[0].task_index}'s"
    if len(same) > 1:
        how += f", metrics summed over {len(same)} tasks"
    if len(same) < len(tasks):
        how += f"; {len(tasks) - len(same)} tasks ran another plan"
    return out, how


def _operator_lines(ops: list[OperatorMetrics], indent: str) -> list[str]:
    lines = []
    for op in ops:
        metrics = []
        if op.output_rows is not None:
            metrics.append(f"output_rows={op.output_rows:,}")
        if op.elapsed_compute_s is not None:
            metrics.append(f"elapsed_compute={op.elapsed_compute_s * 1000:.1f}ms")
        if op.spilled_bytes:
            metrics.append(f"spilled={format_bytes(op.spilled_bytes)}")
        tail = f"  [{', '.join(metrics)}]" if metrics else ""
        lines.append(f"{indent}{'  ' * op.depth}{op.operator.strip()}{tail}")
    return lines


def physical_plan_text(text: str, indent: str = "    ") -> list[str]:
    """DataFusion's indented physical plan ``text`` as lines under ``indent``."""
    return [indent + ln for ln in text.rstrip().splitlines()]


_STAGE = re.compile(r"^Stage (\d+) \[")
_INPUT = re.compile(r"^  <- (\w+) from stage (\d+) ")


def analyzed_text(
    graph: StageGraph,
    metrics: QueryMetrics,
    verbose: bool = False,
    physical: dict[int, str] | None = None,
) -> str:
    """``graph.render()`` annotated with ``metrics`` (EXPLAIN ANALYZE).

    Under each stage's header, a ``metrics:`` line (sums; per-task min /
    median / max and skew when it has several tasks); each input line gets
    the rows and bytes that crossed it. With ``verbose``, each stage also
    lists its tasks and the physical plan they ran with DataFusion's
    operator metrics (``physical``: stage id -> plan text, used for a stage
    whose tasks reported no operators).
    """
    by_stage = {s.stage_id: s for s in metrics.stages}
    moved = {(b.producer_stage_id, b.consumer_stage_id): b for b in metrics.boundaries}
    lines = [
        f"Query {metrics.query_id[:8]} on {metrics.runtime}: {metrics.rows:,} rows in "
        f"{_s(metrics.elapsed_s)}, {len(graph.stages)} stages, "
        f"{sum(s.num_tasks for s in graph.stages)} tasks, "
        f"{format_bytes(metrics.bytes_moved)} across network boundaries",
        memory_line(graph),
    ]
    current: int | None = None
    block: list[str] = []

    def flush() -> None:
        if current is None:
            return
        lines.extend(block)
        sm = by_stage.get(current)
        if verbose and sm is not None:
            lines.append("  tasks:")
            lines.extend(f"    {_task_line(t)}" for t in sm.tasks)
            ops, how = _summed_operators(sm.tasks)
            if ops:
                lines.append(f"  physical plan ({how}):")
                lines.extend(_operator_lines(ops, "    "))
            elif physical and current in physical:
                lines.append("  physical plan:")
                lines.extend(physical_plan_text(physical[current]))

    for ln in graph.render().splitlines():
        m = _STAGE.match(ln)
        if m:
            flush()
            current = int(m.group(1))
            block = [ln]
            sm = by_stage.get(current)
            if sm is not None:
                block.append(f"  metrics: {_stage_line(sm)}")
            continue
        m = _INPUT.match(ln)
        if m and current is not None:
            b = moved.get((int(m.group(2)), current))
            if b is not None:
                ln += f"  [moved {b.rows:,} rows, {format_bytes(b.bytes)}]"
        block.append(ln)
    flush()
    return "\n".join(lines)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _stage_label(graph: StageGraph, stage: Stage, sm: StageMetrics | None) -> list[str]:
    role = "head" if stage is graph.head else ("leaf" if stage.is_leaf else "")
    title = f"Stage {stage.stage_id}" + (f" ({role})" if role else "")
    tasks = f"{stage.num_tasks} task" + ("s" if stage.num_tasks != 1 else "")
    lines = [title, tasks]
    tables = [scan.source.name for scan in stage.scans]
    if tables:
        lines.append("scan " + ", ".join(tables))
    if sm is not None:
        lines.append(f"{sm.output_rows:,} rows, {format_bytes(sm.output_bytes)}")
        t = sm.task_elapsed_s
        if stage.num_tasks > 1:
            lines.append(f"task s {t.min:.2f}/{t.median:.2f}/{t.max:.2f} (skew {t.skew:.1f}x)")
        else:
            lines.append(f"{t.max:.2f} s")
    return lines


def to_dot(graph: StageGraph, metrics: QueryMetrics | None = None) -> str:
    """The stage graph as Graphviz DOT source (a ``digraph``).

    One box per stage (node ``stage_N``) with its role, task count, scanned
    tables and, with ``metrics``, its output and task seconds; one edge per
    stage input, producer to consumer, labelled with the boundary (shuffle,
    coalesce, broadcast) and, with ``metrics``, the rows and bytes moved.
    """
    by_stage = {s.stage_id: s for s in metrics.stages} if metrics else {}
    moved = (
        {(b.producer_stage_id, b.consumer_stage_id): b for b in metrics.boundaries}
        if metrics
        else {}
    )
    out = [
        "digraph distfusion {",
        "  rankdir=BT;",
        '  node [shape=box, style="rounded,filled", fillcolor="#f5f5f5", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    if metrics is not None:
        out.append(
            f'  label="query {metrics.query_id[:8]} on {metrics.runtime}: {metrics.rows:,} rows '
            f'in {metrics.elapsed_s:.3f} s";'
        )
    for stage in graph.stages:
        label = "\\n".join(
            _dot_escape(x) for x in _stage_label(graph, stage, by_stage.get(stage.stage_id))
        )
        color = ', fillcolor="#dbe9f6"' if stage is graph.head else ""
        out.append(f'  stage_{stage.stage_id} [label="{label}"{color}];')
    seen = set()
    for stage in graph.stages:
        for inp in stage.inputs:
            key = (inp.stage_id, stage.stage_id)
            if key in seen:
                continue
            seen.add(key)
            parts = [inp.boundary]
            b = moved.get(key)
            if b is not None:
                parts.append(f"{b.rows:,} rows, {format_bytes(b.bytes)}")
            style = ", style=dashed" if inp.boundary == "broadcast" else ""
            label = "\\n".join(_dot_escape(p) for p in parts)
            out.append(
                f'  stage_{inp.stage_id} -> stage_{stage.stage_id} [label="{label}"{style}];'
            )
    out.append("}")
    return "\n".join(out) + "\n"


def to_html(graph: StageGraph, metrics: QueryMetrics | None = None, text: str = "") -> str:
    """The stage graph (and metrics) as an HTML fragment for notebooks.

    A table with one row per stage (head first: id, role, tasks, output,
    inputs and, with ``metrics``, rows, bytes, task seconds min / median /
    max, CPU seconds), then ``text`` (the explain text) in a ``<pre>``.
    """
    by_stage = {s.stage_id: s for s in metrics.stages} if metrics else {}
    head = ["stage", "tasks", "output", "inputs"]
    if metrics:
        head += ["rows", "bytes", "task s (min / median / max)", "cpu s"]
    rows = []
    for stage in reversed(graph.stages):
        role = "head" if stage is graph.head else ("leaf" if stage.is_leaf else "")
        inputs = ", ".join(f"{i.boundary} from {i.stage_id}" for i in stage.inputs)
        scans = ", ".join(f"scan {s.source.name}" for s in stage.scans)
        cells = [
            f"{stage.stage_id}" + (f" ({role})" if role else ""),
            str(stage.num_tasks),
            "result" if stage is graph.head else stage.output.describe(),
            "; ".join(x for x in (inputs, scans) if x),
        ]
        sm = by_stage.get(stage.stage_id)
        if metrics:
            if sm is None:
                cells += ["", "", "", ""]
            else:
                t = sm.task_elapsed_s
                cells += [
                    f"{sm.output_rows:,}",
                    format_bytes(sm.output_bytes),
                    f"{t.min:.3f} / {t.median:.3f} / {t.max:.3f}",
                    f"{sm.cpu_s:.3f}",
                ]
        rows.append(
            f'<tr data-stage="{stage.stage_id}">'
            + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    caption = ""
    if metrics is not None:
        what = f"query {metrics.query_id[:8]} on {metrics.runtime}"
        caption = (
            f"<caption>{html.escape(what)}: "
            f"{metrics.rows:,} rows in {metrics.elapsed_s:.3f} s</caption>"
        )
    table = (
        '<table class="distfusion-stages">'
        + caption
        + "<thead><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    pre = f"<pre>{html.escape(text)}</pre>" if text else ""
    return f'<div class="distfusion-plan">{table}{pre}</div>'
