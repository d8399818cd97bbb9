"""Helpers over Substrait protobuf relations and expressions.

The distributed planner works on the Substrait plan that DataFusion's producer
emits for the optimized logical plan (``datafusion.substrait.Producer``). These
helpers read and build the few shapes it needs: field references, stage-input
``ReadRel`` leaves, joins, casts and function calls; walking the relation tree
is :mod:`~distfusion.planner.walk`'s (see docs/architecture.md, the planner).
Field references are positional, which is what makes cutting a plan into
fragments safe: a subtree replaced by a ``ReadRel`` with the same output columns
keeps every parent reference valid.

Types are never derived by hand here: :class:`SchemaOracle` asks DataFusion
itself (it consumes the subtree and reads the Arrow schema), so the types a stage
declares are exactly the types its tasks produce.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable

import pyarrow as pa
from datafusion import SessionContext
from datafusion.substrait import Consumer, Producer, Serde
from google.protobuf.internal import api_implementation
from substrait.proto import (
    AggregateFunction,
    Expression,
    FunctionArgument,
    NamedStruct,
    Plan,
    PlanRel,
    Rel,
    RelRoot,
    Type,
)

from distfusion import udfs
from distfusion.errors import NotDistributableError
from distfusion.planner.walk import (
    child_fields,
    children,
    is_subquery,
    own_contains,
    rel_kind,
    root_field_refs,
    set_children,
    walk,
)
from distfusion.sources import sql_name

__all__ = [
    "SchemaOracle",
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
    "RelRewrite",
    "filtered_read",
    "consume_plan",
    "fits_decoder",
    "parse_plan",
]


# protobuf's implementation -> its native module with SetAllowOversizeProtos.
_PROTOBUF_RUNTIMES = {"upb": "google._upb._message", "cpp": "google.protobuf.pyext._message"}


def _allow_deep_messages() -> None:
    """Lift the Python protobuf parser's nesting limit (100) for this process.

    A plan DataFusion accepts may nest deeper than 100 messages (a 40-table
    join nests hundreds of levels deep), and the upb runtime re-parses a message on
    ``CopyFrom``. ``SetAllowOversizeProtos`` is upb's switch for this (its
    limit becomes 65535). The pure-Python parser has no such limit; the C++ one
    has the same switch.
    """
    runtime = _PROTOBUF_RUNTIMES.get(api_implementation.Type())
    if runtime is not None:  # loaded already: it is the runtime protobuf uses
        importlib.import_module(runtime).SetAllowOversizeProtos(True)


_allow_deep_messages()


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
        if own_contains(node, is_subquery):
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


class SchemaOracle:
    """Asks DataFusion for the Arrow schema of Substrait subtrees.

    Holds a planning :class:`SessionContext` with an empty table for every source
    table and every stage input created so far, so any subtree of the query can be
    consumed. Used only on the coordinator, during planning.
    """

    def __init__(self, plan: Plan, source_schemas: dict[str, pa.Schema]) -> None:
        self._plan = plan
        self.ctx = SessionContext()
        udfs.add_to(self.ctx)  # a fragment may call a registered Python UDF
        # Serialized subtree -> schema: tables are only ever added, so a
        # subtree's schema never changes while one query is planned.
        self._schemas: dict[bytes, pa.Schema] = {}
        for name, schema in source_schemas.items():
            self.register_empty(name, schema)

    def register_empty(self, name: str, schema: pa.Schema) -> None:
        """Register an empty table ``name`` with ``schema`` in the planning context."""
        batch = pa.RecordBatch.from_pylist([], schema=schema)
        self.ctx.register_record_batches(sql_name(name), [[batch]])

    def _as_plan(self, rel: Rel, names: list[str] | None = None) -> Plan:
        p = Plan()
        p.extensions.extend(self._plan.extensions)
        p.extension_urns.extend(self._plan.extension_urns)
        if self._plan.HasField("version"):
            p.version.CopyFrom(self._plan.version)
        if names is None:
            p.relations.append(PlanRel(rel=rel))
        else:
            p.relations.append(PlanRel(root=RelRoot(input=rel, names=names)))
        return p

    def plan_bytes(self, rel: Rel, names: list[str]) -> bytes:
        """Serialized Substrait plan whose root is ``rel`` with output ``names``."""
        return self._as_plan(rel, names).SerializeToString()

    def logical_plan(self, plan_bytes: bytes):
        """DataFusion's logical plan for serialized Substrait ``plan_bytes`` (consume_plan)."""
        return consume_plan(self.ctx, plan_bytes)

    def schema(self, rel: Rel) -> pa.Schema:
        """The Arrow schema of ``rel``'s output.

        Raises:
            NotDistributableError: DataFusion cannot consume the subtree.
        """
        key = rel.SerializeToString()  # the plan around it is the same for every rel
        if key in self._schemas:
            return self._schemas[key]
        try:
            lp = consume_plan(self.ctx, self._as_plan(rel).SerializeToString())
            schema = self.ctx.create_dataframe_from_logical_plan(lp).schema()
            self._schemas[key] = schema
            return schema
        except Exception as exc:  # DataFusion raises bare Exception
            msg = f"cannot derive the schema of a plan fragment: {exc}"
            raise NotDistributableError(msg) from exc


class RelRewrite:
    """A rewrite of a plan's relation tree, inputs first (``rewrite`` each relation).

    The base of the Substrait passes that run before stages are cut
    (``push_semi_joins``, ``push_dimension_joins``, ``reduce_aggregate_inputs``).
    A relation none of whose inputs changed is not copied.
    """

    def __init__(self, plan: Plan, oracle: SchemaOracle) -> None:
        self.plan = plan
        self.oracle = oracle
        self.registry = FunctionRegistry(plan)

    def arity(self, rel: Rel) -> int:
        """Number of output columns of ``rel``."""
        return len(self.oracle.schema(rel))

    def project_sources(self, project: Rel, columns) -> dict[int, int] | None:
        """Input column of each output column in ``columns`` of ``project``.

        None when one of them is computed rather than passed through.
        """
        width = self.arity(project.project.input)
        out = {}
        for c in columns:
            pre = before_emit(project, c)
            source = pre if pre < width else is_field_ref(project.project.expressions[pre - width])
            if source is None:
                return None
            out[c] = source
        return out

    def rewrite(self, rel: Rel) -> Rel:
        """``rel`` (inputs already rewritten), rewritten; the default keeps it."""
        return rel

    def visit(self, rel: Rel) -> Rel:
        """``rel`` with its inputs and then itself rewritten."""
        inputs = children(rel)
        new = [self.visit(c) for c in inputs]
        if any(n is not c for n, c in zip(new, inputs, strict=True)):
            rel = set_children(rel, new)
        return self.rewrite(rel)

    def apply(self) -> Plan:
        """Rewrite the plan's root relation in place; return the plan."""
        for relation in self.plan.relations:
            if relation.HasField("root"):
                new = self.visit(relation.root.input)
                if new is not relation.root.input:
                    relation.root.input.CopyFrom(new)
        return self.plan


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
    for m in reversed(list(walk(msg))):
        if (
            isinstance(m, Rel)
            and m.WhichOneof("rel_type") == "read"
            and m.read.WhichOneof("read_type") == "named_table"
            and m.read.named_table.names[-1] in source_names
        ):
            new = unproject_read(m)
            if new is not m:
                m.CopyFrom(new)


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
