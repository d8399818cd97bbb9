"""The plans really distribute: TPC-H Q1, Q3, Q5, Q9 and Q18 on four workers.

The tests run at scale factor 0.1, so the planner's byte thresholds are scaled
down by the same factor (1/10 of the defaults): the plans are then the ones the
defaults give at scale factor 1.
"""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.planner.config import MAX_BROADCAST_BYTES
from distfusion.planner.estimate import DefaultTaskEstimator
from distfusion.stages import BROADCAST, SHUFFLE, StageGraph

SCALED = DistributedConfig(
    bytes_per_task=DefaultTaskEstimator.bytes_per_task // 10,
    broadcast_threshold_bytes=DistributedConfig.broadcast_threshold_bytes // 10,
    max_broadcast_bytes=MAX_BROADCAST_BYTES // 10,
    replicate_scan_bytes=DistributedConfig.replicate_scan_bytes // 10,
)


@pytest.fixture(scope="module")
def ctx(runtime_for, tpch_dir):
    ctx = DistributedContext(runtime=runtime_for("local", 4), config=SCALED)
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _scan_stage(graph: StageGraph, table: str):
    """Stages scanning ``table`` (also as a read of its own: pruned, or in key ranges)."""
    return [
        s
        for s in graph.stages
        if any(sc.source.options.get("table", sc.source.name) == table for sc in s.scans)
    ]


def _fed_by(graph: StageGraph, stage_id: int, boundary: str) -> bool:
    return any(
        i.stage_id == stage_id and i.boundary == boundary for s in graph.stages for i in s.inputs
    )


@pytest.mark.parametrize("q", [1, 3, 5, 9, 18])
def test_leaf_stage_has_several_tasks_and_aggregate_is_shuffled(ctx, q):
    df = ctx.sql(tpch.query(q))
    graph = df.stage_graph()
    (lineitem,) = _scan_stage(graph, "lineitem")[:1]
    assert lineitem.num_tasks > 1, df.explain()
    # A grouped aggregate: partial below a shuffle by its keys, final above it.
    partial = [
        s
        for s in graph.stages
        if s.output.kind == SHUFFLE and s.output.key_columns and "Aggregate" in s.plan_text
    ]
    assert partial, df.explain()
    final = graph.consumers(partial[-1].stage_id)[0]
    assert "Aggregate" in final.plan_text
    assert "shuffle (hash" in df.explain()


@pytest.mark.parametrize(("q", "tables"), [(5, ["nation", "region"]), (9, ["nation"])])
def test_nation_and_region_are_broadcast(ctx, q, tables):
    """Every task joining with nation/region gets all their rows.

    Through a broadcast stage, or (tables this small) by reading them whole
    ("broadcast scan").
    """
    df = ctx.sql(tpch.query(q))
    graph = df.stage_graph()
    for table in tables:
        (stage,) = _scan_stage(graph, table)
        (scan,) = [s for s in stage.scans if s.source.name == table]
        if scan.replicated:
            assert stage.num_tasks > 1
            assert all(units == scan.source.units for units in scan.task_units)
            assert f"<- broadcast scan {table} " in df.explain()
        else:
            assert stage.output.kind == BROADCAST, graph.render()
            assert _fed_by(graph, stage.stage_id, BROADCAST)


def test_large_join_is_shuffled_on_both_sides(ctx):
    """Q18 joins all of lineitem with orders: both sides are shuffled by the order key."""
    graph = ctx.sql(tpch.query(18)).stage_graph()
    joins = [
        s
        for s in graph.stages
        if "Join" in s.plan_text and sum(i.boundary == SHUFFLE for i in s.inputs) >= 2
    ]
    assert joins, graph.render()
    assert joins[0].num_tasks == 4


def test_explain_names_stages_tasks_and_boundaries(ctx):
    text = ctx.sql(tpch.query(5)).explain()
    assert text.startswith("Stage 5 [head, 1 task]")
    assert "<- scan lineitem (4 work units, per task [1, 1, 1, 1])" in text
    assert "<- broadcast scan region (1 work units, every task reads all)" in text
    assert "output: broadcast -> 4 tasks" in text
    assert "<- coalesce from stage 4 (4 tasks)" in text
