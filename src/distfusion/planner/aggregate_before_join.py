"""Aggregate the many side of a join by its join key before the join (eager aggregation).

An aggregate grouped by columns of a join's left side, whose measures read
only the right side, can count the right side's rows per join key first:
each left row then meets one pre-aggregated row per key instead of every row
with it. TPC-H Q13 counts each customer's 15 million orders (SF10) through
``customer LEFT JOIN orders``; counted per ``o_custkey`` first, one million
rows reach the join, not fifteen million, and cross the shuffle::

    Aggregate(g; count(r.x), max(r.y))          Project(g, coalesce(c, 0), m)
      Join(l.k = r.k)                   ==>       Aggregate(g; c = sum(cx), m = max(my))
        L                                           Join(l.k = r'.k)
        R                                             L
                                                      Aggregate(r.k; cx = count(r.x), my = max(r.y))
                                                        R

This is Yan and Larson's eager aggregation ("Eager Aggregation and Lazy
Aggregation", VLDB 1995), for the case that needs no key on ``L``: every
measure is ``count``, ``min`` or ``max`` of a right column (``count`` adds up
its per-key counts, and an unmatched left row of a left join counts 0, as its
NULL did), the grouping keys are left columns, the join inner or left with
only ``l.k = r.k`` conjuncts. It pays when the right side has many rows per
key: its tables hold at least :data:`~distfusion.planner.estimate.REDUCTION_RATIO`
times the left side's rows (the foreign-key assumption: a left row per key),
and the left side is not a selective filtered scan, whose keys filter the
right side before it moves instead (a runtime filter, which leaves fewer rows).
The result is the same by relational algebra; the rewrite is dropped when
DataFusion would type its output differently.
"""

from __future__ import annotations

from substrait.proto import AggregateFunction, Expression, JoinRel, Plan, Rel

from distfusion.io.sources import TableSource
from distfusion.planner.estimate import REDUCTION_RATIO, selective_scan_bytes
from distfusion.substrait_plan.build import (
    before_emit,
    boolean_type,
    conjuncts,
    field_ref,
    is_field_ref,
    join_rel,
)
from distfusion.substrait_plan.rewrite import RelRewrite, SchemaOracle
from distfusion.substrait_plan.walk import rel_kind, source_tables

__all__ = ["aggregate_before_joins"]

_J = JoinRel
_JOINS = {_J.JOIN_TYPE_INNER, _J.JOIN_TYPE_LEFT}
_MEASURES = {"count", "min", "max"}


