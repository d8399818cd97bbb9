"""Keep ``NOT IN`` semantics through Substrait: rewrite null-aware anti joins.

DataFusion plans ``x NOT IN (SELECT y ...)`` as a *null-aware* left anti join:
a row is dropped when the subquery is non-empty and ``x`` is NULL, or some
``y`` is NULL, or some ``y = x``. Substrait has no null-aware flag and
DataFusion's producer drops it, so the consumed plan would be a plain anti join
(wrong as soon as a NULL appears). The equivalent plain anti join is::

    LEFT ANTI JOIN ... ON (x = y OR x IS NULL OR y IS NULL) AND <other conjuncts>

It has no equi key left, so the planner broadcasts the (subquery) right side, as
for any non-equi anti join.
"""

from __future__ import annotations

from substrait.proto import JoinRel, Plan

from distfusion.errors import NotDistributableError
from distfusion.substrait_plan.build import FunctionRegistry, boolean_type, conjuncts
from distfusion.substrait_plan.walk import relations

__all__ = ["rewrite_null_aware_anti_joins"]


def _null_aware_flags(logical_plan) -> list[bool]:
    """Pre-order: for each LeftAnti join of the DataFusion plan, whether it is null-aware."""
    flags: list[bool] = []

    def walk(node) -> None:
        line = node.display()
        if line.startswith("LeftAnti Join"):
            flags.append(line.rstrip().endswith("null_aware"))
        for child in node.inputs():
            walk(child)

    walk(logical_plan)
    return flags


def rewrite_null_aware_anti_joins(plan: Plan, logical_plan) -> Plan:
    """Rewrite, in place, the anti joins of ``plan`` that ``logical_plan`` marks null-aware.

    Args:
        plan: the Substrait plan produced from ``logical_plan``.
        logical_plan: DataFusion's optimized logical plan.

    Returns:
        ``plan``, modified.

    Raises:
        NotDistributableError: the two plans' anti joins cannot be matched one to one, or
            a null-aware join has no equality to rewrite.
    """
    flags = _null_aware_flags(logical_plan)
    if not any(flags):
        return plan
    joins = [
        rel
        for relation in plan.relations
        for rel in relations(relation.root.input if relation.HasField("root") else relation.rel)
        if rel.WhichOneof("rel_type") == "join" and rel.join.type == JoinRel.JOIN_TYPE_LEFT_ANTI
    ]
    if len(joins) != len(flags):
        msg = (
            "cannot distribute NOT IN: the Substrait plan's anti joins do not match "
            f"DataFusion's ({len(joins)} vs {len(flags)})"
        )
        raise NotDistributableError(msg)
    registry = FunctionRegistry(plan)
    for rel, null_aware in zip(joins, flags, strict=True):
        if not null_aware:
            continue
        parts = conjuncts(rel.join.expression, registry)
        key = next(
            (
                i
                for i, c in enumerate(parts)
                if c.WhichOneof("rex_type") == "scalar_function"
                and registry.name(c.scalar_function.function_reference) == "equal"
            ),
            None,
        )
        if key is None:
            msg = "cannot distribute NOT IN: its anti join has no equality condition"
            raise NotDistributableError(msg)
        a, b = (arg.value for arg in parts[key].scalar_function.arguments)
        either_null = registry.call(
            "or",
            registry.call(
                "or",
                parts[key],
                registry.call("is_null", a, output_type=boolean_type()),
                output_type=boolean_type(),
            ),
            registry.call("is_null", b, output_type=boolean_type()),
            output_type=boolean_type(),
        )
        parts[key] = either_null
        rel.join.expression.CopyFrom(registry.conjunction(parts))
    return plan
