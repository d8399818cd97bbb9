"""Filter an aggregate's input by the keys a selective join side can match.

A join of a selective side with a grouped aggregate on its grouping key keeps
only the groups whose key the selective side holds. TPC-H Q17 joins the 0.1%
of ``part`` with ``Brand#23`` and ``MED BOX`` to ``avg(l_quantity)`` grouped
by ``l_partkey`` over all six million lineitems; Q20 does the same with the
parts named ``forest%``. The planner's own semi-join reduction
(``inject_runtime_filters``) cannot help there: by the time it sees the
join, the aggregate's partial stage is already cut. This rewrite runs first,
on the Substrait plan, and copies the selective side's filtered scan below the
aggregate as a left semi join on the grouping key::

    Join(a = k)                           Join(a = k)
      ... a from Filter(Read T) ...  ==>    ... a from Filter(Read T) ...
      Aggregate(group by k)                 Aggregate(group by k)
        input                                 LeftSemi(k = a')
                                                input
                                                Filter(Read T)   (a copy)

This is Spark's ``InjectRuntimeFilter``: its creation side is likewise a
*selective filter over a scan* copied from the other side of the join (there
as a Bloom filter aggregate, here as an exact semi join, which the planner
broadcasts), and its filter reaches below the aggregate because it is on the
grouping key. Dropping whole groups whose key no row of the other side has
cannot change an inner or semi join's result; NULL keys never match ``=``.

The selective side's key is traced down through projections, filters, inner
joins (either side) and semi joins (left side), and across their equi-join
keys (``a = b`` carries the restriction from ``b`` to ``a``). The copied scan
must keep at most :data:`~distfusion.planner.estimate.REDUCTION_KEPT` of its
table, the aggregate's input tables must be at least
:data:`~distfusion.planner.estimate.REDUCTION_RATIO` times larger, and the
copy must be estimated at most ``runtime_filter_bytes``, or fit as a runtime
filter's side does (``PlannerConfig.reduction_fits``): the copy grows with
the data, and a fixed bound would stop the rewrite at scale (TPC-H Q17 at
SF30: the 0.1% of ``part`` is estimated at 12 MiB, the filter's selectivity
being floored at 5%).
"""

from __future__ import annotations

from collections.abc import Callable

from substrait.proto import JoinRel, Plan, Rel

from distfusion.io.sources import TableSource
from distfusion.planner.estimate import (
    REDUCTION_RATIO,
    REDUCTION_SIDE_FACTOR,
    selective_scan_bytes,
)
from distfusion.planner.push_semi_joins import push_semi_join
from distfusion.substrait_plan.build import (
    before_emit,
    boolean_type,
    field_ref,
    is_field_ref,
    join_rel,
)
from distfusion.substrait_plan.rewrite import RelRewrite, SchemaOracle
from distfusion.substrait_plan.walk import (
    children,
    rel_kind,
    set_children,
    source_tables,
)

__all__ = ["reduce_aggregate_inputs"]

_J = JoinRel
# Join types whose unmatched rows of either side never reach the output.
_BOTH_MATCHED = {_J.JOIN_TYPE_INNER, _J.JOIN_TYPE_LEFT_SEMI}


def _under_projections(rel: Rel) -> str:
    """The kind of the first relation under ``rel``'s projections and filters."""
    while rel_kind(rel) in ("project", "filter"):
        rel = children(rel)[0]
    return rel_kind(rel)


