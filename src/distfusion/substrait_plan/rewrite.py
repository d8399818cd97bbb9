"""Rewriting a Substrait plan with the types DataFusion derives for it.

Types are never derived by hand here: :class:`SchemaOracle` asks DataFusion
itself (it consumes the subtree and reads the Arrow schema), so the types a stage
declares are exactly the types its tasks produce. :class:`RelRewrite` is the
base of the planner's rewrites of the relation tree
(:mod:`distfusion.planner.push_semi_joins`, ...). Used only on the coordinator.
"""

from __future__ import annotations

import pyarrow as pa
from datafusion import SessionContext
from substrait.proto import Plan, PlanRel, Rel, RelRoot

from distfusion.errors import NotDistributableError
from distfusion.io.sources import sql_name
from distfusion.substrait_plan.build import FunctionRegistry, before_emit, conjuncts, is_field_ref
from distfusion.substrait_plan.decode import consume_plan
from distfusion.substrait_plan.walk import children, set_children
from distfusion.udfs import Functions

__all__ = ["RelRewrite", "SchemaOracle"]


class SchemaOracle:
    """Asks DataFusion for the Arrow schema of Substrait subtrees.

    Holds a planning :class:`SessionContext` with an empty table for every source
    table and every stage input created so far, so any subtree of the query can be
    consumed. Used only on the coordinator, during planning.
    """

    def __init__(
        self,
        plan: Plan,
        source_schemas: dict[str, pa.Schema],
        functions: Functions | None = None,
    ) -> None:
        """``functions``: the query's Python UDFs, which a fragment may call; None: none."""
        self._plan = plan
        self.ctx = SessionContext()
        if functions is not None:
            functions.add_to(self.ctx)
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
    (``push_semi_joins``, ``push_dimension_joins``, ``aggregate_before_joins``,
    ``reduce_aggregate_inputs``).
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

    def key_pairs(self, join: Rel) -> list[tuple[int, int]]:
        """(left column, right column) of the join's ``left = right`` conjuncts.

        The right column counts from the right input's first; other conjuncts
        are left out.
        """
        if not join.join.HasField("expression"):
            return []
        width = self.arity(join.join.left)
        pairs = []
        for c in conjuncts(join.join.expression, self.registry):
            if c.WhichOneof("rex_type") != "scalar_function":
                continue
            fn = c.scalar_function
            if self.registry.name(fn.function_reference) != "equal" or len(fn.arguments) != 2:
                continue
            a, b = (is_field_ref(arg.value) for arg in fn.arguments)
            if a is None or b is None:
                continue
            if a < width <= b:
                pairs.append((a, b - width))
            elif b < width <= a:
                pairs.append((b, a - width))
        return pairs

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
