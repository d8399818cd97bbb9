"""The distributed planner: cut a Substrait plan into stages at network boundaries.

Walks the relation tree bottom-up, keeping a *fragment in progress* (the current
stage: a relation tree, its task count, its inputs). Operators that distribute
pipeline into it; operators that need rows from other tasks *seal* it into a
:class:`~distfusion.stages.Stage` and start a new fragment reading the sealed
stage's output through a ``ReadRel`` of table ``__stage_N``. The rules are
docs/architecture.md's, like Spark's exchange planning:

==================  ==========================================================
relation            boundary
==================  ==========================================================
read (source)       leaf stage; work units split across the tasks
filter, project     pipelined
aggregate           partial -> shuffle by keys -> final (coalesce if global);
                    non-decomposable: shuffle raw rows by keys (or coalesce)
join (equi)         broadcast the small side if the join type allows it,
                    else shuffle both sides by the key expressions; a
                    selective small side also filters the other side by its
                    keys before that side's exchange (semi-join reduction)
join (no keys)      broadcast a side the join type allows, else coalesce both
sort                sort per task -> coalesce -> sort (merge)
fetch over sort     top-k per task -> coalesce -> top-k
fetch               limit per task -> coalesce -> limit
union all           round-robin shuffle of every input into one stage
window              shuffle by PARTITION BY keys; none or mixed -> coalesce
anything else       coalesce every input, run in one task
==================  ==========================================================

An uncorrelated scalar subquery in a filter or projection is planned as a
query of its own and gathered into one task; the consumer's tasks read its one
row as a broadcast. Any other relation whose expressions hold a subquery runs
in a single task that reads every table of the subquery in full: correct
first, fast second.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field, replace

import pyarrow as pa
from substrait.proto import Expression, JoinRel, Plan, Rel, SetRel

from distfusion.errors import PlanningError
from distfusion.planner import decompose_aggregate as dagg
from distfusion.planner.config import PlannerConfig
from distfusion.planner.estimate import (
    REDUCTION_KEPT,
    REDUCTION_RATIO,
    Estimate,
    filter_selectivity,
)
from distfusion.planner.push_dimension_joins import push_dimension_joins
from distfusion.planner.push_semi_joins import push_semi_joins
from distfusion.planner.reduce_aggregate_inputs import reduce_aggregate_inputs
from distfusion.planner.substrait import (
    FunctionRegistry,
    SchemaOracle,
    boolean_type,
    conjunct_names,
    conjuncts,
    field_ref,
    is_field_ref,
    join_rel,
    named_struct,
    shift_field_refs,
    stage_read,
    unproject_read,
    unproject_source_reads,
)
from distfusion.planner.walk import (
    children,
    contains,
    field_refs,
    is_subquery,
    own_contains,
    own_subqueries,
    rel_kind,
    set_children,
    source_tables,
    walk,
)
from distfusion.protocol.hashing import hash_type
from distfusion.sources import TableSource, WorkUnit
from distfusion.stages import (
    BROADCAST,
    COALESCE,
    RESULT,
    SHUFFLE,
    OutputPartitioning,
    SourceScan,
    Stage,
    StageGraph,
    StageInput,
)

__all__ = ["MaterializedStage", "plan_stages"]

_J = JoinRel
# Join types whose right side may be broadcast (the left side is probed per task).
_BROADCAST_RIGHT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_LEFT,
    _J.JOIN_TYPE_LEFT_SEMI,
    _J.JOIN_TYPE_LEFT_ANTI,
    _J.JOIN_TYPE_LEFT_SINGLE,
    _J.JOIN_TYPE_LEFT_MARK,
}
_BROADCAST_LEFT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_RIGHT,
    _J.JOIN_TYPE_RIGHT_SEMI,
    _J.JOIN_TYPE_RIGHT_ANTI,
    _J.JOIN_TYPE_RIGHT_SINGLE,
    _J.JOIN_TYPE_RIGHT_MARK,
}
_SEMI_LIKE = {_J.JOIN_TYPE_LEFT_SEMI, _J.JOIN_TYPE_LEFT_ANTI, _J.JOIN_TYPE_LEFT_MARK}
_KEY_FUNCTIONS = {"equal", "is_not_distinct_from"}
# Join types whose output rows sit in the task of their left key values.
_KEEPS_LEFT_KEYS = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_LEFT,
    _J.JOIN_TYPE_LEFT_SEMI,
    _J.JOIN_TYPE_LEFT_ANTI,
}
# Join types whose output depends on a right row only through a left row with
# its key: right rows whose keys the left side lacks may be dropped early. (A
# semi join drops unmatched rows of both sides; an anti join keeps its own.)
_REDUCE_RIGHT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_LEFT,
    _J.JOIN_TYPE_LEFT_SEMI,
    _J.JOIN_TYPE_LEFT_ANTI,
    _J.JOIN_TYPE_RIGHT_SEMI,
}
_REDUCE_LEFT = {
    _J.JOIN_TYPE_INNER,
    _J.JOIN_TYPE_RIGHT,
    _J.JOIN_TYPE_RIGHT_SEMI,
    _J.JOIN_TYPE_RIGHT_ANTI,
    _J.JOIN_TYPE_LEFT_SEMI,
}
# Join types whose output keys are all matched by a right row.
_MATCHED = {_J.JOIN_TYPE_INNER, _J.JOIN_TYPE_LEFT_SEMI}


@dataclass(frozen=True)
class _KeySource:
    """A sealed stage holding every value a fragment's partitioning columns take.

    Attributes:
        input: the stage's output, as the fragment's consumer reads it.
        columns: ``columns[i]`` of that output holds partitioning column i's values.
        est: the stage output's estimate.
    """

    input: StageInput
    columns: tuple[int, ...]
    est: Estimate


@dataclass
class _Fragment:
    """The stage being built: a relation tree and how its tasks are fed."""

    rel: Rel
    tasks: int
    est: Estimate
    inputs: list[StageInput] = field(default_factory=list)
    # Small source tables every task reads in full (a broadcast without a stage).
    replicated: frozenset[str] = frozenset()
    # Output columns the tasks' rows are hash-partitioned by (in hash order):
    # task i holds every row whose hash of these columns is i. None: unknown.
    partitioning: tuple[int, ...] | None = None
    # A stage whose output holds every value of the partitioning columns.
    key_source: _KeySource | None = None
    # Set when the fragment is only the read of a stage that ran already
    # (adaptive execution): that stage, and the read's serialized bytes.
    passthrough: tuple[MaterializedStage, bytes] | None = None

    def with_rel(
        self, rel: Rel, est: Estimate | None = None, partitioning: tuple[int, ...] | None = None
    ) -> _Fragment:
        """``rel`` over this fragment; ``partitioning`` carries it (and its key source)."""
        source = self.key_source if partitioning is not None else None
        return replace(
            self,
            rel=rel,
            est=est or self.est,
            partitioning=partitioning,
            key_source=source,
            passthrough=None,
        )


@dataclass(frozen=True)
class MaterializedStage:
    """A stage that ran (adaptive execution), as the planner sees it when it plans again.

    Attributes:
        stage: the stage as it ran (its id, task count and output stay valid).
        rows: rows of its output, measured.
        bytes: Arrow bytes of its output, measured.
    """

    stage: Stage
    rows: int
    bytes: int


class _Planner:
    def __init__(
        self,
        plan: Plan,
        sources: dict[str, TableSource],
        config: PlannerConfig,
        oracle: SchemaOracle,
        materialized: dict[str, MaterializedStage] | None = None,
        first_stage_id: int = 1,
    ) -> None:
        self.plan = plan
        self.sources = sources
        self.config = config
        self.registry = FunctionRegistry(plan)
        self.oracle = oracle
        self.stages: list[Stage] = []
        # What a stage computes -> its index in ``stages`` (exchange reuse).
        self.computed: dict[tuple, int] = {}
        self.reuses = 0
        self.query_id = str(uuid.uuid4())
        # Stages that ran, by computation digest and by id (adaptive execution).
        self.materialized = materialized or {}
        self.ran = {m.stage.stage_id: m.stage for m in self.materialized.values()}
        # Ids stay unique in the query: above every stage that ran.
        self.next_stage_id = max(first_stage_id, max(self.ran, default=0) + 1)
        self.tables: set[str] = set()

    # ------------------------------------------------------------------ adaptive reuse
    def _computation(self, frag: _Fragment) -> str:
        """Digest of what ``frag`` computes: its relation, tasks, inputs and replicated scans."""
        h = hashlib.sha1(frag.rel.SerializeToString(deterministic=True))
        inputs = [(i.table, i.boundary, i.partitions) for i in frag.inputs]
        h.update(repr((frag.tasks, inputs, sorted(frag.replicated))).encode())
        return h.hexdigest()

    def _include(self, stage: Stage) -> None:
        """Put stage ``stage`` that ran (and the stages it read) into this graph, once."""
        if any(s.stage_id == stage.stage_id for s in self.stages):
            return
        for inp in stage.inputs:
            self._include(self.ran[inp.stage_id])
        self.stages.append(stage)

    def _read_ran(
        self, m: MaterializedStage, kind: str, partitions: int, key_columns: tuple[int, ...]
    ) -> tuple[Rel, StageInput] | None:
        """Read stage ``m`` that ran as a consumer sealed with ``kind`` wants, if it can.

        Its output serves as is when cut the same way; a consumer wanting every
        row (broadcast, coalesce) reads every partition of every task. None
        when the output cannot serve (a shuffle by other keys or counts).
        """
        out = m.stage.output
        if kind == out.kind and (partitions, key_columns) == (out.num_partitions, out.key_columns):
            boundary = COALESCE if kind == RESULT else kind
            n = 1
        elif kind in (BROADCAST, COALESCE):
            boundary, n = BROADCAST, out.num_partitions
        else:
            return None
        self._include(m.stage)
        # One name per way of reading: the same read is the same fragment in
        # every plan of the query, so later stages are recognised too.
        natural = boundary == (COALESCE if out.kind == RESULT else out.kind)
        table = f"__stage_{m.stage.stage_id}" + ("" if natural else f"_{boundary}")
        declared = m.stage.output_schema
        if table not in self.tables:
            self.tables.add(table)
            self.oracle.register_empty(table, declared)
        return stage_read(table, named_struct(declared)), StageInput(
            table, m.stage.stage_id, boundary, declared, n
        )

    def _as_ran(self, frag: _Fragment) -> _Fragment:
        """``frag``, or the read of the stage that ran it already, with its measured size.

        Like Spark AQE's query stages: the rest of the query is planned over
        the stage's actual output (its rows, bytes, task count and hash
        partitioning) instead of the estimate of what it would be.
        """
        m = self.materialized.get(self._computation(frag))
        return frag if m is None else self._passthrough(m, frag.est.kept)

    def _passthrough(self, m: MaterializedStage, kept: float) -> _Fragment:
        """A fragment that only reads stage ``m`` that ran, sized as measured.

        A shuffle output is read partition by partition (one task each, hash
        partitioned by its keys); any other output by one task reading it all.
        """
        out = m.stage.output
        est = Estimate(m.rows, m.bytes, kept)
        num_columns = out.num_columns if out.num_columns is not None else len(m.stage.output_schema)
        if out.kind == SHUFFLE and out.num_partitions > 1:
            read, inp = self._read_ran(m, SHUFFLE, out.num_partitions, out.key_columns)
            keys = out.key_columns
            part = keys if keys and all(k < num_columns for k in keys) else None
            tasks = out.num_partitions
        else:
            read, inp = self._read_ran(m, BROADCAST, 1, ())
            part, tasks = None, 1
        return _Fragment(
            read,
            tasks,
            est,
            [inp],
            partitioning=part,
            passthrough=(m, read.SerializeToString(deterministic=True)),
        )

    # ------------------------------------------------------------------ sealing
    def seal(
        self,
        frag: _Fragment,
        kind: str,
        partitions: int = 1,
        keys: list[Expression] | None = None,
        readers: int = 1,
    ) -> tuple[Rel, StageInput]:
        """Close ``frag`` as a stage; return the consumer's ``ReadRel`` and input.

        A stage that ran already (adaptive execution) is read again when its
        output can serve (:meth:`_read_ran`) rather than planned once more.
        """
        rel = frag.rel
        key_columns: list[int] = []
        base_schema = self.oracle.schema(rel)
        num_columns = len(base_schema)
        appended: list[Expression] = []
        for k in keys or []:
            idx = is_field_ref(k)
            if idx is not None:
                key_columns.append(idx)
            else:
                key_columns.append(num_columns + len(appended))
                appended.append(k)
        computation = self._computation(frag) if self.materialized else ""
        if self.materialized:
            m = self.materialized.get(computation)
            if m is not None:  # this very computation ran
                found = self._read_ran(m, kind, partitions, tuple(key_columns))
                if found is not None:
                    return found
                # Cut differently than it ran: partition its measured output
                # again rather than compute it once more (keys refer to the
                # same columns: the output keeps the fragment's columns).
                again = self._passthrough(m, frag.est.kept)
                return self.seal(again, kind, partitions, keys, readers)
            if frag.passthrough is not None:  # only reads a stage that ran
                ran, read_bytes = frag.passthrough
                if rel.SerializeToString(deterministic=True) == read_bytes:
                    found = self._read_ran(ran, kind, partitions, tuple(key_columns))
                    if found is not None:
                        return found
        if appended:
            proj = Rel()
            proj.project.input.CopyFrom(rel)
            proj.project.expressions.extend(appended)
            rel = proj
        full_schema = self.oracle.schema(rel) if appended else base_schema
        renamed = pa.schema([pa.field(f"c{i}", f.type, True) for i, f in enumerate(full_schema)])
        fragment = self.oracle.plan_bytes(rel, list(named_struct(renamed).names))
        declared = pa.schema(list(renamed)[:num_columns])
        inputs = tuple((i.table, i.boundary, i.partitions) for i in frag.inputs)
        what = (fragment, kind, partitions, tuple(key_columns), frag.tasks, inputs, frag.replicated)
        if what in self.computed:
            # The same fragment over the same inputs, cut the same way: read the
            # stage planned already once more (Spark's ReuseExchange), under a
            # table name of its own (one consumer may read it both ways).
            producer = self.stages[self.computed[what]]
            output = replace(producer.output, readers=producer.output.readers + readers)
            self.stages[self.computed[what]] = replace(producer, output=output)
            stage_id = producer.stage_id
            self.reuses += 1
            table = f"__stage_{stage_id}_{self.reuses}"
        else:
            try:
                plan_text = self.oracle.logical_plan(fragment).display_indent()
            except Exception as exc:  # DataFusion raises bare Exception
                msg = f"DataFusion cannot consume a plan fragment: {exc}"
                raise PlanningError(msg) from exc
            stage_id = self.next_stage_id
            self.next_stage_id += 1
            self.computed[what] = len(self.stages)
            self.stages.append(
                Stage(
                    stage_id=stage_id,
                    num_tasks=frag.tasks,
                    fragment=fragment,
                    inputs=tuple(frag.inputs),
                    scans=self._scans(rel, frag.tasks, frag.replicated),
                    output=OutputPartitioning(
                        kind=kind,
                        num_partitions=partitions,
                        key_columns=tuple(key_columns),
                        num_columns=num_columns,
                        readers=readers,
                    ),
                    plan_text=plan_text,
                    output_schema=declared,
                    estimated_rows=frag.est.rows,
                    estimated_bytes=frag.est.bytes,
                    estimated_max_bytes=frag.est.bytes / max(frag.est.kept, 1e-6),
                    computation=computation or self._computation(frag),
                )
            )
            table = f"__stage_{stage_id}"
        self.tables.add(table)
        self.oracle.register_empty(table, declared)
        boundary = COALESCE if kind == RESULT else kind
        return stage_read(table, named_struct(declared)), StageInput(
            table, stage_id, boundary, declared
        )

    def _scans(self, rel: Rel, tasks: int, replicated: frozenset[str]) -> tuple[SourceScan, ...]:
        scans = []
        for n in source_tables(rel, self.sources):
            units = self.sources[n].units
            if n in replicated:
                scans.append(SourceScan(self.sources[n], (units,) * tasks, replicated=True))
            else:
                scans.append(SourceScan(self.sources[n], _split_units(units, tasks)))
        return tuple(scans)

    def _replicable(self, build: _Fragment, probe: _Fragment) -> frozenset[str] | None:
        """The source tables of ``build`` if every probe task can read them in full.

        That is a broadcast without a stage: ``build`` must be one task over
        source tables only, all of them at most ``replicate_scan_bytes`` in total
        (re-reading costs a scan per task), none also read split by the probe.
        """
        if build.tasks != 1 or build.inputs:
            return None
        names = frozenset(source_tables(build.rel, self.sources))
        total = sum(self.sources[n].size_bytes for n in names)
        if not names or total > self.config.replicate_scan_bytes:
            return None
        split = set(source_tables(probe.rel, self.sources)) - probe.replicated
        return None if names & split else names

    def gather(self, frag: _Fragment) -> _Fragment:
        """``frag`` as a single-task fragment: coalesced if it has several tasks."""
        if frag.tasks == 1:
            return frag
        read, inp = self.seal(frag, COALESCE)
        return _Fragment(read, 1, frag.est, [inp])

    def shuffle_tasks(self, est: Estimate) -> int:
        n = self.config.estimator.shuffle_tasks(int(est.bytes), self.config.workers)
        return max(1, min(n, self.config.task_cap))

    def exchange(
        self, frag: _Fragment, n: int, keys: list[Expression] | None
    ) -> tuple[Rel, StageInput]:
        """Seal ``frag`` for a consumer of ``n`` tasks: shuffle, or coalesce when n == 1."""
        if n == 1:
            return self.seal(frag, COALESCE)
        return self.seal(frag, SHUFFLE, partitions=n, keys=keys or [])

    # ------------------------------------------------------------------ semi-join reduction
    def _key_source(
        self, frag: _Fragment, inp: StageInput, keys: list[Expression]
    ) -> _KeySource | None:
        """``frag``, sealed as ``inp`` hashing ``keys``, as a source of its key values."""
        columns = [is_field_ref(k) for k in keys]
        if any(c is None for c in columns):  # computed keys are not kept in the output
            return None
        return _KeySource(inp, tuple(columns), frag.est)

    def _key_types(self, rel: Rel, keys: list[Expression]) -> list[pa.DataType]:
        """The Arrow types of ``keys`` evaluated over ``rel``'s output."""
        probe = Rel()
        probe.project.input.CopyFrom(rel)
        probe.project.expressions.extend(keys)
        return self.oracle.schema(probe).types[-len(keys) :]

    def _reduction_pays(
        self, target: _Fragment, keys: list[Expression], types: list[pa.DataType], est: Estimate
    ) -> bool:
        """Whether to filter ``target`` by the keys (of ``types``) of a side estimated ``est``.

        The side must be selective (``kept`` at most :data:`REDUCTION_KEPT`),
        likely at most ``runtime_filter_bytes``, and ``target`` at least
        :data:`REDUCTION_RATIO` times larger; the keys must hash alike.
        """
        limit = self.config.runtime_filter_bytes
        if not limit or est.kept > REDUCTION_KEPT or est.low_bytes > limit:
            return False
        if target.est.bytes < REDUCTION_RATIO * est.low_bytes:
            return False
        mine = self._key_types(target.rel, keys)
        return all(hash_type(a) == hash_type(b) for a, b in zip(mine, types, strict=True))

    def _reduce(
        self, frag: _Fragment, keys: list[Expression], source: _KeySource | None
    ) -> _Fragment:
        """``frag`` without the rows whose ``keys`` are not in ``source`` (when that pays).

        A semi-join reduction (Bernstein and Chiu, 1981; Spark's
        ``InjectRuntimeFilter`` does it with a Bloom filter): a left semi join
        on ``keys`` against the source stage's output, which every task of
        ``frag`` reads as a broadcast. It drops only rows that match nothing
        in the join above, whose type the caller checked
        (:data:`_REDUCE_RIGHT`, :data:`_REDUCE_LEFT`).
        """
        if source is None:
            return frag
        schema = source.input.schema
        types = [schema.field(c).type for c in source.columns]
        if not self._reduction_pays(frag, keys, types, source.est):
            return frag
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

    def _creation_side(self, join_type: int, left: _Fragment, right: _Fragment) -> str | None:
        """The side of a shuffle join that may filter the other side by its keys."""
        options = []
        if join_type in _REDUCE_RIGHT and left.est.kept <= REDUCTION_KEPT:
            options.append((left.est.low_bytes, "left"))
        if join_type in _REDUCE_LEFT and right.est.kept <= REDUCTION_KEPT:
            options.append((right.est.low_bytes, "right"))
        return min(options)[1] if options and self.config.runtime_filter_bytes else None

    # ------------------------------------------------------------------ visiting
    def visit(self, rel: Rel) -> _Fragment:
        frag = self._visit(rel)
        return self._as_ran(frag) if self.materialized else frag

    def _visit(self, rel: Rel) -> _Fragment:
        method = getattr(self, f"visit_{rel_kind(rel)}", None)
        if method is None:
            return self.visit_single(rel)
        if _own_expressions_have_subquery(rel) and not _pipelines_subqueries(rel):
            return self.visit_single(rel)
        return method(rel)

    def _plan_subqueries(self, rel: Rel, consumer: _Fragment) -> tuple[Rel, list[StageInput]]:
        """``rel`` (a filter or project over ``consumer``) with its scalar subqueries planned.

        Each uncorrelated scalar subquery is planned like any query and
        gathered into one task; a one-task consumer runs it inline, a consumer
        of several tasks reads its one row as a broadcast stage. Returns the
        new relation and the stage inputs its fragment gains.
        """
        new = Rel()
        new.CopyFrom(rel)
        inputs: list[StageInput] = []
        for sub in own_subqueries(new):
            frag = self.gather(self.visit(sub.scalar.input))
            if consumer.tasks == 1:  # its source reads become the consumer's
                sub.scalar.input.CopyFrom(frag.rel)
                inputs.extend(frag.inputs)
                continue
            read, inp = self.seal(frag, BROADCAST, readers=consumer.tasks)
            sub.scalar.input.CopyFrom(read)
            inputs.append(inp)
        return new, inputs

    def visit_single(self, rel: Rel, visited: list[_Fragment] | None = None) -> _Fragment:
        """Run ``rel`` in one task after coalescing every input.

        ``visited`` are the children's fragments when the caller already visited them.
        """
        if visited is None:
            visited = [self.visit(c) for c in children(rel)]
        frags = [self.gather(f) for f in visited]
        est = sum((f.est for f in frags), Estimate(1, 64))
        inputs = [i for f in frags for i in f.inputs]
        new = Rel()
        new.CopyFrom(set_children(rel, [f.rel for f in frags]) if frags else rel)
        unproject_source_reads(new, set(self.sources))  # reads inside subqueries
        replicated = frozenset().union(*(f.replicated for f in frags))
        return _Fragment(new, 1, est, inputs, replicated)

    def visit_read(self, rel: Rel) -> _Fragment:
        read = rel.read
        if read.WhichOneof("read_type") != "named_table":
            return _Fragment(rel, 1, Estimate(1, 64))
        name = read.named_table.names[-1]
        source = self.sources.get(name)
        if source is None:
            msg = (
                f"table {name!r} is not registered with distfusion (register_parquet/register_csv)"
            )
            raise PlanningError(msg)
        cols = None
        if read.HasField("projection"):
            all_names = list(source.schema.names)
            cols = [all_names[i.field] for i in read.projection.select.struct_items]
        scan_bytes = source.projected_bytes(cols)
        rows = source.num_rows if source.num_rows is not None else scan_bytes / 100
        tasks = self.config.estimator.leaf_tasks(scan_bytes, len(source.units), self.config.workers)
        tasks = max(1, min(tasks, self.config.task_cap, len(source.units)))
        return _Fragment(unproject_read(rel), tasks, Estimate(rows, scan_bytes))

    def _pipeline(self, rel: Rel, factor: float = 1.0) -> _Fragment:
        (child,) = children(rel)
        frag = self.visit(child)
        if _own_expressions_have_subquery(rel):
            rel, inputs = self._plan_subqueries(rel, frag)
            frag = replace(frag, inputs=frag.inputs + inputs)
        part = frag.partitioning
        if part is not None:
            part = self._carry(rel, part)
        return frag.with_rel(set_children(rel, [frag.rel]), frag.est.scale(factor), part)

    def _carry(self, rel: Rel, part: tuple[int, ...]) -> tuple[int, ...] | None:
        """Where the input columns ``part`` of filter or project ``rel`` appear in its output."""
        candidates = [[p] for p in part]
        if rel_kind(rel) == "project":
            width = len(self.oracle.schema(rel.project.input))
            for i, e in enumerate(rel.project.expressions):
                ref = is_field_ref(e)
                if ref in part:
                    candidates[part.index(ref)].append(width + i)
        return _through_emit(rel, candidates)

    def visit_filter(self, rel: Rel) -> _Fragment:
        names = conjunct_names(rel.filter.condition, self.registry)
        return self._pipeline(rel, filter_selectivity(names))

    def visit_project(self, rel: Rel) -> _Fragment:
        # Only this projection's own expressions: a projection above a window
        # pipelines on the window's partitioning, it does not shuffle again.
        windows = [
            m
            for expr in rel.project.expressions
            for m in walk(expr)
            if isinstance(m, Expression.WindowFunction)
        ]
        if not windows:
            return self._pipeline(rel)
        frag = self.visit(rel.project.input)
        if frag.tasks == 1:
            return frag.with_rel(set_children(rel, [frag.rel]))
        keys = [list(w.partitions) for w in windows]
        if not keys[0] or any(k != keys[0] for k in keys):
            frag = self.gather(frag)
            return frag.with_rel(set_children(rel, [frag.rel]))
        n = self.shuffle_tasks(frag.est)
        read, inp = self.exchange(frag, n, keys[0])
        return _Fragment(set_children(rel, [read]), n, frag.est, [inp])

    def visit_fetch(self, rel: Rel) -> _Fragment:
        fetch = rel.fetch
        inner = fetch.input
        under_sort = rel_kind(inner) == "sort"
        frag = self.visit(inner.sort.input if under_sort else inner)
        limit = _fetch_limit(fetch)
        if frag.tasks == 1:
            below = set_children(inner, [frag.rel]) if under_sort else frag.rel
            return frag.with_rel(set_children(rel, [below]), _limit_est(frag.est, limit))
        # Per task: (sort and) keep the first offset + count rows.
        local_input = set_children(inner, [frag.rel]) if under_sort else frag.rel
        if limit is not None:
            local = Rel()
            local.fetch.input.CopyFrom(local_input)
            local.fetch.count_expr.literal.i64 = limit
        else:
            local = local_input
        gathered = self.gather(frag.with_rel(local, _limit_est(frag.est, limit)))
        below = set_children(inner, [gathered.rel]) if under_sort else gathered.rel
        return gathered.with_rel(set_children(rel, [below]))

    def visit_sort(self, rel: Rel) -> _Fragment:
        frag = self.visit(rel.sort.input)
        if frag.tasks == 1:
            return frag.with_rel(set_children(rel, [frag.rel]))
        gathered = self.gather(frag.with_rel(set_children(rel, [frag.rel])))
        return gathered.with_rel(set_children(rel, [gathered.rel]))

    def visit_aggregate(self, rel: Rel) -> _Fragment:
        agg = rel.aggregate
        frag = self.visit(agg.input)
        g = dagg.grouping_count(agg)
        est = frag.est if g else Estimate(1, 64)
        if frag.tasks == 1:
            return frag.with_rel(set_children(rel, [frag.rel]), est)
        if g and len(agg.groupings) == 1 and frag.partitioning is not None:
            # Every group's rows are in one task already: aggregate in place.
            keys = [is_field_ref(e) for e in agg.grouping_expressions]
            if all(p in keys for p in frag.partitioning):
                part = _through_emit(rel, [[keys.index(p)] for p in frag.partitioning])
                return frag.with_rel(set_children(rel, [frag.rel]), est, part)
        if dagg.is_decomposable(agg, self.registry):
            split = dagg.split_aggregate(rel, self.registry)
            partial = frag.with_rel(set_children(split.partial, [frag.rel]), est)
            n = self.shuffle_tasks(est) if g else 1
            keys = [field_ref(i) for i in range(g)]
            read, inp = self.exchange(partial, n, keys)
            plain = Rel()
            plain.CopyFrom(rel)
            plain.aggregate.ClearField("common")
            out_schema = named_struct(self.oracle.schema(set_children(plain, [frag.rel])))
            final = dagg.final_aggregate(split, read, out_schema, agg, self.registry)
            # The final aggregate's first g columns are the keys the shuffle hashed.
            part = _keys_first(final, g) if n > 1 and g else None
            source = self._key_source(partial, inp, keys) if part else None
            return _Fragment(final, n, est, [inp], partitioning=part, key_source=source)
        if g and len(agg.groupings) <= 1:
            keys = list(agg.grouping_expressions)
            n = self.shuffle_tasks(frag.est)
            read, inp = self.exchange(frag, n, keys)
            # The shuffle hashed the key values: output columns 0..k-1.
            part = None
            if n > 1 and len(agg.groupings) == 1:
                part = _through_emit(rel, [[i] for i in range(len(keys))])
            source = self._key_source(frag, inp, keys) if part else None
            return _Fragment(
                set_children(rel, [read]), n, est, [inp], partitioning=part, key_source=source
            )
        gathered = self.gather(frag)
        return gathered.with_rel(set_children(rel, [gathered.rel]), est)

    def visit_join(self, rel: Rel) -> _Fragment:
        join = rel.join
        left, right = self.visit(join.left), self.visit(join.right)
        left_arity = len(self.oracle.schema(join.left))
        keys = (
            _equi_keys(join.expression, left_arity, self.registry)
            if join.HasField("expression")
            else []
        )
        # A semi-join reduction compares keys with ``=``: NULL keys never match,
        # which a null-safe key (IS NOT DISTINCT FROM) would contradict.
        null_safe = join.HasField("expression") and any(
            c.WhichOneof("rex_type") == "scalar_function"
            and self.registry.name(c.scalar_function.function_reference) == "is_not_distinct_from"
            for c in conjuncts(join.expression, self.registry)
        )
        return self._join(rel, join.type, left, right, keys, reducible=not null_safe)

    def visit_cross(self, rel: Rel) -> _Fragment:
        left, right = self.visit(rel.cross.left), self.visit(rel.cross.right)
        return self._join(rel, _J.JOIN_TYPE_INNER, left, right, [])

    def _co_partition(
        self, rel: Rel, left: _Fragment, right: _Fragment, keys: list[tuple[Expression, Expression]]
    ) -> tuple[str, list[tuple[Expression, Expression]]] | None:
        """A side already hash-partitioned by join keys, and the key pairs in its hash order.

        Returns ``(side, pairs)``: ``side`` ("left" or "right") keeps its tasks;
        shuffling the other side by its keys of ``pairs`` into as many
        partitions brings equal keys into one task (Spark's EnsureRequirements
        does the same). The partitioned side's keys must be its partitioning
        columns; the other side's may be any expressions whose hashed Arrow
        types match (the hash depends on the type).
        """
        inputs = (rel.join.left, rel.join.right)
        for side, frag, mine, theirs in (("left", left, 0, 1), ("right", right, 1, 0)):
            if frag.partitioning is None or frag.tasks < 2:
                continue
            refs = [is_field_ref(k[mine]) for k in keys]
            if not all(p in refs for p in frag.partitioning):
                continue
            pairs = [keys[refs.index(p)] for p in frag.partitioning]
            kept = self.oracle.schema(inputs[mine])
            moved = self._key_types(inputs[theirs], [k[theirs] for k in pairs])
            if all(
                hash_type(kept.field(p).type) == hash_type(t)
                for p, t in zip(frag.partitioning, moved, strict=True)
            ):
                return side, pairs
        return None

    def _join_partitioning(
        self, rel: Rel, join_type: int, pairs: list[tuple[Expression, Expression]]
    ) -> tuple[int, ...] | None:
        """Output columns of a join run co-located on ``pairs`` (in hash order)."""
        if join_type not in _KEEPS_LEFT_KEYS:
            return None
        left_arity = len(self.oracle.schema(rel.join.left))
        candidates = []
        for lk, rk in pairs:
            cands = [] if is_field_ref(lk) is None else [is_field_ref(lk)]
            if join_type == _J.JOIN_TYPE_INNER and is_field_ref(rk) is not None:
                cands.append(left_arity + is_field_ref(rk))
            if not cands:
                return None
            candidates.append(cands)
        return _through_emit(rel, candidates)

    def _join(
        self,
        rel: Rel,
        join_type: int,
        left: _Fragment,
        right: _Fragment,
        keys: list[tuple[Expression, Expression]],
        reducible: bool = True,
    ) -> _Fragment:
        if join_type in _SEMI_LIKE:
            est = left.est
        elif keys and join_type == _J.JOIN_TYPE_INNER:
            est = left.est.equi_join(right.est)
        elif keys:
            est = Estimate(max(left.est.rows, right.est.rows), left.est.bytes + right.est.bytes)
        else:
            est = Estimate(left.est.rows * right.est.rows, left.est.bytes * max(right.est.rows, 1))
        if left.tasks == 1 and right.tasks == 1:
            new = set_children(rel, [left.rel, right.rel])
            return _Fragment(
                new, 1, est, left.inputs + right.inputs, left.replicated | right.replicated
            )
        co = self._co_partition(rel, left, right, keys) if keys else None
        pays = self.config.broadcast_pays
        candidates = []
        if join_type in _BROADCAST_RIGHT and pays(right.est.bytes, left.est.bytes, left.tasks):
            candidates.append((right.est.bytes, "right"))
        if join_type in _BROADCAST_LEFT and pays(left.est.bytes, right.est.bytes, right.tasks):
            candidates.append((left.est.bytes, "left"))
        if not keys and not candidates:
            # No keys to shuffle by: broadcast whatever side the join type allows.
            if join_type in _BROADCAST_RIGHT:
                candidates.append((right.est.bytes, "right"))
            elif join_type in _BROADCAST_LEFT:
                candidates.append((left.est.bytes, "left"))
        if co is not None:
            # Broadcast only if copying the build side to every other probe task
            # moves fewer bytes than shuffling the side that is not partitioned.
            moved = (right if co[0] == "left" else left).est.bytes
            candidates = [
                (b, side)
                for b, side in candidates
                if b * ((left if side == "right" else right).tasks - 1) < moved
            ]
        if candidates:
            side = min(candidates)[1]
            build, probe = (right, left) if side == "right" else (left, right)
            replicated = self._replicable(build, probe)
            if replicated is not None:
                new_children = [probe.rel, build.rel] if side == "right" else [build.rel, probe.rel]
                return _Fragment(
                    set_children(rel, new_children),
                    probe.tasks,
                    est,
                    probe.inputs,
                    probe.replicated | replicated,
                )
            kind = BROADCAST if probe.tasks > 1 else COALESCE
            if kind == COALESCE and keys and reducible:
                reduced = self._one_task_reduction(rel, join_type, side, probe, build, keys, est)
                if reduced is not None:
                    return reduced
            read, inp = self.seal(build, kind, readers=probe.tasks if kind == BROADCAST else 1)
            part = probe.partitioning
            if part is not None and side == "left":  # the probe's columns follow the build's
                arity = len(self.oracle.schema(children(rel)[0]))  # a join or a cross
                part = tuple(arity + p for p in part) if join_type == _J.JOIN_TYPE_INNER else None
            part = None if part is None else _through_emit(rel, [[p] for p in part])
            probe_side = "left" if side == "right" else "right"
            return _in_tasks_of(rel, probe, probe_side, read, inp, est, part, probe.key_source)
        if co is not None:
            side, pairs = co
            kept, moved = (left, right) if side == "left" else (right, left)
            moved_keys = [k[1] if side == "left" else k[0] for k in pairs]
            if reducible and join_type in (_REDUCE_RIGHT if side == "left" else _REDUCE_LEFT):
                moved = self._reduce(moved, moved_keys, kept.key_source)
            read, inp = self.seal(moved, SHUFFLE, partitions=kept.tasks, keys=moved_keys)
            part = self._join_partitioning(rel, join_type, pairs)
            # The output's keys are the kept side's key values when they are its own
            # (left) or every output row matched it.
            source = kept.key_source if side == "left" or join_type in _MATCHED else None
            return _in_tasks_of(rel, kept, side, read, inp, est, part, source)
        if keys:
            n = self.shuffle_tasks(left.est + right.est)
            lkeys, rkeys = [k[0] for k in keys], [k[1] for k in keys]
            # The creation side of a semi-join reduction is sealed first.
            creator = self._creation_side(join_type, left, right) if reducible else None
            if creator == "right":
                rread, rinp = self.exchange(right, n, rkeys)
                left = self._reduce(left, lkeys, self._key_source(right, rinp, rkeys))
                lread, linp = self.exchange(left, n, lkeys)
            else:
                lread, linp = self.exchange(left, n, lkeys)
                if creator == "left":
                    right = self._reduce(right, rkeys, self._key_source(left, linp, lkeys))
                rread, rinp = self.exchange(right, n, rkeys)
            part = self._join_partitioning(rel, join_type, keys) if n > 1 else None
            source = self._key_source(left, linp, lkeys) if part else None
            return _Fragment(
                set_children(rel, [lread, rread]),
                n,
                est,
                [linp, rinp],
                partitioning=part,
                key_source=source,
            )
        left, right = self.gather(left), self.gather(right)
        new = set_children(rel, [left.rel, right.rel])
        return _Fragment(new, 1, est, left.inputs + right.inputs)

    def _one_task_reduction(
        self,
        rel: Rel,
        join_type: int,
        side: str,
        probe: _Fragment,
        build: _Fragment,
        keys: list[tuple[Expression, Expression]],
        est: Estimate,
    ) -> _Fragment | None:
        """A join of one-task ``probe`` and a large ``build`` reduced by ``probe``'s keys.

        ``probe`` becomes a stage of its own: ``build``'s tasks read it as a
        broadcast and keep only matching rows before they are gathered into the
        join's one task, which reads ``probe``'s output as well. None when the
        reduction does not pay or the join type does not allow it.
        """
        if join_type not in (_REDUCE_RIGHT if side == "right" else _REDUCE_LEFT):
            return None
        mine, theirs = (0, 1) if side == "right" else (1, 0)
        probe_keys = [k[mine] for k in keys]
        build_keys = [k[theirs] for k in keys]
        if any(is_field_ref(k) is None for k in probe_keys):
            return None
        types = self._key_types(probe.rel, probe_keys)
        if not self._reduction_pays(build, build_keys, types, probe.est):
            return None
        pread, pinp = self.seal(probe, COALESCE)
        reduced = self._reduce(build, build_keys, self._key_source(probe, pinp, probe_keys))
        bread, binp = self.seal(reduced, COALESCE)
        if side == "right":
            return _Fragment(set_children(rel, [pread, bread]), 1, est, [pinp, binp])
        return _Fragment(set_children(rel, [bread, pread]), 1, est, [binp, pinp])

    def visit_set(self, rel: Rel) -> _Fragment:
        frags = [self.visit(c) for c in children(rel)]
        est = sum((f.est for f in frags), Estimate(0, 0))
        if rel.set.op != SetRel.SET_OP_UNION_ALL or all(f.tasks == 1 for f in frags):
            return self.visit_single(rel, frags)
        n = max(1, min(self.config.task_cap, max(f.tasks for f in frags)))
        reads, inputs = [], []
        for f in frags:
            read, inp = self.exchange(f, n, None)
            reads.append(read)
            inputs.append(inp)
        return _Fragment(set_children(rel, reads), n, est, inputs)

    # ------------------------------------------------------------------ entry
    def run(self) -> StageGraph:
        if len(self.plan.relations) != 1 or not self.plan.relations[0].HasField("root"):
            msg = "expected a Substrait plan with exactly one root relation"
            raise PlanningError(msg)
        root = self.plan.relations[0].root
        frag = self.gather(self.visit(root.input))
        # Columns are named c0.. like every stage's: the query's own names may
        # repeat (SELECT * over a join); the caller restores them.
        self.seal(frag, RESULT)
        return StageGraph(self.query_id, tuple(self.stages))


