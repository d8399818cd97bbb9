"""Reading and building Substrait relations and expressions.

The distributed planner works on the Substrait plan that DataFusion's producer
emits for the optimized logical plan (``datafusion.substrait.Producer``). These
helpers read and build the few shapes it needs: field references, stage-input
``ReadRel`` leaves, joins, casts and function calls; walking the relation tree
is :mod:`~distfusion.substrait_plan.walk`'s, decoding a plan
:mod:`~distfusion.substrait_plan.decode`'s and rewriting one with the types
DataFusion derives :mod:`~distfusion.substrait_plan.rewrite`'s (see
docs/architecture.md, the planner). Field references are positional, which is
what makes cutting a plan into fragments safe: a subtree replaced by a
``ReadRel`` with the same output columns keeps every parent reference valid.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from datafusion import SessionContext
from datafusion.substrait import Producer
from substrait.proto import (
    AggregateFunction,
    Expression,
    FunctionArgument,
    NamedStruct,
    Plan,
    Rel,
    Type,
)

from distfusion.errors import NotDistributableError
from distfusion.substrait_plan.walk import (
    children,
    own_has_subquery,
    read_rels,
    rel_kind,
    root_field_refs,
)

__all__ = [
    "FunctionRegistry",
    "before_emit",
    "field_ref",
    "shift_field_refs",
    "map_field_refs",
    "is_field_ref",
    "stage_read",
    "join_rel",
    "conjuncts",
    "conjunct_names",
    "rebase_join_condition",
    "filtered_read",
    "boolean_type",
    "cast",
    "named_struct",
    "unproject_read",
    "unproject_source_reads",
]


def before_emit(rel: Rel, column: int) -> int:
    """Index, in ``rel``'s output before its emit (``common.emit``), of its output ``column``."""
    common = getattr(rel, rel_kind(rel)).common
    return common.emit.output_mapping[column] if common.HasField("emit") else column


def field_ref(index: int) -> Expression:
    """An expression reading input column ``index`` (0-based)."""
    e = Expression()
    e.selection.direct_reference.struct_field.field = index
    e.selection.root_reference.SetInParent()
    return e


def is_field_ref(expr: Expression) -> int | None:
    """The column index if ``expr`` is a plain reference to an input column, else None."""
    if expr.WhichOneof("rex_type") != "selection":
        return None
    sel = expr.selection
    if (
        not sel.HasField("root_reference")
        or sel.direct_reference.WhichOneof("reference_type") != "struct_field"
    ):
        return None
    sf = sel.direct_reference.struct_field
    if sf.HasField("child"):
        return None
    return sf.field


def map_field_refs(expr: Expression, column: Callable[[int], int]) -> Expression:
    """A copy of ``expr`` whose root field reference to column ``i`` reads ``column(i)``."""
    out = Expression()
    out.CopyFrom(expr)
    for sf in root_field_refs(out):
        sf.field = column(sf.field)
    return out


def shift_field_refs(expr: Expression, delta: int) -> Expression:
    """A copy of ``expr`` with every root field reference moved by ``delta`` columns."""
    return map_field_refs(expr, lambda i: i + delta)


def conjuncts(expr: Expression, registry: FunctionRegistry) -> list[Expression]:
    """Split ``a AND b AND c`` into ``[a, b, c]``."""
    if expr.WhichOneof("rex_type") == "scalar_function":
        if registry.name(expr.scalar_function.function_reference) == "and":
            out: list[Expression] = []
            for arg in expr.scalar_function.arguments:
                out.extend(conjuncts(arg.value, registry))
            return out
    return [expr]


def rebase_join_condition(
    condition: Expression, left: dict[int, int], old_width: int, new_width: int
) -> Expression:
    """A join ``condition`` for a new left input of ``new_width`` columns.

    Left column ``i`` (below ``old_width``) becomes ``left[i]``; right columns
    keep their order after the new left input.
    """
    return map_field_refs(
        condition, lambda i: left[i] if i < old_width else i - old_width + new_width
    )


