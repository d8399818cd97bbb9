"""Join a filtered dimension as early as its key allows.

DataFusion keeps the join order of the ``FROM`` clause. TPC-H Q21 joins
``supplier ⋈ lineitem ⋈ orders`` first and ``nation`` (one of 25 rows kept,
``n_name = 'SAUDI ARABIA'``) last, so every task of the lineitem stage carries
all suppliers' lineitems through the orders join before 24 of 25 are dropped.
An inner join is associative and commutative: when the condition of a join
with a filtered scan ``N`` reads, on the other side, only the columns of one
input ``A`` of a lower inner join, ``N`` can join ``A`` first::

    Inner(c)                                Project (restores the column order)
      Inner(k)                                Inner(k)
        A                    ==>                Inner(c)
        B                                         A
      N  (filter over a scan)                     N
                                                B

Cost-based optimizers pick such dimension-first orders from statistics
(Spark's ``CostBasedJoinReorder``; DataFusion's join selection does not
reorder). This rule needs none: ``N`` must be a small selective scan, as the
creation side of a runtime filter is (``estimate.is_selective_scan``: a
filter keeping at most half its table, estimated at most
``runtime_filter_bytes``), so a dimension rather than a fact table. Under the
foreign-key assumption each ``A`` row meets at most one ``N`` row, so joining
``N`` first can only shrink what the joins above carry. Results are unchanged
by relational algebra; the test suite compares them with DataFusion's.
"""

from __future__ import annotations

from substrait.proto import Expression, JoinRel, Plan, Rel

from distfusion.io.sources import TableSource
from distfusion.planner.estimate import is_selective_scan
from distfusion.substrait_plan.build import (
    before_emit,
    join_rel,
    map_field_refs,
    rebase_join_condition,
)
from distfusion.substrait_plan.rewrite import RelRewrite, SchemaOracle
from distfusion.substrait_plan.walk import (
    field_refs,
    rel_kind,
)

__all__ = ["push_dimension_joins"]

_INNER = JoinRel.JOIN_TYPE_INNER


class _Pusher(RelRewrite):
    def __init__(
        self, plan: Plan, oracle: SchemaOracle, sources: dict[str, TableSource], limit: int
    ) -> None:
        super().__init__(plan, oracle)
        self.sources = sources
        self.limit = limit

    def rewrite(self, rel: Rel) -> Rel:
        if rel_kind(rel) != "join" or rel.join.type != _INNER or rel.join.common.HasField("emit"):
            return rel
        if not rel.join.HasField("expression") or rel.join.HasField("post_join_filter"):
            return rel
        left, right = rel.join.left, rel.join.right
        if self._filtered_scan(right) and not self._filtered_scan(left):
            return self.push(left, right, rel.join.expression) or rel
        return rel

    def _filtered_scan(self, rel: Rel) -> bool:
        return is_selective_scan(rel, self.registry, self.sources, self.limit)

    def push(self, x: Rel, n: Rel, condition: Expression) -> Rel | None:
        """``Inner(x, n, condition)`` with ``n`` joined lower in ``x``; None if it cannot go.

        The result has the columns of ``Inner(x, n)``, in the same order.
        """
        x_width, n_width = self.arity(x), self.arity(n)
        mine = {r for r in field_refs(condition) if r < x_width}
        if not mine:
            return None
        kind = rel_kind(x)
        if kind == "project":
            inner = x.project.input
            width = self.arity(inner)
            mapping = self.project_sources(x, mine)
            if mapping is None:
                return None
            below = self.push(inner, n, rebase_join_condition(condition, mapping, x_width, width))
            if below is None:  # only worth it if n goes below a join
                return None
            # The projection's expressions read ``inner``'s columns, which keep
            # their places; its output gains n's columns at the end.
            out = Rel()
            out.CopyFrom(x)
            out.project.input.CopyFrom(below)
            emit = [before_emit(x, i) for i in range(x_width)]
            shifted = [e if e < width else e + n_width for e in emit]
            out.project.common.emit.output_mapping[:] = shifted + [
                width + i for i in range(n_width)
            ]
            return out
        if kind != "join" or x.join.type != _INNER or x.join.common.HasField("emit"):
            return None
        a, b = x.join.left, x.join.right
        a_width, b_width = self.arity(a), self.arity(b)
        if all(r < a_width for r in mine):
            moved = rebase_join_condition(condition, {r: r for r in mine}, x_width, a_width)
            low = self.push(a, n, moved) or join_rel(a, n, moved, _INNER)
            # (a, n, b) -> (a, b, n); the join's own condition reads b after n.
            join = Rel()
            join.CopyFrom(x)
            join.join.left.CopyFrom(low)
            join.join.expression.CopyFrom(
                map_field_refs(x.join.expression, lambda i: i if i < a_width else i + n_width)
            )
            order = list(range(a_width)) + [a_width + n_width + i for i in range(b_width)]
            return _reorder(join, order + [a_width + i for i in range(n_width)])
        if all(r >= a_width for r in mine):
            moved = rebase_join_condition(
                condition, {r: r - a_width for r in mine}, x_width, b_width
            )
            low = self.push(b, n, moved) or join_rel(b, n, moved, _INNER)
            join = Rel()
            join.CopyFrom(x)
            join.join.right.CopyFrom(low)
            return join  # (a, b, n): already in order
        return None


def _reorder(rel: Rel, columns: list[int]) -> Rel:
    """A projection of ``rel``'s ``columns``, in that order."""
    out = Rel()
    out.project.input.CopyFrom(rel)
    out.project.common.emit.output_mapping[:] = columns
    return out


def push_dimension_joins(
    plan: Plan, oracle: SchemaOracle, sources: dict[str, TableSource], runtime_filter_bytes: int
) -> Plan:
    """Rewrite ``plan`` in place: filtered scans are joined as low as their keys allow.

    Args:
        plan: a Substrait plan with one root relation.
        oracle: gives the column counts of subtrees.
        sources: every registered table, by name (sizes for the estimates).
        runtime_filter_bytes: the largest estimated pushed scan (bytes); 0 turns
            the rewrite off.

    Returns:
        ``plan``, modified.

    Raises:
        PlanningError: DataFusion cannot consume a subtree (from ``oracle``).
    """
    return _Pusher(plan, oracle, sources, runtime_filter_bytes).apply()