def _own_expressions_have_subquery(rel: Rel) -> bool:
    """True if ``rel``'s own expressions (not its inputs) contain a subquery."""
    return own_contains(rel, is_subquery)


def _pipelines_subqueries(rel: Rel) -> bool:
    """Whether ``rel``'s subqueries can be planned on their own.

    ``rel`` must be a filter or a projection without windows, and its
    subqueries uncorrelated scalar subqueries.
    """
    if rel_kind(rel) not in ("filter", "project"):
        return False
    if rel_kind(rel) == "project" and own_contains(
        rel, lambda m: isinstance(m, Expression.WindowFunction)
    ):
        return False
    subs = own_subqueries(rel)
    return all(
        s.WhichOneof("subquery_type") == "scalar"
        and not contains(
            s, lambda m: isinstance(m, Expression.FieldReference) and m.HasField("outer_reference")
        )
        for s in subs
    )


def _fetch_limit(fetch) -> int | None:
    """Offset + count of a FetchRel, or None when it has no count."""
    offset = fetch.offset_expr.literal.i64 if fetch.HasField("offset_expr") else 0
    if not fetch.HasField("count_expr") or fetch.count_expr.WhichOneof("rex_type") != "literal":
        return None
    count = fetch.count_expr.literal.i64
    return offset + count if count >= 0 else None


