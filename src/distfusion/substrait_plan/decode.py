"""Decoding a Substrait plan, however deep it nests, into a DataFusion logical plan.

Used on the coordinator (planning: schemas and fragments) and by every task for
its fragment (:mod:`distfusion.worker.execute_task`). DataFusion's decoder stops
at 100 nesting levels; :func:`consume_plan` consumes deeper plans in pieces.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
from datafusion import SessionContext
from datafusion.substrait import Consumer, Serde
from substrait.proto import Expression, Plan, Rel

from distfusion.substrait_plan.build import named_struct, stage_read
from distfusion.substrait_plan.functions import add_used
from distfusion.substrait_plan.walk import child_fields, rel_kind

__all__ = ["PIECE_DEPTH", "consume_plan", "fits_decoder", "parse_plan"]


def parse_plan(data: bytes) -> Plan:
    """The Substrait ``Plan`` message serialized in ``data``, however deep it nests.

    Raises:
        google.protobuf.message.DecodeError: ``data`` is not a serialized plan.
    """
    plan = Plan()
    plan.ParseFromString(data)
    return plan


PIECE_DEPTH = 48
"""Protobuf nesting levels of a relation above which :func:`consume_plan` cuts
it out of a deep plan. A piece is at most this deep plus its own expressions
and the plan around it, under the decoder's limit of 100 with room to spare."""

_DEEP_VIEW_PREFIX = "__deep_"


def fits_decoder(data: bytes) -> bool:
    """Whether DataFusion decodes the serialized Substrait plan ``data`` whole.

    False when it nests deeper than the decoder's limit of 100 levels
    (:func:`consume_plan` then consumes it in pieces).
    """
    try:
        Serde.deserialize_bytes(data)
    except Exception as exc:  # DataFusion raises bare Exception
        if "recursion limit" in str(exc):
            return False
        raise
    return True


def consume_plan(ctx: SessionContext, data: bytes):
    """DataFusion's logical plan for the serialized Substrait plan ``data``.

    DataFusion decodes Substrait with prost, whose nesting limit of 100 levels
    it cannot lift: a join of about 18 tables already fails to decode although
    DataFusion plans and runs the same query from SQL. Such a plan is consumed
    in pieces: relations deeper than :data:`PIECE_DEPTH` levels are cut out,
    inputs first, each consumed on its own, registered in ``ctx`` as a view
    named ``__deep_<digest of the piece>`` (columns ``c0..``), and replaced in
    its parent by a read of that view. DataFusion inlines views when it plans
    (its ``InlineTableScan`` analyzer rule), so the query runs as the whole plan
    would. Relations inside subquery expressions and relations that read an
    outer query's columns are not cut.

    Called on the coordinator (planning: schemas and fragments) and by every
    task for its fragment.

    Args:
        ctx: the context whose tables the plan reads; deep plans add views to it.
        data: a serialized ``substrait.Plan`` with one root relation.

    Returns:
        A ``datafusion.LogicalPlan``.

    Raises:
        Exception: DataFusion's error when it rejects the plan or a piece of it.
    """
    add_used(ctx, data)  # datafusion-spark's functions it names (substrait_plan.functions)
    try:
        return Consumer.from_substrait_plan(ctx, Serde.deserialize_bytes(data))
    except Exception as exc:  # DataFusion raises bare Exception
        if "recursion limit" not in str(exc):
            raise
    plan = parse_plan(data)
    for relation in plan.relations:
        # cuts the root's deep inputs (in place); the root itself stays
        _rel_depth(relation.root.input if relation.HasField("root") else relation.rel, ctx, plan)
    return Consumer.from_substrait_plan(ctx, Serde.deserialize_bytes(plan.SerializeToString()))


def _message_stats(msg) -> tuple[int, bool]:
    """Nesting levels of protobuf message ``msg``, and whether it reads an outer query's column."""
    outer = isinstance(msg, Expression.FieldReference) and msg.HasField("outer_reference")
    deepest = 0
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        for v in value if fd.is_repeated else [value]:
            d, o = _message_stats(v)
            deepest, outer = max(deepest, d), outer or o
    return 1 + deepest, outer


def _rel_depth(rel: Rel, ctx: SessionContext, plan: Plan) -> tuple[int, bool]:
    """:func:`_message_stats` of ``rel`` after cutting its inputs deeper than PIECE_DEPTH.

    The cut inputs are replaced in place (:func:`_view_read`).
    """
    kind = rel_kind(rel)
    body = getattr(rel, kind)
    inputs = child_fields(kind)
    deepest, outer = 0, False
    for fd, value in body.ListFields():
        if fd.message_type is None:
            continue
        for v in value if fd.is_repeated else [value]:
            if fd.name in inputs:
                d, o = _rel_depth(v, ctx, plan)
                if d > PIECE_DEPTH and not o:  # a piece reading outer columns stays
                    v.CopyFrom(_view_read(v, ctx, plan))
                    d = _message_stats(v)[0]
            else:
                d, o = _message_stats(v)
            deepest, outer = max(deepest, d), outer or o
    return 2 + deepest, outer  # the Rel and its body


def _flat_names(field: pa.Field, skip_self: bool, names: list[str]) -> None:
    """Substrait's depth-first names of ``field`` (DataFusion producer's ``flatten_names``)."""
    if not skip_self:
        names.append(field.name)
    t = field.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _flat_names(t.field(i), False, names)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        _flat_names(t.value_field, True, names)
    elif pa.types.is_map(t):
        _flat_names(t.key_field, True, names)
        _flat_names(t.item_field, True, names)


def _view_read(rel: Rel, ctx: SessionContext, plan: Plan) -> Rel:
    """Register ``rel`` as a view of ``ctx`` (once per distinct piece); a read of it."""
    piece = Plan()
    piece.extensions.extend(plan.extensions)
    piece.extension_urns.extend(plan.extension_urns)
    if plan.HasField("version"):
        piece.version.CopyFrom(plan.version)
    piece.relations.add().rel.CopyFrom(rel)
    data = piece.SerializeToString()
    name = _DEEP_VIEW_PREFIX + hashlib.sha256(data).hexdigest()[:24]
    if not ctx.table_exist(name):
        lp = Consumer.from_substrait_plan(ctx, Serde.deserialize_bytes(data))
        schema = ctx.create_dataframe_from_logical_plan(lp).schema()
        schema = pa.schema([f.with_name(f"c{i}") for i, f in enumerate(schema)])
        names: list[str] = []
        for f in schema:
            _flat_names(f, False, names)
        root = piece.relations[0]
        root.root.input.CopyFrom(rel)
        root.root.names.extend(names)
        lp = Consumer.from_substrait_plan(ctx, Serde.deserialize_bytes(piece.SerializeToString()))
        ctx.register_view(name, ctx.create_dataframe_from_logical_plan(lp))
    return stage_read(name, named_struct(ctx.table(name).schema()))