class _Eager(RelRewrite):
    def __init__(self, plan: Plan, oracle: SchemaOracle, sources: dict[str, TableSource]) -> None:
        super().__init__(plan, oracle)
        self.sources = sources

    def rewrite(self, rel: Rel) -> Rel:
        if rel_kind(rel) != "aggregate":
            return rel
        found = self._match(rel)
        if found is None:
            return rel
        new = self._build(rel, *found)
        want, got = self.oracle.schema(rel), self.oracle.schema(new)
        if want.types != got.types:  # DataFusion would type it otherwise: keep the original
            return rel
        return new

    def _rows(self, rel: Rel) -> float | None:
        """Rows of the largest source table ``rel`` reads; None when one is unknown."""
        rows = [self.sources[n].num_rows for n in source_tables(rel, self.sources)]
        known = [r for r in rows if r is not None]
        if not rows or len(known) < len(rows):
            return None
        return float(max(known))

    def _match(self, rel: Rel):
        """``(join, grouping columns, measure columns, key pairs)``, or None."""
        agg = rel.aggregate
        width = len(agg.grouping_expressions)
        if (
            agg.common.HasField("emit")
            or not width
            or [list(g.expression_references) for g in agg.groupings] != [list(range(width))]
        ):
            return None
        group_refs = [is_field_ref(e) for e in agg.grouping_expressions]
        arg_refs = []
        for m in agg.measures:
            f = m.measure
            if (
                self.registry.name(f.function_reference) not in _MEASURES
                or m.HasField("filter")
                or f.invocation == AggregateFunction.AGGREGATION_INVOCATION_DISTINCT
                or len(f.sorts)
                or len(f.arguments) != 1
            ):
                return None
            arg_refs.append(is_field_ref(f.arguments[0].value))
        refs = group_refs + arg_refs
        columns = [c for c in refs if c is not None]
        if not agg.measures or len(columns) < len(refs):
            return None
        inp = agg.input
        while rel_kind(inp) == "project":
            sources = self.project_sources(inp, set(columns))
            if sources is None:
                return None
            columns = [sources[c] for c in columns]
            inp = inp.project.input
        if rel_kind(inp) != "join" or inp.join.type not in _JOINS:
            return None
        join = inp.join
        if join.HasField("post_join_filter") or not join.HasField("expression"):
            return None
        left_width = self.arity(join.left)
        columns = [before_emit(inp, c) for c in columns]
        groups, args = columns[: len(group_refs)], columns[len(group_refs) :]
        if any(c >= left_width for c in groups) or any(c < left_width for c in args):
            return None
        pairs = self.key_pairs(inp)
        if len(pairs) != len(conjuncts(join.expression, self.registry)):
            return None  # a condition beyond the keys
        left_rows, right_rows = self._rows(join.left), self._rows(join.right)
        if not pairs or left_rows is None or right_rows is None:
            return None
        if right_rows < REDUCTION_RATIO * left_rows:
            return None
        if selective_scan_bytes(join.left, self.registry, self.sources) is not None:
            return None  # its keys filter the right side before it moves (a runtime filter)
        return inp, groups, [a - left_width for a in args], pairs

    def _build(self, rel: Rel, join: Rel, groups: list[int], args: list[int], pairs) -> Rel:
        agg = rel.aggregate
        left_width = self.arity(join.join.left)
        # The right side per key: its keys, then one partial measure per measure.
        partial = Rel()
        partial.aggregate.input.CopyFrom(join.join.right)
        for _, r in pairs:
            partial.aggregate.grouping_expressions.append(field_ref(r))
        partial.aggregate.groupings.add().expression_references.extend(range(len(pairs)))
        for m, a in zip(agg.measures, args, strict=True):
            f = partial.aggregate.measures.add().measure
            f.CopyFrom(m.measure)
            f.arguments[0].value.CopyFrom(field_ref(a))
        condition = self.registry.conjunction(
            [
                self.registry.call(
                    "equal", field_ref(lc), field_ref(left_width + i), output_type=boolean_type()
                )
                for i, (lc, _) in enumerate(pairs)
            ]
        )
        joined = join_rel(join.join.left, partial, condition, join.join.type)
        if join.join.HasField("advanced_extension"):  # a join hint (planner/join_hints.py)
            joined.join.advanced_extension.CopyFrom(join.join.advanced_extension)
        # The measures again over the partial ones: counts add up.
        final = Rel()
        final.aggregate.input.CopyFrom(joined)
        for g in groups:
            final.aggregate.grouping_expressions.append(field_ref(g))
        final.aggregate.groupings.add().expression_references.extend(range(len(groups)))
        first = left_width + len(pairs)
        counts = []
        for i, m in enumerate(agg.measures):
            name = self.registry.name(m.measure.function_reference)
            if name == "count":
                counts.append(i)
                f = self.registry.aggregate("sum", field_ref(first + i))
            else:
                f = AggregateFunction()
                f.CopyFrom(m.measure)
                f.arguments[0].value.CopyFrom(field_ref(first + i))
            final.aggregate.measures.add().measure.CopyFrom(f)
        if not counts:
            return final
        # A count is 0, not NULL, for a group no right row matched.
        out = Rel()
        out.project.input.CopyFrom(final)
        g = len(groups)
        for i in range(len(agg.measures)):
            expr = field_ref(g + i)
            if i in counts:
                zero = Expression()
                zero.literal.i64 = 0
                expr = self.registry.call("coalesce", expr, zero)
            out.project.expressions.append(expr)
        width = g + len(agg.measures)
        out.project.common.emit.output_mapping.extend(range(g))
        out.project.common.emit.output_mapping.extend(range(width, width + len(agg.measures)))
        return out


def aggregate_before_joins(
    plan: Plan, oracle: SchemaOracle, sources: dict[str, TableSource]
) -> Plan:
    """Rewrite, in place, ``plan``'s aggregates over a join to aggregate the many side first.

    Args:
        plan: a Substrait plan with one root relation.
        oracle: gives the schemas of subtrees (it knows every source table).
        sources: the registered tables by name (their row counts size the sides).

    Returns:
        ``plan``, modified.

    Raises:
        PlanningError: DataFusion cannot consume a subtree (from ``oracle``).
    """
    return _Eager(plan, oracle, sources).apply()