def _in_tasks_of(
    rel: Rel,
    kept: _Fragment,
    kept_side: str,
    read: Rel,
    inp: StageInput,
    est: Estimate,
    partitioning: tuple[int, ...] | None,
    key_source: _KeySource | None,
) -> _Fragment:
    """Join ``rel`` in ``kept``'s tasks (its ``kept_side`` input), the other side via ``inp``."""
    new_children = [kept.rel, read] if kept_side == "left" else [read, kept.rel]
    return _Fragment(
        set_children(rel, new_children),
        kept.tasks,
        est,
        kept.inputs + [inp],
        kept.replicated,
        partitioning,
        key_source if partitioning is not None else None,
    )


def _through_emit(rel: Rel, candidates: list[list[int]]) -> tuple[int, ...] | None:
    """Output columns of ``rel`` for partitioning columns before its emit.

    ``candidates[i]``: the columns of ``rel``'s direct output (before its
    ``common.emit``) holding partitioning column i. None when the emit drops one.
    """
    common = getattr(rel, rel_kind(rel)).common
    if not common.HasField("emit"):
        return tuple(c[0] for c in candidates)
    mapping = list(common.emit.output_mapping)
    out = []
    for cands in candidates:
        found = [o for o, m in enumerate(mapping) if m in cands]
        if not found:
            return None
        out.append(found[0])
    return tuple(out)


