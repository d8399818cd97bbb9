"""Column lineage: which read's column a relation's output column passes on unchanged.

Used by the runtime filters (:mod:`~distfusion.planner.inject_runtime_filters`)
to find the smallest stage whose output holds every value a join key takes.
"""

from __future__ import annotations

from substrait.proto import JoinRel, Rel

from distfusion.substrait_plan.build import before_emit, is_field_ref
from distfusion.substrait_plan.walk import children, rel_kind

__all__ = ["arity", "read_column"]

# Join types whose output is the left side's columns then the right side's.
_BOTH_SIDES = {
    JoinRel.JOIN_TYPE_INNER,
    JoinRel.JOIN_TYPE_OUTER,
    JoinRel.JOIN_TYPE_LEFT,
    JoinRel.JOIN_TYPE_RIGHT,
    JoinRel.JOIN_TYPE_LEFT_SINGLE,
    JoinRel.JOIN_TYPE_RIGHT_SINGLE,
}


def read_column(rel: Rel, column: int) -> tuple[str, int] | None:
    """``(table, column)`` of the read whose column ``rel``'s output ``column`` passes on.

    Followed down through filters, sorts, fetches, projections of plain column
    references, the grouping keys of an aggregate and either side of a join:
    each keeps a subset of its input's rows (an outer join adds nulls, which
    match nothing) with the values unchanged. None past anything else.
    """
    while True:
        kind = rel_kind(rel)
        column = before_emit(rel, column)
        if kind == "read":
            read = rel.read
            if not read.HasField("named_table"):
                return None
            if read.HasField("projection"):
                column = read.projection.select.struct_items[column].field
            return ".".join(read.named_table.names), column
        if kind in ("filter", "sort", "fetch"):
            (rel,) = children(rel)
        elif kind == "project":
            (child,) = children(rel)
            width = arity(child)
            if width is None:
                return None
            if column >= width:
                passed = is_field_ref(rel.project.expressions[column - width])
                if passed is None:
                    return None
                column = passed
            rel = child
        elif kind == "aggregate":
            agg = rel.aggregate
            width = len(agg.grouping_expressions)
            if column >= width or [list(g.expression_references) for g in agg.groupings] != [
                list(range(width))
            ]:
                return None
            grouped = is_field_ref(agg.grouping_expressions[column])
            if grouped is None:
                return None
            column = grouped
            rel = agg.input
        elif kind in ("join", "cross"):
            left, right = children(rel)
            join_type = rel.join.type if kind == "join" else JoinRel.JOIN_TYPE_INNER
            if join_type in (JoinRel.JOIN_TYPE_LEFT_SEMI, JoinRel.JOIN_TYPE_LEFT_ANTI):
                rel = left
            elif join_type in (JoinRel.JOIN_TYPE_RIGHT_SEMI, JoinRel.JOIN_TYPE_RIGHT_ANTI):
                rel = right
            elif join_type in _BOTH_SIDES:
                width = arity(left)
                if width is None:
                    return None
                rel, column = (left, column) if column < width else (right, column - width)
            else:  # a mark join's mark
                return None
        else:
            return None


def arity(rel: Rel) -> int | None:
    """Columns of ``rel``'s output, from the plan alone; None for a kind not known here."""
    kind = rel_kind(rel)
    common = getattr(rel, kind).common
    if common.HasField("emit"):
        return len(common.emit.output_mapping)
    if kind == "read":
        read = rel.read
        if read.HasField("projection"):
            return len(read.projection.select.struct_items)
        return len(read.base_schema.struct.types)
    if kind in ("filter", "sort", "fetch"):
        return arity(children(rel)[0])
    if kind == "project":
        width = arity(rel.project.input)
        return None if width is None else width + len(rel.project.expressions)
    if kind == "aggregate" and len(rel.aggregate.groupings) <= 1:
        return len(rel.aggregate.grouping_expressions) + len(rel.aggregate.measures)
    if kind in ("join", "cross"):
        left, right = (arity(c) for c in children(rel))
        if left is None or right is None:
            return None
        join_type = rel.join.type if kind == "join" else JoinRel.JOIN_TYPE_INNER
        if join_type in (JoinRel.JOIN_TYPE_LEFT_SEMI, JoinRel.JOIN_TYPE_LEFT_ANTI):
            return left
        if join_type in (JoinRel.JOIN_TYPE_RIGHT_SEMI, JoinRel.JOIN_TYPE_RIGHT_ANTI):
            return right
        return left + right if join_type in _BOTH_SIDES else None
    return None
