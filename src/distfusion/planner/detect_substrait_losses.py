"""What DataFusion's Substrait producer drops from an optimized plan, read from its structure.

DataFusion 55 writes some properties of a plan nowhere in Substrait and raises
no error; the plan consumed again computes another answer. Each was measured on
single-node DataFusion 55 (``ctx.sql(q)`` against
``Consumer.from_substrait_plan(ctx, Producer.to_substrait_plan(plan, ctx))``;
``tests/planner/test_detect_substrait_losses.py`` keeps every one, and fails when a DataFusion
upgrade carries it):

- ``IGNORE NULLS`` of an aggregate (``first_value(x ORDER BY y) IGNORE NULLS``,
  ``last_value``, ``array_agg(x) IGNORE NULLS``): read back as RESPECT NULLS;
- ``IGNORE NULLS`` of a window function (``first_value``, ``last_value``,
  ``nth_value``, ``lag``, ``lead``): read back as RESPECT NULLS;
- ``DISTINCT`` of a window aggregate (``count(DISTINCT x) OVER (...)``): every
  row counted;
- ``FILTER (WHERE ...)`` of a window aggregate: no filter;
- a ``RANGE`` frame bounded by an offset (``RANGE BETWEEN 1 PRECEDING AND
  CURRENT ROW``): the offset is read back as a UInt64, and DataFusion frames
  other rows for a signed, float or decimal ``ORDER BY`` key;
- a cast to a timestamp with a zone other than UTC (``CAST(ts AS
  Timestamp(s, "+08:00"))``, ``ts AT TIME ZONE 'Europe/Paris'``): Substrait's
  timestamp has no zone, the consumer reads it as UTC.

Carried (the same answer after the round trip, so not checked): ``FILTER``,
``DISTINCT`` and ``ORDER BY`` of aggregates (``array_agg``, ``string_agg``,
``first_value`` ...), ``ROWS`` frames, ``RANGE`` frames bounded only by
``UNBOUNDED`` and ``CURRENT ROW``, ``WITHIN GROUP``, grouping sets, ``DISTINCT
ON``. A ``GROUPS`` frame makes the producer raise (the query then runs on the
coordinator anyway).

Everything is decided from the plan's structure, never from its text (an output
column may be named ``... IGNORE NULLS ...``): the nodes of the plan
(``LogicalPlan.inputs()``), each node's expressions through datafusion-python's
variants (``to_variant()``,
``rex_call_operands()``), and, for what datafusion-python has no getter for
(null treatment, a window function's ``DISTINCT`` and ``FILTER``, a cast's
type), the expression's own protobuf encoding (``Expr.to_bytes``:
datafusion-proto's ``LogicalExprNode``, field numbers in :data:`_PROTO`).
The plan of a subquery expression is out of datafusion-python's reach; it is
read in Substrait (:func:`_subquery_losses`). What cannot be read is reported
as if lost, so such a query runs on the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from datafusion import Expr, LogicalPlan, SessionContext
from google.protobuf import empty_pb2
from google.protobuf.unknown_fields import UnknownFieldSet
from substrait.proto import AggregateFunction, ConsistentPartitionWindowRel, Expression, Plan

from distfusion.substrait_plan.build import FunctionRegistry
from distfusion.substrait_plan.walk import is_subquery, walk

if TYPE_CHECKING:  # what datafusion-python's plan and expression variants hand out
    from datafusion._internal.expr import RawExpr

__all__ = ["substrait_losses"]

# Field numbers of datafusion-proto 55's messages (datafusion/proto/proto/
# datafusion.proto and proto-common/proto/datafusion_common.proto).
_PROTO = {
    "LogicalExprNode.cast": 11,
    "LogicalExprNode.try_cast": 17,
    "LogicalExprNode.window_expr": 18,
    "LogicalExprNode.aggregate_udf_expr": 19,
    "CastNode.arrow_type": 2,  # TryCastNode's too
    "ArrowType.TIMESTAMP": 20,
    "Timestamp.timezone": 2,
    "AggregateUDFExprNode.fun_name": 1,
    "AggregateUDFExprNode.filter": 3,
    "AggregateUDFExprNode.order_by": 4,
    "AggregateUDFExprNode.null_treatment": 7,
    "WindowExprNode.udaf": 3,
    "WindowExprNode.udwf": 9,
    "WindowExprNode.partition_by": 5,
    "WindowExprNode.order_by": 6,
    "WindowExprNode.null_treatment": 11,
    "WindowExprNode.distinct": 12,
    "WindowExprNode.filter": 13,
    "SortExprNode.expr": 1,
}
_IGNORE_NULLS = 1  # datafusion-proto's NullTreatment.IGNORE_NULLS
_UTC = {"UTC", "+00:00", "Z"}

# Expression variants without sub-expressions, and those holding a subquery plan.
_LEAVES = {
    "Column",
    "Literal",
    "ScalarVariable",
    "Placeholder",
    "Wildcard",
    "OuterReferenceColumn",
}
_SUBQUERIES = {"ScalarSubquery", "Exists", "InSubquery"}

_NULL_TREATMENT = {"array_agg", "first_value", "last_value"}
"""DataFusion 55's aggregates that take ``IGNORE NULLS`` (every other built-in
rejects it when planning; tests/planner/test_detect_substrait_losses.py asks DataFusion)."""
_ZONED = {"precision_timestamp_tz", "timestamp_tz"}  # Substrait types of a zoned timestamp
_WindowRelFunction = ConsistentPartitionWindowRel.WindowRelFunction


def substrait_losses(plan: LogicalPlan, ctx: SessionContext, substrait: Plan) -> list[str]:
    """What of the optimized plan ``plan`` DataFusion's Substrait producer drops.

    Called by the coordinator (``context.lost_in_substrait``) before a query is
    distributed; a plan with a loss runs whole on the coordinator instead. See
    the module docstring for the properties and how each was measured.

    Args:
        plan: DataFusion's optimized logical plan of the query.
        ctx: the session ``plan`` belongs to (its functions decode the
            sub-expressions of aggregate and window functions).
        substrait: DataFusion's Substrait plan of ``plan`` (where the plans of
            subquery expressions are read, see :func:`_subquery_losses`).

    Returns:
        One phrase per property lost (``"IGNORE NULLS (first_value)"``), in the
        order first met, without repeats; empty when nothing known is lost.
        What cannot be read counts as lost (the check must not pass what it
        cannot see): an expression DataFusion cannot encode to protobuf where a
        property is to be read; in a subquery, what a lost property may sit on.
    """
    codec = ctx.with_python_udf_inlining(enabled=False)  # UDFs by name: nothing pickled
    found: dict[str, None] = {}
    subqueries: list[str] = []
    plans = [plan]
    while plans:
        node = plans.pop()
        plans.extend(node.inputs())
        variant = _variant(node)
        for expr in _own_exprs(variant):
            for e in _descendants(expr, codec, subqueries, found):
                for loss in _losses_of(e, codec):
                    found.setdefault(loss)
        if type(variant).__name__ == "WindowExpr":
            for expr in variant.get_window_expr():
                offset = _range_offset(variant, _unalias(expr))
                if offset:
                    found.setdefault(offset)
    if subqueries:
        for loss in _subquery_losses(substrait):
            found.setdefault(loss)
    return list(found)


def _variant(node: LogicalPlan):
    try:
        return node.to_variant()
    except Exception:  # datafusion-python has no class for some nodes (DistinctOn)
        return None


def _own_exprs(variant) -> list[RawExpr]:
    """The expressions a plan node holds itself (not its inputs'), as datafusion-python has them."""
    kind = type(variant).__name__
    if kind == "Projection":
        return list(variant.projections())
    if kind == "Filter":
        return [variant.predicate()]
    if kind == "Aggregate":
        return list(variant.group_by_exprs()) + list(variant.aggregate_exprs())
    if kind == "WindowExpr":  # the Window node
        return list(variant.get_window_expr())
    if kind == "Join":
        exprs = [e for pair in variant.on() for e in pair]
        return exprs + ([variant.filter()] if variant.filter() is not None else [])
    if kind == "Sort":
        return [s.expr() for s in variant.sort_exprs()]
    if kind == "TableScan":
        return list(variant.filters())
    if kind == "Values":
        return [e for row in variant.values() for e in row]
    return []


def _descendants(
    expr: RawExpr, codec: SessionContext, subqueries: list[str], found: dict[str, None]
) -> Iterator[RawExpr]:
    """``expr`` and every expression under it, but not into subquery plans.

    The kind of each subquery met goes to ``subqueries``; a function clause
    that cannot be read back (so is not checked) goes to ``found`` as a loss.
    """
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        kind = e.variant_name()
        if kind in _LEAVES:
            continue
        if kind in _SUBQUERIES:  # its plan is checked in Substrait (_subquery_losses)
            subqueries.append(kind)
            if kind == "InSubquery":
                stack.append(e.to_variant().expr())
            continue
        try:
            stack.extend(e.rex_call_operands())
        except Exception:  # a variant rex_call_operands does not open (GroupingSet, Unnest)
            pass
        if kind in ("AggregateFunction", "WindowFunction"):
            try:
                stack.extend(_function_clauses(e, kind, codec))
            except Exception as exc:  # DataFusion raises bare Exception
                why = _first_line(exc)
                found.setdefault(f"what a function clause holds (it cannot be decoded: {why})")


def _function_clauses(e: RawExpr, kind: str, codec: SessionContext) -> list[RawExpr]:
    """An aggregate or window function's FILTER, ORDER BY and PARTITION BY expressions.

    ``rex_call_operands`` gives only the arguments; the clauses are read from
    the function's protobuf encoding and decoded back into expressions.

    Raises:
        Exception: DataFusion's, when it cannot encode ``e`` or decode a clause.
    """
    node = _function_node(e, kind, codec)
    if kind == "AggregateFunction":
        exprs = node.get(_PROTO["AggregateUDFExprNode.filter"], [])
        sorts = node.get(_PROTO["AggregateUDFExprNode.order_by"], [])
    else:
        exprs = node.get(_PROTO["WindowExprNode.filter"], []) + node.get(
            _PROTO["WindowExprNode.partition_by"], []
        )
        sorts = node.get(_PROTO["WindowExprNode.order_by"], [])
    for sort in sorts:
        exprs += _fields(sort).get(_PROTO["SortExprNode.expr"], [])
    return [Expr.from_bytes(b, codec).expr for b in exprs]


def _losses_of(e: RawExpr, codec: SessionContext) -> list[str]:
    """What of the one expression ``e`` (not its sub-expressions) Substrait drops."""
    kind = e.variant_name()
    if kind in ("Cast", "TryCast"):
        try:
            fields = _fields(_encode(e, codec))
        except Exception as exc:  # DataFusion raises bare Exception (a subquery inside)
            return [f"the type of a cast (it cannot be encoded to check it: {_first_line(exc)})"]
        (node,) = (
            fields.get(_PROTO["LogicalExprNode.cast"]) or fields[_PROTO["LogicalExprNode.try_cast"]]
        )
        zone = _timestamp_zone(_fields(node).get(_PROTO["CastNode.arrow_type"], [b""])[0])
        if zone is not None and zone not in _UTC:
            return [f"the time zone of a cast to a timestamp ({zone})"]
        return []
    if kind not in ("AggregateFunction", "WindowFunction"):
        return []
    try:
        node = _function_node(e, kind, codec)
    except Exception as exc:  # DataFusion raises bare Exception
        return [f"what a function holds (it cannot be encoded to check it: {_first_line(exc)})"]
    if kind == "AggregateFunction":
        name = _text(node, "AggregateUDFExprNode.fun_name")
        if _varint(node, "AggregateUDFExprNode.null_treatment") == _IGNORE_NULLS:
            return [f"IGNORE NULLS ({name})"]
        return []
    name = _text(node, "WindowExprNode.udaf") or _text(node, "WindowExprNode.udwf")
    lost = []
    if _varint(node, "WindowExprNode.null_treatment") == _IGNORE_NULLS:
        lost.append(f"IGNORE NULLS ({name} OVER)")
    if _varint(node, "WindowExprNode.distinct"):
        lost.append(f"DISTINCT in a window aggregate ({name} OVER)")
    if _PROTO["WindowExprNode.filter"] in node:
        lost.append(f"FILTER (WHERE ...) of a window aggregate ({name} OVER)")
    return lost


def _subquery_losses(substrait: Plan) -> list[str]:
    """What a lost property may sit on in the subqueries of the Substrait plan ``substrait``.

    datafusion-python opens no subquery expression's plan (``Subquery.input()``
    returns no plan, and DataFusion 55 encodes no ``EXISTS``/``IN`` subquery nor
    a memory table to protobuf), so a subquery is read in its Substrait form,
    where the lost properties are gone but what they sit on is not: a window
    function; an aggregate that takes ``IGNORE NULLS`` (:data:`_NULL_TREATMENT`);
    a cast to a timestamp with a zone. A subquery holding one of them is
    reported, whether or not the property was there.
    """
    registry = FunctionRegistry(substrait)
    found: dict[str, None] = {}
    for rel in substrait.relations:
        for sub in walk(rel, lambda m: False):
            if not is_subquery(sub):
                continue
            for m in walk(sub):
                if isinstance(m, Expression.WindowFunction | _WindowRelFunction):
                    found.setdefault("what a window function in a subquery may hold")
                elif isinstance(m, AggregateFunction):
                    name = registry.name(m.function_reference)
                    if name in _NULL_TREATMENT:
                        found.setdefault(f"what {name} in a subquery may hold (IGNORE NULLS)")
                elif isinstance(m, Expression.Cast) and m.type.WhichOneof("kind") in _ZONED:
                    found.setdefault("the time zone of a cast in a subquery")
    return list(found)


def _range_offset(window, expr: RawExpr) -> str | None:
    """The loss of a RANGE frame bounded by an offset (``1 PRECEDING``), or None."""
    if expr.variant_name() != "WindowFunction":
        return None
    frame = window.get_frame(expr)
    if frame is None or frame.get_frame_units().upper() != "RANGE":
        return None
    for bound in (frame.get_lower_bound(), frame.get_upper_bound()):
        if not bound.is_unbounded() and not bound.is_current_row():
            return "a RANGE window frame with an offset (PRECEDING or FOLLOWING a value)"
    return None


def _unalias(expr: RawExpr) -> RawExpr:
    while expr.variant_name() == "Alias":
        expr = expr.to_variant().expr()
    return expr


def _function_node(e: RawExpr, kind: str, codec: SessionContext) -> dict[int, list]:
    """The fields of ``e``'s AggregateUDFExprNode or WindowExprNode."""
    number = _PROTO[
        "LogicalExprNode.aggregate_udf_expr"
        if kind == "AggregateFunction"
        else "LogicalExprNode.window_expr"
    ]
    (node,) = _fields(_encode(e, codec))[number]
    return _fields(node)


def _encode(e: RawExpr, codec: SessionContext) -> bytes:
    """``e`` (datafusion-python's ``RawExpr``, as its variants hand them out) as protobuf bytes."""
    return e.to_bytes(codec.ctx)


def _timestamp_zone(arrow_type: bytes) -> str | None:
    """The zone of an encoded ArrowType when it is a timestamp with one, else None."""
    (timestamp,) = _fields(arrow_type).get(_PROTO["ArrowType.TIMESTAMP"], [None])
    if timestamp is None:
        return None
    zone = _fields(timestamp).get(_PROTO["Timestamp.timezone"], [b""])[0].decode()
    return zone or None


def _fields(message: bytes) -> dict[int, list]:
    """A protobuf message's fields by number: varints as int, the rest as bytes.

    Parsed by protobuf itself as the unknown fields of an empty message (no
    generated classes for datafusion-proto exist in Python).
    """
    empty = empty_pb2.Empty()
    empty.ParseFromString(message)
    out: dict[int, list] = {}
    for field in UnknownFieldSet(empty):
        data = field.data
        out.setdefault(field.field_number, []).append(
            bytes(data) if isinstance(data, bytes | memoryview) else data
        )
    return out


def _varint(node: dict[int, list], name: str) -> int | None:
    values = node.get(_PROTO[name])
    return values[-1] if values else None


def _text(node: dict[int, list], name: str) -> str:
    values = node.get(_PROTO[name])
    return values[-1].decode() if values else ""


def _first_line(exc: BaseException, limit: int = 200) -> str:
    return str(exc).strip().splitlines()[0][:limit] if str(exc).strip() else type(exc).__name__