def _keys_first(final: Rel, g: int) -> tuple[int, ...]:
    """Output columns of :func:`decompose_aggregate.final_aggregate`'s ``g`` keys."""
    candidates = [[i] for i in range(g)]
    if rel_kind(final.project.input) == "project":  # the original aggregate's emit on top
        return _through_emit(final, candidates)
    return tuple(range(g))


def _limit_est(est: Estimate, limit: int | None) -> Estimate:
    if limit is None or est.rows <= limit:
        return est
    return Estimate(limit, est.bytes * limit / max(est.rows, 1))


def _equi_keys(
    condition: Expression, left_arity: int, registry: FunctionRegistry
) -> list[tuple[Expression, Expression]]:
    """Pairs (left key, right key) of ``left = right`` conjuncts of a join condition.

    The right key is rebased onto the right input's columns.
    """
    keys = []
    for c in conjuncts(condition, registry):
        if c.WhichOneof("rex_type") != "scalar_function":
            continue
        fn = c.scalar_function
        if registry.name(fn.function_reference) not in _KEY_FUNCTIONS or len(fn.arguments) != 2:
            continue
        a, b = fn.arguments[0].value, fn.arguments[1].value
        if contains(a, is_subquery) or contains(b, is_subquery):
            continue
        ra, rb = field_refs(a), field_refs(b)
        if not ra or not rb:
            continue
        if max(ra) < left_arity <= min(rb):
            keys.append((a, shift_field_refs(b, -left_arity)))
        elif max(rb) < left_arity <= min(ra):
            keys.append((b, shift_field_refs(a, -left_arity)))
    return keys


