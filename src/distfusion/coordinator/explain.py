"""The distributed plan rendered: EXPLAIN text, Graphviz DOT, HTML, and EXPLAIN rows.

:class:`ExplainRendering` is the part of
:class:`~distfusion.context.DistributedDataFrame` that renders its plan (the
static plan, or the graphs of the last adaptive run and their decisions) and,
after a run, the plan annotated with its metrics (:mod:`distfusion.metrics.render`).
:func:`explain_rows` is what an ``EXPLAIN`` statement returns, as DataFusion's.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from distfusion.coordinator.checks import first_line
from distfusion.coordinator.hosts import FrameHost
from distfusion.metrics.render import analyzed_text, to_dot, to_html
from distfusion.planner.config import RuntimeProfile
from distfusion.protocol.task_plan import TaskPlan
from distfusion.stages import StageGraph
from distfusion.worker.execute_task import build_dataframe

EXPLAIN = re.compile(
    r"^\s*EXPLAIN\s+(?:(ANALYZE)\s+)?(?:(VERBOSE)\s+)?(?:FORMAT\s+(\w+)\s+)?(.+)$",
    re.IGNORECASE | re.DOTALL,
)


EXPLAIN_FORMATS = {
    "text": "text",
    "indent": "text",
    "tree": "text",
    "dot": "dot",
    "graphviz": "dot",
}
"""``EXPLAIN FORMAT`` names (DataFusion's and ours) -> ``DistributedDataFrame.explain`` formats."""


EXPLAIN_SCHEMA = pa.schema([("plan_type", pa.string()), ("plan", pa.string())])
"""The columns of an ``EXPLAIN`` result, as DataFusion's."""


FORMATS = ("text", "dot", "html")
"""Formats of :meth:`DistributedDataFrame.explain`."""


def coordinator_graph(query_id: str = "") -> StageGraph:
    """An empty stage graph: what a query run whole on the coordinator has."""
    return StageGraph(query_id, ())


def explain_rows(df: Any, analyze: bool, verbose: bool, format: str) -> list[tuple[str, str]]:
    """The rows ``(plan_type, plan)`` of ``EXPLAIN`` over ``df``'s query (a DistributedDataFrame).

    ``EXPLAIN``: ``logical_plan`` (DataFusion's optimized logical plan) and
    ``distributed_plan`` (:meth:`DistributedDataFrame.explain`); with
    ``VERBOSE``, the physical plans of the stages are part of the latter.
    ``EXPLAIN ANALYZE``: one row ``Plan with Metrics`` (DataFusion's name),
    the plan annotated with the metrics of the run just made.

    Raises:
        PlanningError, TaskError, TransportError: with ``analyze``, as
            :meth:`DistributedDataFrame.execute_stream`.
    """
    if analyze:
        return [("Plan with Metrics", df.explain(analyze=True, verbose=verbose, format=format))]
    logical = df.df.optimized_logical_plan().display_indent()
    return [
        ("logical_plan", logical),
        ("distributed_plan", df.explain(verbose=verbose, format=format)),
    ]


class ExplainRendering(FrameHost):
    """The plan renderings of a :class:`~distfusion.context.DistributedDataFrame` (a mixin).

    Reads the frame's ``df``, ``context``, ``last_run``, ``_metrics``,
    ``coordinator_only()``, ``runs_in_place()``, ``stage_graph()`` and
    ``feed_metrics()``.
    """

    def _ran_graph(self) -> StageGraph | None:
        """The graph of the last run (else the static plan); None for a coordinator-only query."""
        if self.coordinator_only() is not None:
            return None
        if self.last_run is not None and self.last_run.graphs:
            return self.last_run.final
        return self.stage_graph()

    def _analyzed(self, verbose: bool) -> str:
        """The plan of the last run annotated with its metrics (EXPLAIN ANALYZE text)."""
        metrics = self._metrics
        graph = self._ran_graph()
        if metrics is None:
            return self._plan_text()
        if graph is None or self.runs_in_place() is not None:
            how = "on the coordinator" if graph is None else "in place on the coordinator"
            return (
                f"{self._plan_text()}\nQuery {metrics.query_id[:8]} ran {how}: "
                f"{metrics.rows:,} rows in {metrics.elapsed_s:.3f} s"
            )
        text = analyzed_text(graph, metrics, verbose)
        if self.last_run is not None and self.last_run.graphs:
            rest = self.last_run.render().split("\n")
            # the adaptive report after the graph: measured sizes and decisions
            tail = rest[len(graph.render().split("\n")) :]
            text += "\n" + "\n".join(tail)
        return text + self._notes()

    def _physical_plans(self, graph: StageGraph) -> dict[int, str]:
        """Stage id -> the physical plan DataFusion makes here of its task 0 (nothing runs).

        Inputs are bound as empty tables, so sizes and partitionings are
        those of empty inputs; a stage reading a work unit feed is left out.
        """
        out = {}
        for stage in reversed(graph.stages):
            if any(scan.source.is_feed for scan in stage.scans):
                out[stage.stage_id] = "(reads a work unit feed: planned as units arrive)"
                continue
            workers = tuple(("",) * graph.stage(i.stage_id).num_tasks for i in stage.inputs)
            plan = TaskPlan.for_task(graph.query_id, stage, 0, workers, 1)
            try:
                _, df = build_dataframe(plan, lambda i: [])
                out[stage.stage_id] = df.execution_plan().display_indent()
            except Exception as exc:  # DataFusion's: a picture is not worth failing for
                out[stage.stage_id] = f"(cannot plan it here: {first_line(exc)})"
        return out

    def _plan_text(self) -> str:
        """The text of ``explain()`` with no argument."""
        reason = self.coordinator_only()
        if reason is not None:
            plan = self.df.optimized_logical_plan().display_indent()
            return f"coordinator only (single-node DataFusion): {reason}\n{plan}"
        if self.last_run is not None and self.last_run.graphs:
            text = self.last_run.render()
        else:
            text = self.stage_graph().render()
        small = self.runs_in_place()
        if small is not None:  # the stages are what in_place_bytes=0 would run
            text = (
                f"runs in place on the coordinator (single-node DataFusion): {small}; "
                f"with in_place_bytes=0, these stages:\n{text}"
            )
        return text + self._notes()

    def _notes(self) -> str:
        """Lines after the plan: feed metrics, what the runtime says of how it moves data."""
        feeds = self._feed_text()
        # Spark: its data plane over TLS when Spark encrypts, or why not Flight.
        note = RuntimeProfile.of(self.context.runtime).explain_note
        return ("\n" + feeds if feeds else "") + ("\n" + note if note else "")

    def _feed_text(self) -> str:
        """The feed metrics of the last run as explain() lines ("" without feeds)."""
        metrics = self.feed_metrics()
        if not metrics:
            return ""
        lines = ["Work unit feeds (last run):"]
        for table, parts in metrics.items():
            lines.append(f"  {table}:")
            source = self.context._feed_sources.get(table)
            said = source.describe_run() if source is not None else ""  # the last query's
            if said:
                lines.append(f"    {said}")
            lines.extend(f"    {m.describe()}" for m in parts)
        return "\n".join(lines)

    def _rendered(self, verbose: bool, format: str) -> str:
        """``explain(verbose, format=format)`` without ``analyze`` (``format`` checked)."""
        if format == "text" and not verbose:
            return self._plan_text()
        graph = self._ran_graph()
        if format == "dot":
            return to_dot(graph or coordinator_graph(), self._metrics)
        if format == "html":
            text = self.explain(verbose=verbose)
            return to_html(graph or coordinator_graph(), self._metrics, text)
        text = self._plan_text()
        if graph is not None:
            lines = ["Physical plans (task 0 of each stage, planned here):"]
            for sid, plan in self._physical_plans(graph).items():
                lines.append(f"  Stage {sid}:")
                lines.extend("    " + ln for ln in plan.rstrip().splitlines())
            text += "\n" + "\n".join(lines)
        return text

    def _rendered_run(self, verbose: bool, format: str) -> str:
        """``explain_run(verbose, format)`` (``format`` checked)."""
        graph = self._ran_graph()
        if format == "dot":
            return to_dot(graph or coordinator_graph(), self._metrics)
        text = self._analyzed(verbose)
        if format == "html":
            return to_html(graph or coordinator_graph(), self._metrics, text)
        return text