def conjunct_names(condition: Expression, registry: FunctionRegistry) -> list[str | None]:
    """The function each conjunct of ``condition`` calls (None: not a call)."""
    return [
        registry.name(c.scalar_function.function_reference)
        if c.WhichOneof("rex_type") == "scalar_function"
        else None
        for c in conjuncts(condition, registry)
    ]


def filtered_read(rel: Rel, registry: FunctionRegistry) -> tuple[Rel, list[str | None]] | None:
    """``rel`` as projections and filters over one named-table read, if it is one.

    Returns the read and the function names of the filters' conjuncts (the
    read's own pushed-down filter when there is no filter relation; empty when
    unfiltered), or None for any other shape or a subquery in a filter.
    """
    names: list[str | None] = []
    node = rel
    while rel_kind(node) in ("project", "filter"):
        if own_has_subquery(node):
            return None
        if rel_kind(node) == "filter":
            names.extend(conjunct_names(node.filter.condition, registry))
        node = children(node)[0]
    if rel_kind(node) != "read" or not node.read.HasField("named_table"):
        return None
    if not names and node.read.HasField("filter"):
        names = conjunct_names(node.read.filter, registry)
    return node, names


def join_rel(left: Rel, right: Rel, condition: Expression, join_type: int) -> Rel:
    """A ``JoinRel`` of ``join_type`` (``JoinRel.JOIN_TYPE_*``) on ``condition``."""
    rel = Rel()
    rel.join.left.CopyFrom(left)
    rel.join.right.CopyFrom(right)
    rel.join.expression.CopyFrom(condition)
    rel.join.type = join_type
    return rel


def stage_read(table_name: str, schema: NamedStruct) -> Rel:
    """A leaf ``ReadRel`` of the named stage-input table with ``schema`` columns."""
    rel = Rel()
    rel.read.base_schema.CopyFrom(schema)
    rel.read.named_table.names.append(table_name)
    return rel


class FunctionRegistry:
    """The plan's function extension declarations: anchors to names and back.

    Names are DataFusion's (``"sum"``, ``"equal"``), possibly with a signature
    suffix after ``":"`` which is ignored. New functions are declared on demand.
    """

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._names: dict[int, str] = {}
        for ext in plan.extensions:
            if ext.HasField("extension_function"):
                f = ext.extension_function
                self._names[f.function_anchor] = f.name.split(":", 1)[0]

    def name(self, anchor: int) -> str:
        """The function name declared for ``anchor`` (``""`` when unknown)."""
        return self._names.get(anchor, "")

    def anchor(self, name: str) -> int:
        """The anchor of function ``name``, declaring it in the plan if needed."""
        for a, n in self._names.items():
            if n == name:
                return a
        a = max(self._names, default=-1) + 1
        ext = self._plan.extensions.add()
        ext.extension_function.function_anchor = a
        ext.extension_function.name = name
        # DataFusion's producer leaves the URN reference unset (u32::MAX).
        ext.extension_function.extension_urn_reference = 4294967295
        self._names[a] = name
        return a

    def call(self, name: str, *args: Expression, output_type: Type | None = None) -> Expression:
        """A scalar function call expression."""
        e = Expression()
        e.scalar_function.function_reference = self.anchor(name)
        for a in args:
            e.scalar_function.arguments.add().value.CopyFrom(a)
        if output_type is not None:
            e.scalar_function.output_type.CopyFrom(output_type)
        return e

    def conjunction(self, conditions: list[Expression]) -> Expression:
        """``c1 AND c2 AND ...`` of one or more ``conditions`` (see :func:`conjuncts`)."""
        out = conditions[0]
        for c in conditions[1:]:
            out = self.call("and", out, c, output_type=boolean_type())
        return out

    def aggregate(self, name: str, *args: Expression) -> AggregateFunction:
        """An aggregate function over ``args`` (invocation ALL)."""
        f = AggregateFunction()
        f.function_reference = self.anchor(name)
        f.invocation = AggregateFunction.AGGREGATION_INVOCATION_ALL
        for a in args:
            f.arguments.append(FunctionArgument(value=a))
        return f


