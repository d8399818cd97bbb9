"""Push semi and anti joins below the inner joins that would only multiply their rows.

DataFusion decorrelates ``x IN (SELECT ...)`` and ``EXISTS`` into a left semi
(or anti) join placed *above* the query's other joins. TPC-H Q18 is the case
in point: its ``o_orderkey IN (... HAVING sum(l_quantity) > 300)`` filters
``customer ⋈ orders ⋈ lineitem`` after that join has produced six million
rows, of which a few hundred survive. A semi join is a filter on its left
side's rows, so it may run below an inner join on the side whose columns its
condition reads (Spark's optimizer rule ``PushLeftSemiLeftAntiThroughJoin``)::

    LeftSemi(c)                        Inner(k)
      Inner(k)              ==>          LeftSemi(c)
        X                                  X
        Y                                Y
      S                                  S

Spark pushes whenever the condition allows. Here a join is pushed through
only when the *other* side ``Y`` has no filter, aggregate or limit (it is
base tables joined and projected): each ``X`` row then meets at least one
``Y`` row under the foreign-key assumption, so the inner join cannot have
removed rows the pushed semi join now has to test. TPC-H Q21's ``EXISTS``
sits above joins with a filtered ``supplier ⋈ nation``, which drop 24 of 25
rows first: it stays put.

The rewrite goes through projections whose referenced outputs are plain
columns. It changes where rows are dropped, never which: the results are the
same by relational algebra, and the test suite compares them with DataFusion's.
"""

from __future__ import annotations

from substrait.proto import JoinRel, Plan, Rel

from distfusion.substrait_plan.build import before_emit, rebase_join_condition
from distfusion.substrait_plan.rewrite import RelRewrite, SchemaOracle
from distfusion.substrait_plan.walk import (
    children,
    field_refs,
    own_has_subquery,
    rel_kind,
    set_children,
)

__all__ = ["push_semi_join", "push_semi_joins"]

_J = JoinRel
_PUSHED = {_J.JOIN_TYPE_LEFT_SEMI, _J.JOIN_TYPE_LEFT_ANTI}


def _is_plain(rel: Rel) -> bool:
    """Whether ``rel`` is base-table reads, projections and inner joins only."""
    kind = rel_kind(rel)
    if kind == "read":
        return not rel.read.HasField("filter") and not rel.read.HasField("best_effort_filter")
    if kind == "join" and rel.join.type != _J.JOIN_TYPE_INNER:
        return False
    if kind not in ("project", "join", "cross"):
        return False
    if own_has_subquery(rel):
        return False
    return all(_is_plain(c) for c in children(rel))


class _Pusher(RelRewrite):
    """Semi joins pushed down; ``anywhere``: also past an other side that is not plain.

    The planner's own semi-join reductions (a selective side's keys, copied
    below an aggregate by :mod:`~distfusion.planner.reduce_aggregate_inputs`)
    drop most rows: they go down to the table that has their key whatever
    the inner joins on the way would drop (TPC-H Q2's 4% of ``part`` filters
    ``partsupp``'s 8 M rows before they meet ``supplier``, not after).
    """

    def __init__(self, plan: Plan, oracle: SchemaOracle, anywhere: bool = False) -> None:
        super().__init__(plan, oracle)
        self.anywhere = anywhere

    def rewrite(self, rel: Rel) -> Rel:
        if rel_kind(rel) == "join" and rel.join.type in _PUSHED and rel.join.HasField("expression"):
            return self.push(rel)
        return rel

    def push(self, semi: Rel) -> Rel:
        """``semi`` with its join moved as far down its left input as allowed."""
        left = semi.join.left
        width = self.arity(left)
        refs = {r for r in field_refs(semi.join.expression) if r < width}
        if not refs or semi.join.common.HasField("emit"):
            return semi
        kind = rel_kind(left)
        if kind == "project":
            inner = left.project.input
            mapping = self.project_sources(left, refs)
            if mapping is None:
                return semi
            below = _moved(semi, inner, mapping, width, self.arity(inner))
            return set_children(left, [self.push(below)])
        if kind in ("join", "cross") and (kind == "cross" or left.join.type == _J.JOIN_TYPE_INNER):
            x, y = children(left)
            x_width = self.arity(x)
            pre = {r: before_emit(left, r) for r in refs}
            if all(p < x_width for p in pre.values()) and (self.anywhere or _is_plain(y)):
                below = _moved(semi, x, pre, width, x_width)
                return set_children(left, [self.push(below), y])
            if all(p >= x_width for p in pre.values()) and (self.anywhere or _is_plain(x)):
                mapping = {r: p - x_width for r, p in pre.items()}
                below = _moved(semi, y, mapping, width, self.arity(y))
                return set_children(left, [x, self.push(below)])
        return semi


def _moved(
    semi: Rel, new_left: Rel, mapping: dict[int, int], old_width: int, new_width: int
) -> Rel:
    """``semi`` over ``new_left``: its left references through ``mapping``, right shifted."""
    out = Rel()
    out.CopyFrom(semi)
    out.join.left.CopyFrom(new_left)
    out.join.expression.CopyFrom(
        rebase_join_condition(semi.join.expression, mapping, old_width, new_width)
    )
    return out


def push_semi_join(semi: Rel, plan: Plan, oracle: SchemaOracle) -> Rel:
    """``semi``, a left semi join of ``plan``, moved down its left input as far as it goes.

    Below every projection and inner join on the way, into the side whose
    columns its condition reads, plain or not (see :class:`_Pusher`).
    """
    return _Pusher(plan, oracle, anywhere=True).push(semi)


def push_semi_joins(plan: Plan, oracle: SchemaOracle) -> Plan:
    """Rewrite, in place, ``plan``'s semi and anti joins to sit below inner joins.

    Args:
        plan: a Substrait plan with one root relation.
        oracle: gives the column counts of subtrees (it knows every source table).

    Returns:
        ``plan``, modified.

    Raises:
        PlanningError: DataFusion cannot consume a subtree (from ``oracle``).
    """
    return _Pusher(plan, oracle).apply()
