"""The distributed planner's entry: every pass over a query's Substrait plan, in order.

Like datafusion-distributed's ``distributed_query_planner.rs``, this file is
the one place that says what runs and in which order; each pass is a module
of its own. A query's Substrait plan (DataFusion's producer, over the
optimized logical plan) goes through two phases, both on the coordinator::

    DataFusion's Substrait plan
      |  prepare_substrait          once per query, in place
      |    0. join_hints                     Spark SQL's join hints onto the joins
      |    1. rewrite_null_aware_anti_join   NOT IN keeps its NULL semantics
      |    2. repair_substrait               what the consumer would reject
      |  (coordinator/checks.py then asks detect_substrait_losses whether it lost
      |   meaning on the way: then the query runs on the coordinator only)
      v
    the query's Substrait plan
      |  plan_stages                on a copy, once per planning (adaptive
      |                             execution plans again over stages that ran)
      |    3. push_semi_joins                semi joins below inner joins
      |    4. push_dimension_joins           filtered dimensions joined first
      |    5. aggregate_before_joins         the many side of a join counted
      |                                      per key before it (eager aggregation)
      |    6. reduce_aggregate_inputs        an aggregate's input filtered by
      |                                      a selective join side
      |    7. inject_network_boundaries      the walk: cut stages at shuffle,
      |         coalesce and broadcast boundaries, with distribute_joins,
      |         inject_runtime_filters, reuse_exchanges, plan_subqueries,
      |         decompose_aggregate, prune_partitions, scan_filters and
      |         skip_units deciding as it goes
      v
    StageGraph (stages producers first, the head stage last)

A new rewrite of the Substrait plan before stages are cut is a
:class:`~distfusion.substrait_plan.rewrite.RelRewrite` called below, in order
with the others; a rule about where a network boundary goes is a mixin of the
walk (as :mod:`~distfusion.planner.distribute_joins` is). docs/architecture.md
has the map.
"""

from __future__ import annotations

from substrait.proto import Plan

from distfusion.errors import PlanningError
from distfusion.io.sources import TableSource
from distfusion.planner.aggregate_before_join import aggregate_before_joins
from distfusion.planner.config import PlannerConfig
from distfusion.planner.fragment import MaterializedStage
from distfusion.planner.inject_network_boundaries import inject_network_boundaries
from distfusion.planner.join_hints import mark_join_hints
from distfusion.planner.push_dimension_joins import push_dimension_joins
from distfusion.planner.push_semi_joins import push_semi_joins
from distfusion.planner.reduce_aggregate_inputs import reduce_aggregate_inputs
from distfusion.planner.repair_substrait import repair_substrait
from distfusion.planner.rewrite_null_aware_anti_join import rewrite_null_aware_anti_joins
from distfusion.stages import StageGraph
from distfusion.substrait_plan.rewrite import SchemaOracle

__all__ = ["plan_stages", "prepare_substrait", "rewrite_joins"]


def prepare_substrait(plan: Plan, logical_plan) -> Plan:
    """Passes 0-2: make DataFusion's Substrait plan of a query one the planner can cut.

    Called once per query on the coordinator, right after DataFusion's
    producer; the plan is kept (as bytes) and every planning starts from it.

    Args:
        plan: the Substrait plan produced from ``logical_plan``; rewritten in place.
        logical_plan: DataFusion's optimized logical plan (a ``datafusion.LogicalPlan``).

    Returns:
        ``plan``, rewritten.

    Raises:
        NotDistributableError: the plan cannot keep its meaning through the
            planner (:mod:`~distfusion.planner.rewrite_null_aware_anti_join`,
            :mod:`~distfusion.planner.repair_substrait` say when); the query
            then runs on the coordinator only.
    """
    mark_join_hints(plan, logical_plan)
    rewrite_null_aware_anti_joins(plan, logical_plan)
    repair_substrait(plan)
    return plan


def plan_stages(
    plan: Plan,
    sources: dict[str, TableSource],
    config: PlannerConfig,
    materialized: dict[str, MaterializedStage] | None = None,
    query_id: str | None = None,
    first_stage_id: int = 1,
) -> StageGraph:
    """Passes 3-7: cut a query's Substrait plan into a :class:`StageGraph`.

    The plan is first rewritten in place by the join rules of
    :mod:`~distfusion.planner.push_semi_joins`,
    :mod:`~distfusion.planner.push_dimension_joins`,
    :mod:`~distfusion.planner.aggregate_before_join` and
    :mod:`~distfusion.planner.reduce_aggregate_inputs` (the second and the
    last only when ``config.runtime_filter_bytes`` is not 0), then cut into stages by
    :mod:`~distfusion.planner.inject_network_boundaries`.

    Args:
        plan: the Substrait plan DataFusion produced for the optimized logical
            plan, after :func:`prepare_substrait`; rewritten in place (pass a copy).
        sources: every registered table, by name.
        config: worker count, task estimator and broadcast threshold.
        materialized: stages of this query that ran already, by
            :attr:`Stage.computation` (adaptive execution). A subtree one of
            them computes is read from it, planned over its measured size;
            new stages get ids above theirs.
        query_id: the graph's query id (default: a new UUID).
        first_stage_id: the lowest id a new stage may get (adaptive execution:
            above every stage of the query that ran).

    Returns:
        The stages, producers first, the head stage (1 task) last.

    Raises:
        PlanningError: no worker.
        NotDistributableError: the plan reads a table with no distfusion source
            (a table function, an unregistered table), or a fragment cannot be
            expressed (DataFusion's message is kept).
    """
    if config.workers < 1:
        msg = "no workers: the worker resolver returned an empty list"
        raise PlanningError(msg)
    oracle = rewrite_joins(plan, sources, config)
    return inject_network_boundaries(
        plan, sources, config, oracle, materialized, query_id, first_stage_id
    )


def rewrite_joins(
    plan: Plan, sources: dict[str, TableSource], config: PlannerConfig
) -> SchemaOracle:
    """Passes 3-6: the join rules, on ``plan`` in place; the plan's schema oracle.

    :func:`plan_stages` cuts their result into stages; a query run in place
    runs it whole (``QueryExecution._in_place_df``): on TPC-H the rewritten
    plans run no slower in single-node DataFusion, and Q17's and Q18's in
    about half the time (docs/benchmarks.md, "Join rules in place").
    """
    functions = config.session.functions if config.session is not None else None
    oracle = SchemaOracle(plan, {n: s.schema for n, s in sources.items()}, functions)
    push_semi_joins(plan, oracle)
    push_dimension_joins(plan, oracle, sources, config.runtime_filter_bytes)
    aggregate_before_joins(plan, oracle, sources)
    reduce_aggregate_inputs(
        plan,
        oracle,
        sources,
        config.runtime_filter_bytes,
        lambda copy, read: config.reduction_fits(copy, read, config.task_cap),
    )
    return oracle