def boolean_type() -> Type:
    """The nullable Substrait boolean type (the output type of predicates)."""
    t = Type()
    t.bool.nullability = Type.NULLABILITY_NULLABLE
    return t


def cast(expr: Expression, to: Type) -> Expression:
    """``CAST(expr AS to)`` (failure behaviour: throw)."""
    e = Expression()
    e.cast.type.CopyFrom(to)
    e.cast.input.CopyFrom(expr)
    e.cast.failure_behavior = Expression.Cast.FAILURE_BEHAVIOR_THROW_EXCEPTION
    return e


_NAMED_STRUCTS: dict[pa.Schema, NamedStruct] = {}


def named_struct(schema: pa.Schema) -> NamedStruct:
    """The Substrait ``NamedStruct`` DataFusion's producer writes for ``schema``.

    Columns are named ``c0..`` (positional; callers that need other names set
    them). Every field is declared nullable, so that a task whose output happens to be
    non-nullable still satisfies the declaration (DataFusion's consumer accepts a
    non-nullable column where Substrait says nullable, not the reverse).

    Raises:
        NotDistributableError: a type has no Substrait equivalent in DataFusion's producer.
    """
    schema = pa.schema([pa.field(f"c{i}", f.type, True) for i, f in enumerate(schema)])
    cached = _NAMED_STRUCTS.get(schema)
    if cached is not None:
        return cached
    ctx = SessionContext()
    ctx.register_record_batches("t", [[pa.RecordBatch.from_pylist([], schema=schema)]])
    try:
        sp = Producer.to_substrait_plan(ctx.table("t").logical_plan(), ctx)
    except Exception as exc:
        msg = f"a column type cannot cross a network boundary ({schema}): {exc}"
        raise NotDistributableError(msg) from exc
    p = Plan()
    p.ParseFromString(sp.encode())
    rel = p.relations[0].root.input
    while rel_kind(rel) != "read":
        rel = children(rel)[0]
    ns = NamedStruct()
    ns.CopyFrom(rel.read.base_schema)
    _NAMED_STRUCTS[schema] = ns
    return ns


def unproject_read(rel: Rel) -> Rel:
    """A source ``ReadRel`` without projection or filter, those moved above it.

    Tasks bind a source table to their share of its files as a DataFusion view,
    and DataFusion's consumer applies a ``ReadRel`` projection only to a plain
    table scan. The equivalent ``Project(Filter(Read))`` is accepted, and
    DataFusion's optimizer pushes both back into the scan when the task runs.
    """
    read = rel.read
    if not (
        read.HasField("projection")
        or read.HasField("filter")
        or read.HasField("best_effort_filter")
    ):
        return rel
    cur = Rel()
    cur.read.CopyFrom(read)
    for name in ("projection", "filter", "best_effort_filter"):
        cur.read.ClearField(name)
    for name in ("filter", "best_effort_filter"):
        if read.HasField(name):
            f = Rel()
            f.filter.input.CopyFrom(cur)
            f.filter.condition.CopyFrom(getattr(read, name))
            cur = f
    if read.HasField("projection"):
        n = len(read.base_schema.struct.types)
        items = [i.field for i in read.projection.select.struct_items]
        p = Rel()
        p.project.input.CopyFrom(cur)
        p.project.expressions.extend(field_ref(i) for i in items)
        p.project.common.emit.output_mapping.extend(range(n, n + len(items)))
        cur = p
    return cur


def unproject_source_reads(msg, source_names: set[str]) -> None:
    """Apply :func:`unproject_read` in place to every source read inside ``msg``.

    Reaches reads nested in subquery expressions too.
    """
    # Reverse pre-order: a read inside a subquery of a read's filter is
    # rewritten before the read that holds it is replaced.
    for m in reversed(list(read_rels(msg))):
        if (
            m.read.WhichOneof("read_type") == "named_table"
            and m.read.named_table.names[-1] in source_names
        ):
            new = unproject_read(m)
            if new is not m:
                m.CopyFrom(new)
