"""Join strategy hints: from the marker aliases of the logical plan onto the Substrait joins.

A Spark SQL join hint (``/*+ BROADCAST(t) */``, :mod:`distfusion.spark_sql.hints`)
reaches DataFusion's optimized logical plan as a ``SubqueryAlias`` named
:data:`~distfusion.spark_sql.hints.HINT_ALIAS_PREFIX` + strategy around the
hinted relation; the Substrait plan has no aliases. :func:`mark_join_hints`
finds, for each join of the logical plan, the marker nearest below each of its
sides through operators of one input (Spark's ``EliminateResolvedHint``
pulls a hint up to the join above its relation the same way, never through
another join), and writes it onto the matching Substrait join as an
``advanced_extension.optimization`` message, which consumers ignore (the
Substrait spec: "optimizations ... can be ignored"). :func:`join_hint` reads
it where the planner distributes the join
(:mod:`~distfusion.planner.distribute_joins`).

The joins of the two plans are matched in pre-order, as
:mod:`~distfusion.planner.rewrite_null_aware_anti_join` matches its anti
joins; when their number or join types differ, no hint is carried: a hint
changes a plan, never an answer, so dropping one is always safe.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from google.protobuf.any_pb2 import Any
from substrait.proto import JoinRel, Plan, Rel

from distfusion.spark_sql.hints import HINT_ALIAS_PREFIX, JOIN_STRATEGIES
from distfusion.substrait_plan.walk import relations

__all__ = ["HINT_TYPE_URL", "JoinHint", "join_hint", "mark_join_hints"]

log = logging.getLogger(__name__)

HINT_TYPE_URL = "type.googleapis.com/distfusion.JoinHint"
"""The ``Any.type_url`` of a join's hint in its ``advanced_extension.optimization``
(its value: JSON ``{"left": strategy or null, "right": ...}``)."""

_J = JoinRel
_LOGICAL_TYPES = {
    "Inner": _J.JOIN_TYPE_INNER,
    "Cross": _J.JOIN_TYPE_INNER,
    "Left": _J.JOIN_TYPE_LEFT,
    "Right": _J.JOIN_TYPE_RIGHT,
    "Full": _J.JOIN_TYPE_OUTER,
    "LeftSemi": _J.JOIN_TYPE_LEFT_SEMI,
    "LeftAnti": _J.JOIN_TYPE_LEFT_ANTI,
    "RightSemi": _J.JOIN_TYPE_RIGHT_SEMI,
    "RightAnti": _J.JOIN_TYPE_RIGHT_ANTI,
    "LeftMark": _J.JOIN_TYPE_LEFT_MARK,
    "RightMark": _J.JOIN_TYPE_RIGHT_MARK,
}
_STRATEGIES = frozenset(JOIN_STRATEGIES.values())


@dataclass(frozen=True)
class JoinHint:
    """The strategies hinted for a join's sides (None: no hint on that side).

    Strategies are those of :data:`~distfusion.spark_sql.hints.JOIN_STRATEGIES`:
    ``"broadcast"``, ``"merge"``, ``"shuffle_hash"``, ``"shuffle_replicate_nl"``.
    """

    left: str | None = None
    right: str | None = None

    def __bool__(self) -> bool:
        return self.left is not None or self.right is not None

    def describe(self) -> str:
        """E.g. ``BROADCAST(right)``, for logs and plans."""
        return ", ".join(
            f"{s.upper()}({side})" for side, s in (("left", self.left), ("right", self.right)) if s
        )


def _marker(node) -> str | None:
    line = node.display()
    prefix = "SubqueryAlias: " + HINT_ALIAS_PREFIX
    if line.startswith(prefix):
        strategy = line[len(prefix) :].strip()
        return strategy if strategy in _STRATEGIES else None
    return None


def _side_hint(node) -> str | None:
    """The outermost marker below a join side through one-input operators (Spark's rule)."""
    while True:
        strategy = _marker(node)
        if strategy is not None:
            return strategy
        inputs = node.inputs()
        if len(inputs) != 1:
            return None
        node = inputs[0]


def _logical_joins(logical_plan) -> list[tuple[int | None, JoinHint]]:
    """Pre-order: each join of DataFusion's plan, its Substrait join type and its hint."""
    joins: list[tuple[int | None, JoinHint]] = []

    def walk(node) -> None:
        inputs = node.inputs()
        line = node.display()
        head = line.split(":", 1)[0]
        if head.endswith(" Join") and len(inputs) == 2:
            kind = _LOGICAL_TYPES.get(head[: -len(" Join")])
            joins.append((kind, JoinHint(_side_hint(inputs[0]), _side_hint(inputs[1]))))
        for child in inputs:
            walk(child)

    walk(logical_plan)
    return joins


def mark_join_hints(plan: Plan, logical_plan) -> Plan:
    """Write the hints of ``logical_plan``'s joins onto ``plan``'s joins, in place.

    Called by :func:`~distfusion.planner.plan.prepare_substrait`, once per
    query, right after DataFusion's producer.

    Args:
        plan: the Substrait plan produced from ``logical_plan``.
        logical_plan: DataFusion's optimized logical plan.

    Returns:
        ``plan``; unchanged when no join is hinted, or when its joins do not
        match the logical plan's one to one (logged at debug level).
    """
    if HINT_ALIAS_PREFIX not in logical_plan.display_indent():
        return plan
    hints = _logical_joins(logical_plan)
    joins = [
        rel
        for relation in plan.relations
        for rel in relations(relation.root.input if relation.HasField("root") else relation.rel)
        if rel.WhichOneof("rel_type") in ("join", "cross")
    ]
    kinds = [
        r.join.type if r.WhichOneof("rel_type") == "join" else _J.JOIN_TYPE_INNER for r in joins
    ]
    if kinds != [k for k, _ in hints]:
        log.debug("join hints not followed: the Substrait plan's joins differ from DataFusion's")
        return plan
    for rel, (_, hint) in zip(joins, hints, strict=True):
        if hint:
            body = getattr(rel, rel.WhichOneof("rel_type"))
            value = json.dumps({"left": hint.left, "right": hint.right}).encode()
            body.advanced_extension.optimization.append(Any(type_url=HINT_TYPE_URL, value=value))
    return plan


def join_hint(rel: Rel) -> JoinHint:
    """The hint :func:`mark_join_hints` wrote on join (or cross) ``rel``; empty if none.

    The message stays on the relation: fragments carry it to the workers,
    whose Substrait consumer ignores it.
    """
    kind = rel.WhichOneof("rel_type")
    if kind not in ("join", "cross"):
        return JoinHint()
    for o in getattr(rel, kind).advanced_extension.optimization:
        if o.type_url == HINT_TYPE_URL:
            value = json.loads(o.value)
            return JoinHint(value.get("left"), value.get("right"))
    return JoinHint()
