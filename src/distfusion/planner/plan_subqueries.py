"""Subquery planning: scalar subqueries as queries of their own.

An uncorrelated scalar subquery in a filter or projection is planned like any
query and gathered into one task; a consumer of several tasks reads its one
row as a broadcast, a one-task consumer runs it inline. Any other relation
whose own expressions hold a subquery (a correlated one, ``IN``/``EXISTS`` left
in an expression, a window over one) runs in a single task that reads every
table of the subquery in full: correct first, fast second. See
docs/architecture.md (the planner).
"""

from __future__ import annotations

from substrait.proto import Expression, Rel

from distfusion.planner.fragment import Fragment
from distfusion.planner.walk_host import WalkHost
from distfusion.stages import BROADCAST, StageInput
from distfusion.substrait_plan.walk import (
    contains,
    own_contains,
    own_subqueries,
    rel_kind,
)

__all__ = ["SubqueryPlanning", "pipelines_subqueries"]


class SubqueryPlanning(WalkHost):
    """The planner's subquery planning (a mixin of the planner's walk).

    Uses the planner's ``visit``, ``gather`` and ``seal``.
    """

    def _plan_subqueries(self, rel: Rel, consumer: Fragment) -> tuple[Rel, list[StageInput]]:
        """``rel`` (a filter or project over ``consumer``) with its scalar subqueries planned.

        Each uncorrelated scalar subquery is planned like any query and
        gathered into one task; a one-task consumer runs it inline, a consumer
        of several tasks reads its one row as a broadcast stage. Returns the
        new relation and the stage inputs its fragment gains.
        """
        new = Rel()
        new.CopyFrom(rel)
        inputs: list[StageInput] = []
        for sub in own_subqueries(new):
            frag = self.gather(self.visit(sub.scalar.input))
            # Its source reads become the consumer's; not a Spark table's stage,
            # which reads other stages only as broadcasts.
            if consumer.tasks == 1 and not self.spark_tables(consumer):
                sub.scalar.input.CopyFrom(frag.rel)
                inputs.extend(frag.inputs)
                continue
            read, inp = self.seal(frag, BROADCAST, readers=consumer.tasks)
            sub.scalar.input.CopyFrom(read)
            inputs.append(inp)
        return new, inputs


def pipelines_subqueries(rel: Rel) -> bool:
    """Whether ``rel``'s subqueries can be planned on their own.

    ``rel`` must be a filter or a projection without windows, and its
    subqueries uncorrelated scalar subqueries.
    """
    if rel_kind(rel) not in ("filter", "project"):
        return False
    if rel_kind(rel) == "project" and own_contains(
        rel, lambda m: isinstance(m, Expression.WindowFunction)
    ):
        return False
    subs = own_subqueries(rel)
    return all(
        s.WhichOneof("subquery_type") == "scalar"
        and not contains(
            s, lambda m: isinstance(m, Expression.FieldReference) and m.HasField("outer_reference")
        )
        for s in subs
    )
