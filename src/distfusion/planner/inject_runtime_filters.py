"""Runtime filters: a selective join side filters the other side by its keys before it moves.

A semi-join reduction (Bernstein and Chiu, 1981; Spark's
``InjectRuntimeFilter`` does it with a Bloom filter): the stage that holds the
selective side's keys (a :class:`~distfusion.planner.fragment.KeySource`) is
read as a broadcast by the other side's tasks, which keep only rows whose keys
it holds (a left semi join) before their exchange. The join distribution
(:mod:`~distfusion.planner.distribute_joins`) decides where; this module
decides whether it pays (a selective side of at most ``runtime_filter_bytes``,
a target :data:`~distfusion.planner.estimate.REDUCTION_RATIO` times larger,
keys that hash alike) and builds it. The filters that run before stages are
cut are :mod:`~distfusion.planner.reduce_aggregate_inputs`. See
docs/architecture.md (the planner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
from substrait.proto import Expression, JoinRel, Plan, Rel

from distfusion.planner.estimate import (
    REDUCTION_KEPT,
    REDUCTION_RATIO,
    Estimate,
    key_share,
)
from distfusion.planner.fragment import Fragment, KeySource
from distfusion.planner.walk_host import WalkHost
from distfusion.protocol.hashing import hash_type
from distfusion.stages import BROADCAST, COALESCE, Stage, StageInput
from distfusion.substrait_plan.build import (
    boolean_type,
    field_ref,
    is_field_ref,
    join_rel,
    named_struct,
    stage_read,
)
from distfusion.substrait_plan.lineage import read_column
from distfusion.substrait_plan.walk import set_children

__all__ = ["REDUCE_LEFT", "REDUCE_RIGHT", "RuntimeFilters"]

_J = JoinRel
# Join types whose output depends on a right row only through a left row with
# its key: right rows whose keys the left side lacks may be dropped early. (A
# semi join drops unmatched rows of both sides; an anti join keeps its own.)
REDUCE_RIGHT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_LEFT,
    _J.JOIN_TYPE_LEFT_SEMI,
    _J.JOIN_TYPE_LEFT_ANTI,
    _J.JOIN_TYPE_RIGHT_SEMI,
}
REDUCE_LEFT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_RIGHT,
    _J.JOIN_TYPE_RIGHT_SEMI,
    _J.JOIN_TYPE_RIGHT_ANTI,
    _J.JOIN_TYPE_LEFT_SEMI,
}


class RuntimeFilters(WalkHost):
    """The planner's runtime filters (a mixin of the planner's walk).

    Uses the planner's ``config``, ``oracle``, ``registry``, ``stages``,
    ``materialized``, ``ran``, ``tables``, its ``seal`` and ``_include``.
    """

    def _key_source(
        self, frag: Fragment, inp: StageInput, keys: list[Expression]
    ) -> KeySource | None:
        """``frag``, sealed as ``inp`` hashing ``keys``, as a source of its key values."""
        refs = [is_field_ref(k) for k in keys]
        columns = [c for c in refs if c is not None]
        if len(columns) < len(refs):  # computed keys are not kept in the output
            return None
        return KeySource(inp, tuple(columns), frag.est)

    def _smallest_key_source(
        self, frag: Fragment, own: KeySource | None, keys: list[Expression]
    ) -> KeySource | None:
        """The smallest stage holding every value ``keys`` take in ``frag``.

        ``own`` (``frag``'s own output, or None), or a stage upstream whose
        columns reach ``keys`` unchanged (:meth:`_traced_key_source`): TPC-H
        Q10's filtered ``orders`` (9 MiB at SF10) rather than its join with
        ``customer`` (102 MiB), whose order keys are a subset of them.
        """
        traced = self._traced_key_source(frag, keys)
        if own is None or (traced is not None and traced.est.low_bytes < own.est.low_bytes):
            return traced
        return own

    def _traced_key_source(self, frag: Fragment, keys: list[Expression]) -> KeySource | None:
        """The smallest stage upstream of ``frag`` whose columns hold every value of ``keys``.

        Each key must be a column that reaches ``frag``'s output unchanged from
        one read of a stage (:func:`read_column`), followed on into that
        stage's fragment, and so on: every stage on the way is a candidate.
        None when a key is computed, or the keys come from different reads or
        from a source table.
        """
        refs = [is_field_ref(k) for k in keys]
        columns = [c for c in refs if c is not None]
        if len(columns) < len(refs):
            return None
        best = None
        rel, inputs = frag.rel, list(frag.inputs)
        while True:
            traced = [read_column(rel, c) for c in columns]
            reads = [t for t in traced if t is not None]
            tables = {found[0] if found else None for found in traced}
            inp = next((i for i in inputs if i.table in tables), None)
            if len(tables) != 1 or inp is None or len(reads) < len(traced):  # the last: implied
                return best
            columns = [c for _, c in reads]
            found = self._key_stage(inp.stage_id)
            if found is None:
                return best
            stage, est = found
            if best is None or est.low_bytes < best.est.low_bytes:
                best = KeySource(inp, tuple(columns), est)
            plan = Plan()
            plan.ParseFromString(stage.fragment)
            rel, inputs = plan.relations[0].root.input, list(stage.inputs)

    def _key_stage(self, stage_id: int) -> tuple[Stage, Estimate] | None:
        """Stage ``stage_id`` and its output's estimate: measured when it ran, else planned.

        None for a stage this plan does not know.
        """
        ran = next((m for m in self.materialized.values() if m.stage.stage_id == stage_id), None)
        stage = ran.stage if ran else next((s for s in self.stages if s.stage_id == stage_id), None)
        if stage is None:
            return None
        kept = min(1.0, stage.estimated_bytes / max(stage.estimated_max_bytes, 1e-9))
        if ran:
            return stage, Estimate(ran.rows, ran.bytes, kept)
        return stage, Estimate(stage.estimated_rows, stage.estimated_bytes, kept)

    def _key_types(self, rel: Rel, keys: list[Expression]) -> list[pa.DataType]:
        """The Arrow types of ``keys`` evaluated over ``rel``'s output."""
        probe = Rel()
        probe.project.input.CopyFrom(rel)
        probe.project.expressions.extend(keys)
        return self.oracle.schema(probe).types[-len(keys) :]

    def _reduction_pays(
        self,
        target: Fragment,
        keys: list[Expression],
        types: list[pa.DataType],
        est: Estimate,
        row_types: Callable[[], list[pa.DataType]],
    ) -> bool:
        """Whether to filter ``target`` by the keys (of ``types``) of a side estimated ``est``.

        The side (its columns of the types ``row_types()`` gives, asked last)
        must be selective (``kept`` at most :data:`REDUCTION_KEPT`), ``target``
        at least :data:`REDUCTION_RATIO` times larger, and the side small
        enough (:meth:`PlannerConfig.reduction_fits`; what the filter holds is
        its keys, their :func:`key_share` of its likely bytes, as Spark's
        creation side threshold bounds a Bloom filter's keys); the keys must
        hash alike.
        """
        if est.kept > REDUCTION_KEPT or target.est.bytes < REDUCTION_RATIO * est.low_bytes:
            return False
        if not self.config.reduction_fits(
            est.low_bytes,
            target.est.bytes,
            target.tasks,
            lambda: est.low_bytes * key_share(types, row_types()),
        ):
            return False
        mine = self._key_types(target.rel, keys)
        return all(hash_type(a) == hash_type(b) for a, b in zip(mine, types, strict=True))

    def _reduce(self, frag: Fragment, keys: list[Expression], source: KeySource | None) -> Fragment:
        """``frag`` without the rows whose ``keys`` are not in ``source`` (when that pays).

        A semi-join reduction (Bernstein and Chiu, 1981; Spark's
        ``InjectRuntimeFilter`` does it with a Bloom filter): a left semi join
        on ``keys`` against the source stage's output, which every task of
        ``frag`` reads as a broadcast. It drops only rows that match nothing
        in the join above, whose type the caller checked
        (:data:`REDUCE_RIGHT`, :data:`REDUCE_LEFT`).
        """
        if source is None or any(i.stage_id == source.input.stage_id for i in frag.inputs):
            return frag  # already filtered by (or joined with) the source's stage
        schema = source.input.schema
        types = [schema.field(c).type for c in source.columns]
        if not self._reduction_pays(frag, keys, types, source.est, lambda: schema.types):
            return frag
        if not any(s.stage_id == source.input.stage_id for s in self.stages):
            self._include(self.ran[source.input.stage_id])  # traced to a stage that ran
        if source.input.table not in self.tables:  # read here under the name a stage read it
            self.tables.add(source.input.table)
            self.oracle.register_empty(source.input.table, schema)
        arity = len(self.oracle.schema(frag.rel))
        condition = self.registry.conjunction(
            [
                self.registry.call("equal", k, field_ref(arity + c), output_type=boolean_type())
                for k, c in zip(keys, source.columns, strict=True)
            ]
        )
        read = stage_read(source.input.table, named_struct(schema))
        rel = join_rel(frag.rel, read, condition, _J.JOIN_TYPE_LEFT_SEMI)
        index = next(i for i, s in enumerate(self.stages) if s.stage_id == source.input.stage_id)
        producer = self.stages[index]
        readers = producer.output.readers + frag.tasks
        self.stages[index] = replace(producer, output=replace(producer.output, readers=readers))
        inp = replace(source.input, boundary=BROADCAST, partitions=producer.output.num_partitions)
        return replace(frag, rel=rel, inputs=frag.inputs + [inp])

    def _creation_side(self, join_type: int, left: Fragment, right: Fragment) -> str | None:
        """The side of a shuffle join that may filter the other side by its keys."""
        options = []
        if join_type in REDUCE_RIGHT and left.est.kept <= REDUCTION_KEPT:
            options.append((left.est.low_bytes, "left"))
        if join_type in REDUCE_LEFT and right.est.kept <= REDUCTION_KEPT:
            options.append((right.est.low_bytes, "right"))
        return min(options)[1] if options and self.config.runtime_filter_bytes else None

    def _one_task_reduction(
        self,
        rel: Rel,
        join_type: int,
        side: str,
        probe: Fragment,
        build: Fragment,
        keys: list[tuple[Expression, Expression]],
        est: Estimate,
    ) -> Fragment | None:
        """A join of one-task ``probe`` and a large ``build`` reduced by ``probe``'s keys.

        ``probe`` becomes a stage of its own: ``build``'s tasks read it as a
        broadcast and keep only matching rows before they are gathered into the
        join's one task, which reads ``probe``'s output as well. None when the
        reduction does not pay or the join type does not allow it.
        """
        if join_type not in (REDUCE_RIGHT if side == "right" else REDUCE_LEFT):
            return None
        mine, theirs = (0, 1) if side == "right" else (1, 0)
        probe_keys = [k[mine] for k in keys]
        build_keys = [k[theirs] for k in keys]
        if any(is_field_ref(k) is None for k in probe_keys):
            return None
        types = self._key_types(probe.rel, probe_keys)
        if not self._reduction_pays(
            build, build_keys, types, probe.est, lambda: self.oracle.schema(probe.rel).types
        ):
            return None
        pread, pinp = self.seal(probe, COALESCE)
        reduced = self._reduce(build, build_keys, self._key_source(probe, pinp, probe_keys))
        bread, binp = self.seal(reduced, COALESCE)
        if side == "right":
            return Fragment(set_children(rel, [pread, bread]), 1, est, [pinp, binp])
        return Fragment(set_children(rel, [bread, pread]), 1, est, [binp, pinp])