class _Reducer(RelRewrite):
    def __init__(
        self,
        plan: Plan,
        oracle: SchemaOracle,
        sources: dict[str, TableSource],
        limit: int,
        fits: Callable[[float, float], bool] | None,
    ) -> None:
        super().__init__(plan, oracle)
        self.sources = sources
        self.limit = limit
        self.fits = fits

    def rewrite(self, rel: Rel) -> Rel:
        if rel_kind(rel) == "join" and rel.join.type in _BOTH_MATCHED:
            return self.reduce(rel)
        return rel

    # ------------------------------------------------------------------ the join
    def reduce(self, join: Rel) -> Rel:
        """``join`` with an aggregate side's input filtered by the other side's keys."""
        if not any(_under_projections(side) == "aggregate" for side in children(join)):
            return join  # nothing to reduce: skip tracing the keys (a deep join is costly)
        for a, b in self.key_pairs(join):
            for agg_side, key, other, other_key in (
                ("right", b, join.join.left, a),
                ("left", a, join.join.right, b),
            ):
                if agg_side == "left" and join.join.type != _J.JOIN_TYPE_INNER:
                    continue  # a semi join's right side is only ever tested
                side = join.join.right if agg_side == "right" else join.join.left
                creation = self.creation_side(other, other_key)
                if creation is None:
                    continue
                reduced = self.below_aggregate(side, key, *creation)
                if reduced is None:
                    continue
                out = Rel()
                out.CopyFrom(join)
                getattr(out.join, agg_side).CopyFrom(reduced)
                return out
        return join

    # ------------------------------------------------------------------ creation side
    def creation_side(self, rel: Rel, column: int) -> tuple[Rel, int] | None:
        """A selective filtered scan holding every value ``rel``'s ``column`` takes.

        Returns ``(subtree, its column)``, or None when the trace finds none.
        """
        if self._selective_scan(rel):
            return rel, column
        kind = rel_kind(rel)
        pre = before_emit(rel, column)
        if kind == "project":
            source = self.project_sources(rel, [column])
            return None if source is None else self.creation_side(rel.project.input, source[column])
        if kind in ("filter", "sort", "fetch"):
            return self.creation_side(children(rel)[0], pre)
        if kind != "join" or rel.join.type not in _BOTH_MATCHED:
            return None
        width = self.arity(rel.join.left)
        pairs = self.key_pairs(rel)
        if pre < width:
            options = [(rel.join.left, pre)] + [(rel.join.right, b) for a, b in pairs if a == pre]
        else:
            right = pre - width
            options = [(rel.join.right, right)] + [
                (rel.join.left, a) for a, b in pairs if b == right
            ]
        for child, col in options:
            found = self.creation_side(child, col)
            if found is not None:
                return found
        return None

    def _selective_scan(self, rel: Rel) -> bool:
        """Whether ``rel`` may be the copied scan: selective, within the bound ``fits`` allows."""
        estimated = selective_scan_bytes(rel, self.registry, self.sources)
        bound = self.limit * (REDUCTION_SIDE_FACTOR if self.fits else 1)
        return self.limit > 0 and estimated is not None and estimated <= bound

    # ------------------------------------------------------------------ aggregate side
    def below_aggregate(self, rel: Rel, column: int, creation: Rel, key: int) -> Rel | None:
        """``rel`` with a semi join on ``creation``'s ``key`` under the aggregate of ``column``."""
        kind = rel_kind(rel)
        pre = before_emit(rel, column)
        if kind == "project":
            source = self.project_sources(rel, [column])
            if source is None:
                return None
            below = self.below_aggregate(rel.project.input, source[column], creation, key)
            return None if below is None else set_children(rel, [below])
        if kind == "filter":
            below = self.below_aggregate(rel.filter.input, pre, creation, key)
            return None if below is None else set_children(rel, [below])
        if kind != "aggregate" or len(rel.aggregate.groupings) != 1:
            return None
        groups = rel.aggregate.grouping_expressions
        group_column = is_field_ref(groups[pre]) if pre < len(groups) else None
        if group_column is None:
            return None
        agg_input = rel.aggregate.input
        if not self._pays(agg_input, creation):
            return None
        equal = self.registry.call(
            "equal",
            field_ref(group_column),
            field_ref(self.arity(agg_input) + key),
            output_type=boolean_type(),
        )
        semi = join_rel(agg_input, creation, equal, _J.JOIN_TYPE_LEFT_SEMI)
        return set_children(rel, [push_semi_join(semi, self.plan, self.oracle)])

    def _pays(self, agg_input: Rel, creation: Rel) -> bool:
        """Whether the aggregate reads at least REDUCTION_RATIO times the creation side's table.

        And whether the copy fits (``fits``; without it, at most ``runtime_filter_bytes``).
        """
        read = sum(self.sources[t].size_bytes for t in source_tables(agg_input, self.sources))
        table = sum(self.sources[t].size_bytes for t in source_tables(creation, self.sources))
        if read < REDUCTION_RATIO * table:
            return False
        estimated = selective_scan_bytes(creation, self.registry, self.sources) or 0.0
        return self.fits(estimated, read) if self.fits else estimated <= self.limit


def reduce_aggregate_inputs(
    plan: Plan,
    oracle: SchemaOracle,
    sources: dict[str, TableSource],
    runtime_filter_bytes: int,
    fits: Callable[[float, float], bool] | None = None,
) -> Plan:
    """Rewrite ``plan`` in place: aggregates joined on their keys read only matching rows.

    Args:
        plan: a Substrait plan with one root relation.
        oracle: gives the column counts of subtrees.
        sources: every registered table, by name (sizes for the estimates).
        runtime_filter_bytes: the largest estimated creation side (bytes); 0 turns
            the rewrite off.
        fits: ``(copy bytes, aggregate input bytes) -> bool``, whether a copy
            fits (``PlannerConfig.reduction_fits``; it may allow up to
            ``REDUCTION_SIDE_FACTOR`` times ``runtime_filter_bytes``); None: a
            copy of at most ``runtime_filter_bytes``.

    Returns:
        ``plan``, modified.

    Raises:
        PlanningError: DataFusion cannot consume a subtree (from ``oracle``).
    """
    return _Reducer(plan, oracle, sources, runtime_filter_bytes, fits).apply()
