"""Repair what DataFusion's Substrait producer writes and its own consumer rejects.

DataFusion (55) produces Substrait that it cannot consume again for some plans
it runs from SQL. Where the fix keeps the plan's meaning exactly, it is made
here, in place, before the plan is cut into stages, so the query is distributed
instead of running on the coordinator:

=====================================  =========================================
what the producer writes               repaired to
=====================================  =========================================
a join with no condition (uncorrelated  the condition ``true`` (the consumer
``EXISTS``: a semi/anti join on         says "join condition should not be
nothing)                                empty"; a join on ``true`` is the same)
``logb(x)`` with one argument (SQL's    ``logb(x, 10)``: DataFusion's
one-argument ``log(x)``, base 10)       one-argument ``log`` is base 10, and its
                                        consumer expects two arguments
a read of ``datafusion.public.t``        a read of ``t`` (the planner finds
                                        sources by their bare name)
=====================================  =========================================

A read of a table in another schema (``CREATE SCHEMA s; ... FROM s.t``) has no
distfusion source: :class:`~distfusion.errors.NotDistributableError`, so the
query is not planned over a same-named table of the default schema.

Anything else the consumer rejects falls back to the coordinator (see
:meth:`distfusion.context.DistributedDataFrame.coordinator_only`).
"""

from __future__ import annotations

from substrait.proto import Expression, Plan, Rel

from distfusion.errors import NotDistributableError
from distfusion.substrait_plan.build import FunctionRegistry
from distfusion.substrait_plan.walk import walk

__all__ = ["repair_substrait"]


def repair_substrait(plan: Plan) -> Plan:
    """Repair ``plan`` in place (see the module docs); return it.

    Called once per query on the coordinator, on the plan DataFusion's producer
    made for the optimized logical plan, before :func:`~distfusion.planner.plan.plan_stages`
    (pass 2 of :mod:`distfusion.planner.plan`).

    Raises:
        NotDistributableError: the plan reads a table of a schema other than
            DataFusion's default (``datafusion.public``).
    """
    registry = FunctionRegistry(plan)
    for msg in walk(plan):
        if isinstance(msg, Rel) and msg.WhichOneof("rel_type") == "join":
            if not msg.join.HasField("expression"):
                msg.join.expression.literal.boolean = True
        elif isinstance(msg, Rel) and msg.WhichOneof("rel_type") == "read":
            if msg.read.HasField("named_table"):
                _bare_name(msg.read.named_table.names)
        elif (
            isinstance(msg, Expression.ScalarFunction)
            and registry.name(msg.function_reference) == "logb"
            and len(msg.arguments) == 1
        ):
            base = _ten(msg.output_type.WhichOneof("kind"))
            if base is not None:
                # Substrait's logb is (x, base); SQL's log is (base, x).
                msg.arguments.add().value.CopyFrom(base)
    return plan


_DEFAULT_PATH = ["datafusion", "public"]


def _bare_name(names) -> None:
    """Drop the default catalog and schema from a table path (in place); refuse others."""
    prefix = list(names[:-1])
    if prefix and prefix != _DEFAULT_PATH[-len(prefix) :]:
        msg = f"table {'.'.join(names)} is not in the default schema: it has no distfusion source"
        raise NotDistributableError(msg)
    del names[:-1]


def _ten(kind: str | None) -> Expression | None:
    """The literal 10 of the float ``kind`` (``"fp64"``/``"fp32"``), else None (left as is)."""
    if kind not in ("fp64", "fp32"):
        return None
    e = Expression()
    setattr(e.literal, kind, 10.0)
    return e
