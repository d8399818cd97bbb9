"""The planner's entry (:mod:`distfusion.planner.plan`): its passes, called in order.

Real plans from DataFusion over the small tables of tests/planner/helpers.py,
planned the way ``coordinator/execution.py`` plans them: DataFusion's Substrait plan,
:func:`prepare_substrait`, then :func:`plan_stages` on a copy.
"""

from __future__ import annotations

import dataclasses

import pytest

from distfusion import DistributedConfig
from distfusion.errors import NotDistributableError, PlanningError
from distfusion.planner.config import PlannerConfig
from distfusion.planner.plan import plan_stages, prepare_substrait
from distfusion.stages import BROADCAST, COALESCE
from tests.planner.helpers import check_well_formed, edges, substrait_of


def _planned(contexts, sql: str, prepare: bool = True):
    """The graph plan_stages makes of ``sql``, as coordinator/execution.py would (or without prepare_substrait)."""
    ctx, _ = contexts
    plan, logical = substrait_of(ctx.ctx, sql)
    if prepare:
        prepare_substrait(plan, logical)
    config = PlannerConfig.for_runtime(ctx.config, ctx.runtime)
    return plan_stages(plan, ctx.sources, config)


def test_the_entry_plans_what_the_context_plans(small):
    ctx, _ = small
    sql = "SELECT t.k, count(*) AS n FROM t WHERE t.k NOT IN (SELECT k FROM u) GROUP BY t.k"
    graph = _planned(small, sql)
    check_well_formed(graph)
    assert graph.render() == ctx.sql(sql).stage_graph().render()


def test_prepare_substrait_runs_before_stages_are_cut(small):
    # An uncorrelated EXISTS: the producer writes a semi join on nothing, which
    # DataFusion's consumer rejects (repair_substrait, pass 2, joins it on true).
    sql = "SELECT k FROM t WHERE EXISTS (SELECT 1 FROM u)"
    with pytest.raises(NotDistributableError, match="join condition should not be empty"):
        _planned(small, sql, prepare=False)
    graph = _planned(small, sql)
    check_well_formed(graph)
    assert [b for _, b, _ in edges(graph)] == [BROADCAST, COALESCE]


def test_not_in_is_planned_as_the_null_aware_join_it_is(small):
    # Without pass 1 the anti join keeps a plain equi key (NOT IN's NULL rule lost);
    # with it, the condition tests for NULLs and the subquery side is broadcast.
    sql = "SELECT k FROM t WHERE k NOT IN (SELECT k FROM u)"
    plain = _planned(small, sql, prepare=False)
    rewritten = _planned(small, sql)
    assert "IS NULL" not in plain.render() and "IS NULL" in rewritten.render()
    assert BROADCAST in [b for _, b, _ in edges(rewritten)]


def test_no_worker_is_a_planning_error(small):
    ctx, _ = small
    plan, logical = substrait_of(ctx.ctx, "SELECT k FROM t")
    config = PlannerConfig.for_runtime(DistributedConfig(), ctx.runtime)
    with pytest.raises(PlanningError, match="no workers"):
        plan_stages(
            prepare_substrait(plan, logical), ctx.sources, dataclasses.replace(config, workers=0)
        )