def _split_units(units: tuple[WorkUnit, ...], tasks: int) -> tuple[tuple[WorkUnit, ...], ...]:
    """Assign units to ``tasks`` bins, largest first into the lightest bin."""
    bins: list[list[WorkUnit]] = [[] for _ in range(tasks)]
    loads = [0] * tasks
    order = sorted(range(len(units)), key=lambda i: (-units[i].size_bytes, i))
    for i in order:
        b = loads.index(min(loads))
        bins[b].append(units[i])
        loads[b] += units[i].size_bytes
    return tuple(tuple(b) for b in bins)


def plan_stages(
    plan: Plan,
    sources: dict[str, TableSource],
    config: PlannerConfig,
    materialized: dict[str, MaterializedStage] | None = None,
    query_id: str | None = None,
    first_stage_id: int = 1,
) -> StageGraph:
    """Cut a Substrait plan into a :class:`StageGraph`.

    The plan is first rewritten in place by the join rules of
    :mod:`~distfusion.planner.push_semi_joins`,
    :mod:`~distfusion.planner.push_dimension_joins` and
    :mod:`~distfusion.planner.reduce_aggregate_inputs` (the last two only when
    ``config.runtime_filter_bytes`` is not 0).

    Args:
        plan: the Substrait plan DataFusion produced for the optimized logical plan.
        sources: every registered table, by name.
        config: worker count, task estimator and broadcast threshold.
        materialized: stages of this query that ran already, by
            :attr:`Stage.computation` (adaptive execution). A subtree one of
            them computes is read from it, planned over its measured size;
            new stages get ids above theirs.
        query_id: the graph's query id (default: a new UUID).
        first_stage_id: the lowest id a new stage may get (adaptive execution:
            above every stage of the query that ran).

    Returns:
        The stages, producers first, the head stage (1 task) last.

    Raises:
        PlanningError: the plan reads an unregistered table, or a fragment cannot
            be expressed (DataFusion's message is kept).
    """
    if config.workers < 1:
        msg = "no workers: the worker resolver returned an empty list"
        raise PlanningError(msg)
    oracle = SchemaOracle(plan, {n: s.schema for n, s in sources.items()})
    push_semi_joins(plan, oracle)
    push_dimension_joins(plan, oracle, sources, config.runtime_filter_bytes)
    reduce_aggregate_inputs(plan, oracle, sources, config.runtime_filter_bytes)
    planner = _Planner(plan, sources, config, oracle, materialized, first_stage_id)
    if query_id is not None:
        planner.query_id = query_id
    return planner.run()
