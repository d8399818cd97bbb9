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
read (source)       leaf stage; work units split across the tasks (a
                    work unit feed: one feed partition per task)
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

This module is the walk and :meth:`~_Planner.seal` (stage cutting), the last
pass of :func:`~distfusion.planner.plan.plan_stages` (the planner's entry,
which lists every pass in order). The walk mixes in the rest, one
module each: :mod:`~distfusion.planner.distribute_joins` (the join rows of the
table), :mod:`~distfusion.planner.inject_runtime_filters` (semi-join
reduction), :mod:`~distfusion.planner.reuse_exchanges` (reading a stage
planned or run already again) and :mod:`~distfusion.planner.plan_subqueries`
(scalar subqueries as queries of their own; any other relation whose
expressions hold a subquery runs in one task). What it builds is in
:mod:`~distfusion.planner.fragment`; docs/architecture.md has the map.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pyarrow as pa
from substrait.proto import Expression, Plan, Rel, SetRel

from distfusion.errors import NotDistributableError, PlanningError
from distfusion.io.sources import TableSource, WorkUnit
from distfusion.planner import decompose_aggregate as dagg
from distfusion.planner.config import PlannerConfig
from distfusion.planner.distribute_joins import JoinDistribution
from distfusion.planner.estimate import Estimate, EstimatesFeedTasks, filter_selectivity
from distfusion.planner.fragment import Fragment, MaterializedStage, canonical_reads, through_emit
from distfusion.planner.plan_subqueries import (
    SubqueryPlanning,
    pipelines_subqueries,
)
from distfusion.planner.prune_partitions import prune_partitions
from distfusion.planner.reuse_exchanges import ExchangeReuse
from distfusion.planner.scan_filters import any_of, filter_over_read, scan_filters
from distfusion.planner.skip_units import skip_units
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
from distfusion.substrait_plan.build import (
    FunctionRegistry,
    conjunct_names,
    field_ref,
    is_field_ref,
    named_struct,
    stage_read,
    unproject_read,
    unproject_source_reads,
)
from distfusion.substrait_plan.rewrite import SchemaOracle
from distfusion.substrait_plan.walk import (
    children,
    field_refs,
    find,
    own_has_subquery,
    read_rels,
    rel_kind,
    set_children,
    source_tables,
)
from distfusion.work_unit_feed import filters

__all__ = ["inject_network_boundaries"]


class _Planner(SubqueryPlanning, JoinDistribution, ExchangeReuse):
    """One planning of one query: the walk, and the stages it seals so far."""

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
        self.sources = dict(sources)  # and the pruned reads' tables (prune_partitions)
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
        self.spark_columns = _spark_columns(plan, self.sources)
        # Feed table -> what each of its reads' filters implies (scan_filters), and
        # the filter right above the read being visited (filter_over_read).
        self.feed_filters: dict[str, list[tuple]] = {}
        self._filter_above: tuple[str, tuple] | None = None
        # A storage-partitioned join's table -> each task's units (in key ranges).
        self.aligned_units: dict[str, tuple[tuple[WorkUnit, ...], ...]] = {}

    def seal(
        self,
        frag: Fragment,
        kind: str,
        partitions: int = 1,
        keys: list[Expression] | None = None,
        readers: int = 1,
    ) -> tuple[Rel, StageInput]:
        """Close ``frag`` as a stage; return the consumer's ``ReadRel`` and input.

        A stage planned already for the same computation cut the same way,
        or one that ran already (adaptive execution), is read again rather
        than planned once more (:mod:`~distfusion.planner.reuse_exchanges`).
        Each input of the stage is read under a name of its own
        (:meth:`Fragment.with_distinct_reads`).
        """
        frag = frag.with_distinct_reads()
        for inp in frag.inputs:  # the names it gave
            if inp.table not in self.tables:
                self.tables.add(inp.table)
                self.oracle.register_empty(inp.table, inp.schema)
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
            found = self._seal_ran(frag, computation, kind, partitions, keys, readers, key_columns)
            if found is not None:
                return found
        if appended:
            proj = Rel()
            proj.project.input.CopyFrom(rel)
            proj.project.expressions.extend(appended)
            rel = proj
        full_schema = self.oracle.schema(rel) if appended else base_schema
        renamed = pa.schema([pa.field(f"c{i}", f.type, True) for i, f in enumerate(full_schema)])
        names = list(named_struct(renamed).names)
        fragment = self.oracle.plan_bytes(rel, names)
        declared = pa.schema(list(renamed)[:num_columns])
        # What it computes, whatever its reads are named (exchange reuse).
        canonical, inputs = canonical_reads(rel, frag.inputs)
        what = (
            self.oracle.plan_bytes(canonical, names),
            kind,
            partitions,
            tuple(key_columns),
            frag.tasks,
            inputs,
            frag.replicated,
        )
        if what in self.computed:
            stage_id, table = self._reuse_planned(what, readers)
        else:
            try:
                plan_text = self.oracle.logical_plan(fragment).display_indent()
            except Exception as exc:  # DataFusion raises bare Exception
                msg = f"DataFusion cannot consume a plan fragment: {exc}"
                raise NotDistributableError(msg) from exc
            stage_id = self.next_stage_id
            self.next_stage_id += 1
            self.computed[what] = len(self.stages)
            session = self.config.session
            self.stages.append(
                Stage(
                    stage_id=stage_id,
                    num_tasks=frag.tasks,
                    fragment=fragment,
                    inputs=tuple(frag.inputs),
                    scans=self._scans(rel, frag.tasks, frag.replicated, frag.chunkable),
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
                    operator_metrics=self.config.operator_metrics,
                    stream_inputs=self.config.stream_task_inputs,
                    unbounded_memory_retry=self.config.unbounded_memory_retry,
                    session=session and session.for_fragment(fragment),
                )
            )
            table = f"__stage_{stage_id}"
        self.tables.add(table)
        self.oracle.register_empty(table, declared)
        boundary = COALESCE if kind == RESULT else kind
        return stage_read(table, named_struct(declared)), StageInput(
            table, stage_id, boundary, declared
        )

    def _scans(
        self,
        rel: Rel,
        tasks: int,
        replicated: frozenset[str],
        chunkable: frozenset[str] = frozenset(),
    ) -> tuple[SourceScan, ...]:
        scans = []
        tables = source_tables(rel, self.sources)
        feeds = [n for n in tables if self.sources[n].streamed]
        for n in tables:
            units = self.sources[n].units
            if self.sources[n].streamed:
                # Chunked only when the fragment is linear in its one feed.
                chunked = n in chunkable and len(feeds) == 1
                options = {**self.sources[n].options, "chunked": chunked}
                if self.sources[n].is_feed:
                    options["filters"] = filters.to_json(any_of(self.feed_filters.get(n, [])))
                if self.sources[n].is_spark:
                    options["columns"] = self.spark_columns.get(n)
                source = replace(self.sources[n], options=options)
                scans.append(SourceScan(source, ((),) * tasks))
            elif n in replicated:
                scans.append(
                    SourceScan(_no_stats(self.sources[n]), (units,) * tasks, replicated=True)
                )
            elif n in self.aligned_units:  # a storage-partitioned join's ranges
                task_units = self.aligned_units[n]
                if len(task_units) != tasks:
                    msg = (
                        f"internal: table {n!r} is read by key range in {len(task_units)} tasks, "
                        f"but its stage has {tasks}"
                    )
                    raise NotDistributableError(msg)
                scans.append(SourceScan(_no_stats(self.sources[n]), task_units))
            else:
                scans.append(SourceScan(_no_stats(self.sources[n]), _split_units(units, tasks)))
        return tuple(scans)

    def gather(self, frag: Fragment) -> Fragment:
        """``frag`` as a single-task fragment: coalesced if it has several tasks.

        A one-task fragment reading a Spark DataFrame is sealed too: what it is
        gathered for may run with other inputs or on the coordinator, while a
        Spark table is read only by a stage of its own, in Spark tasks
        (:meth:`spark_tables`).
        """
        if frag.tasks == 1 and not self.spark_tables(frag):
            return frag
        read, inp = self.seal(frag, COALESCE)
        return Fragment(read, 1, frag.est, [inp])

    def spark_tables(self, frag: Fragment) -> set[str]:
        """The Spark DataFrames ``frag`` reads (:func:`~distfusion.io.sources.spark_source`).

        Each task of a stage reading one runs inside the Spark task computing
        its partition, fed by that partition alone. So a stage reads at most
        one Spark table, reads other stages only as broadcasts (its tasks are
        Spark's partitions, not a shuffle's), and the head stage reads none.
        """
        return {n for n in source_tables(frag.rel, self.sources) if self.sources[n].is_spark}

    def apart(self, frag: Fragment) -> Fragment:
        """``frag`` (one task) sealed into a stage of its own if it reads a Spark table.

        For merging one-task fragments into one stage (see :meth:`spark_tables`).
        """
        return self.gather(frag) if self.spark_tables(frag) else frag

    def shuffle_tasks(self, est: Estimate) -> int:
        n = self.config.tasks.shuffle_tasks(int(est.bytes), self.config.workers)
        return max(1, min(n, self.config.task_cap))

    def exchange(
        self, frag: Fragment, n: int, keys: list[Expression] | None
    ) -> tuple[Rel, StageInput]:
        """Seal ``frag`` for a consumer of ``n`` tasks: shuffle, or coalesce when n == 1."""
        if n == 1:
            return self.seal(frag, COALESCE)
        return self.seal(frag, SHUFFLE, partitions=n, keys=keys or [])

    def visit(self, rel: Rel) -> Fragment:
        frag = self._visit(rel)
        return self._as_ran(frag) if self.materialized else frag

    def _visit(self, rel: Rel) -> Fragment:
        method = getattr(self, f"visit_{rel_kind(rel)}", None)
        if method is None:
            return self.visit_single(rel)
        if own_has_subquery(rel) and not pipelines_subqueries(rel):
            return self.visit_single(rel)
        return method(rel)

    def visit_single(self, rel: Rel, visited: list[Fragment] | None = None) -> Fragment:
        """Run ``rel`` in one task after coalescing every input.

        ``visited`` are the children's fragments when the caller already visited them.
        """
        if visited is None:
            visited = [self.visit(c) for c in children(rel)]
        frags = [self.gather(f) for f in visited]  # Spark tables: stages of their own
        est = sum((f.est for f in frags), Estimate(1, 64))
        inputs = [i for f in frags for i in f.inputs]
        new = Rel()
        new.CopyFrom(set_children(rel, [f.rel for f in frags]) if frags else rel)
        unproject_source_reads(new, set(self.sources))  # reads inside subqueries
        replicated = frozenset().union(*(f.replicated for f in frags))
        return Fragment(new, 1, est, inputs, replicated)

    def visit_read(self, rel: Rel) -> Fragment:
        read = rel.read
        if read.WhichOneof("read_type") != "named_table":
            return Fragment(rel, 1, Estimate(1, 64))
        name = read.named_table.names[-1]
        source = self.sources.get(name)
        if source is None:
            msg = (
                f"table {name!r} is not registered with distfusion (register_parquet/register_csv)"
            )
            raise NotDistributableError(msg)
        registered = name
        above = (
            self._filter_above[1] if self._filter_above and self._filter_above[0] == name else ()
        )
        self._filter_above = None
        if source.options.get("partition_cols"):
            rel, source = prune_partitions(rel, source, self.registry, self.oracle)
        if source.unit_stats:  # file skipping by statistics (a Delta table's log)
            rel, source = skip_units(rel, source, scan_filters(read, self.registry) + above)
        if source.name != registered:  # a table of its own: the files this read keeps
            self.sources[source.name] = source
            self.oracle.register_empty(source.name, source.schema)
            read, name = rel.read, source.name
        cols = None
        if read.HasField("projection"):
            all_names = list(source.schema.names)
            cols = [all_names[i.field] for i in read.projection.select.struct_items]
        scan_bytes = source.projected_bytes(cols)
        rows = source.num_rows if source.num_rows is not None else scan_bytes / 100
        if source.is_feed:
            implied = scan_filters(read, self.registry) + above
            self.feed_filters.setdefault(name, []).append(implied)
            tasks = _feed_tasks(self.config, source.options.get("tasks"))
            est = Estimate(rows, scan_bytes)
            return Fragment(unproject_read(rel), tasks, est, chunkable=frozenset([name]))
        if source.is_spark:
            tasks = _spark_tasks(self.config, scan_bytes, source.options.get("partitions"))
            est = Estimate(rows, scan_bytes)
            return Fragment(unproject_read(rel), tasks, est, chunkable=frozenset([name]))
        tasks = self.config.tasks.leaf_tasks(scan_bytes, len(source.units), self.config.workers)
        tasks = max(1, min(tasks, self.config.task_cap, len(source.units)))
        return Fragment(unproject_read(rel), tasks, Estimate(rows, scan_bytes))

    def _pipeline(self, rel: Rel, factor: float = 1.0) -> Fragment:
        (child,) = children(rel)
        frag = self.visit(child)
        if own_has_subquery(rel):
            rel, inputs = self._plan_subqueries(rel, frag)
            frag = replace(frag, inputs=frag.inputs + inputs)
        part = frag.partitioning
        if part is not None:
            part = self._carry(rel, part)
        # A filter or a projection (without window functions) is linear in its input.
        return frag.with_rel(
            set_children(rel, [frag.rel]), frag.est.scale(factor), part, keep_chunks=True
        )

    def _carry(self, rel: Rel, part: tuple[int, ...]) -> tuple[int, ...] | None:
        """Where the input columns ``part`` of filter or project ``rel`` appear in its output."""
        candidates = [[p] for p in part]
        if rel_kind(rel) == "project":
            width = len(self.oracle.schema(rel.project.input))
            for i, e in enumerate(rel.project.expressions):
                ref = is_field_ref(e)
                if ref in part:
                    candidates[part.index(ref)].append(width + i)
        return through_emit(rel, candidates)

    def visit_filter(self, rel: Rel) -> Fragment:
        names = conjunct_names(rel.filter.condition, self.registry)
        over = filter_over_read(rel, self.registry)
        source = self.sources.get(over[0]) if over is not None else None
        if source is not None and (source.is_feed or source.unit_stats):
            self._filter_above = over  # what the read below keeps (visit_read)
        try:
            return self._pipeline(rel, filter_selectivity(names))
        finally:
            self._filter_above = None

    def visit_project(self, rel: Rel) -> Fragment:
        # Only this projection's own expressions: a projection above a window
        # pipelines on the window's partitioning, it does not shuffle again.
        windows = [
            m for expr in rel.project.expressions for m in find(expr, Expression.WindowFunction)
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
        return Fragment(set_children(rel, [read]), n, frag.est, [inp])

    def visit_fetch(self, rel: Rel) -> Fragment:
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

    def visit_sort(self, rel: Rel) -> Fragment:
        frag = self.visit(rel.sort.input)
        if frag.tasks == 1:
            return frag.with_rel(set_children(rel, [frag.rel]))
        gathered = self.gather(frag.with_rel(set_children(rel, [frag.rel])))
        return gathered.with_rel(set_children(rel, [gathered.rel]))

    def visit_aggregate(self, rel: Rel) -> Fragment:
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
                part = through_emit(rel, [[keys.index(p)] for p in frag.partitioning])
                return frag.with_rel(set_children(rel, [frag.rel]), est, part)
        functions = self.config.session.functions if self.config.session else None
        if dagg.is_decomposable(agg, self.registry, functions):
            split = dagg.split_aggregate(rel, self.registry, functions)
            # Partial states of chunks merge in the final aggregate as those of tasks do.
            partial = frag.with_rel(set_children(split.partial, [frag.rel]), est, keep_chunks=True)
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
            return Fragment(final, n, est, [inp], partitioning=part, key_source=source)
        if g and len(agg.groupings) <= 1:
            keys = list(agg.grouping_expressions)
            n = self.shuffle_tasks(frag.est)
            read, inp = self.exchange(frag, n, keys)
            # The shuffle hashed the key values: output columns 0..k-1.
            part = None
            if n > 1 and len(agg.groupings) == 1:
                part = through_emit(rel, [[i] for i in range(len(keys))])
            source = self._key_source(frag, inp, keys) if part else None
            return Fragment(
                set_children(rel, [read]), n, est, [inp], partitioning=part, key_source=source
            )
        gathered = self.gather(frag)
        return gathered.with_rel(set_children(rel, [gathered.rel]), est)

    def visit_set(self, rel: Rel) -> Fragment:
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
        return Fragment(set_children(rel, reads), n, est, inputs)

    def run(self) -> StageGraph:
        if len(self.plan.relations) != 1 or not self.plan.relations[0].HasField("root"):
            msg = "expected a Substrait plan with exactly one root relation"
            raise PlanningError(msg)
        root = self.plan.relations[0].root
        frag = self.gather(self.visit(root.input))
        if self.config.remote_workers and not self.stages and frag.rel is not None:
            if source_tables(frag.rel, self.sources):
                # The whole query would run in the head, on the coordinator: its
                # workers, configured for the work, do it (one task, coalesced).
                read, inp = self.seal(frag, COALESCE)
                frag = Fragment(read, 1, frag.est, [inp])
        # Columns are named c0.. like every stage's: the query's own names may
        # repeat (SELECT * over a join); the caller restores them.
        self.seal(frag, RESULT)
        self._count_readers()
        return StageGraph(self.query_id, tuple(self.stages), self.config.memory_per_task_bytes)

    def _count_readers(self) -> None:
        """Set each new stage's ``output.readers`` to the reads the graph makes of it.

        A shuffle or coalesce input reads each partition once, a broadcast
        input once per consumer task; a worker frees a partition after that
        many reads. Counted on the finished graph: a fragment found to compute
        what a stage planned already computes (exchange reuse) is dropped
        after its own inputs were sealed, and the reads it would have made are
        not made. Stages that ran (adaptive execution) keep their output anyway.
        """
        reads: dict[int, int] = {}
        for s in self.stages:
            for inp in s.inputs:
                n = s.num_tasks if inp.boundary == BROADCAST else 1
                reads[inp.stage_id] = reads.get(inp.stage_id, 0) + n
        self.stages = [
            replace(s, output=replace(s.output, readers=reads[s.stage_id]))
            if s.stage_id in reads and s.stage_id not in self.ran
            else s
            for s in self.stages
        ]


def _spark_columns(plan: Plan, sources: dict[str, TableSource]) -> dict[str, list[int] | None]:
    """The columns the query reads of each Spark table: Spark computes only those.

    The union over every read of the table in ``plan`` (subqueries included)
    of its projection and the columns its filters read; None: every column (a
    read without projection). A read of no column (``count(*)``) keeps the
    first. Read before the walk moves projections out of the reads.
    """
    found: dict[str, set[int] | None] = {}
    for m in read_rels(plan):
        if m.read.WhichOneof("read_type") != "named_table":
            continue
        name = m.read.named_table.names[-1]
        source = sources.get(name)
        if source is None or not source.is_spark:
            continue
        before = found.get(name, set())
        if not m.read.HasField("projection") or before is None:
            found[name] = None
            continue
        cols = {i.field for i in m.read.projection.select.struct_items}
        for f in ("filter", "best_effort_filter"):
            if m.read.HasField(f):
                cols |= field_refs(getattr(m.read, f))
        found[name] = before | cols
    out: dict[str, list[int] | None] = {}
    for name, read in found.items():
        width = len(sources[name].schema)
        if read is None or len(read) >= width:
            out[name] = None
        else:
            out[name] = sorted(read) or [0]
    return out


def _spark_tasks(config: PlannerConfig, scan_bytes: int, partitions: int | None) -> int:
    """Tasks of a leaf stage reading a Spark DataFrame: one per partition, or fewer.

    The estimator's ``leaf_tasks`` over Spark's size estimate, the partitions
    counted as work units (unknown: one per worker, as Spark would run them),
    but at least one per worker: Spark reads and converts the DataFrame inside
    these tasks, and fewer than the slots would leave Spark's own work on
    fewer cores (its size estimate is compressed file bytes, well below what
    the tasks handle). The runtime coalesces the DataFrame to that many
    partitions (``DataFrame.coalesce``, no shuffle).
    """
    units = partitions if partitions else config.workers
    tasks = config.tasks.leaf_tasks(scan_bytes, units, config.workers)
    if not getattr(config.estimator, "tasks_per_stage", None):
        tasks = max(tasks, config.workers)
    return max(1, min(tasks, config.task_cap, units))


def _feed_tasks(config: PlannerConfig, desired: int | None) -> int:
    """Tasks of a leaf stage reading a feed: the estimator's ``feed_tasks``, workers the cap."""
    estimator = config.estimator
    if isinstance(estimator, EstimatesFeedTasks):
        wanted = estimator.feed_tasks(desired, config.workers)
    else:
        wanted = desired or config.workers
    return max(1, min(int(wanted), config.task_cap))


def _fetch_limit(fetch) -> int | None:
    """Offset + count of a FetchRel, or None when it has no count."""
    offset = fetch.offset_expr.literal.i64 if fetch.HasField("offset_expr") else 0
    if not fetch.HasField("count_expr") or fetch.count_expr.WhichOneof("rex_type") != "literal":
        return None
    count = fetch.count_expr.literal.i64
    return offset + count if count >= 0 else None


def _keys_first(final: Rel, g: int) -> tuple[int, ...] | None:
    """Output columns of :func:`decompose_aggregate.final_aggregate`'s ``g`` keys."""
    candidates = [[i] for i in range(g)]
    if rel_kind(final.project.input) == "project":  # the original aggregate's emit on top
        return through_emit(final, candidates)
    return tuple(range(g))


def _limit_est(est: Estimate, limit: int | None) -> Estimate:
    if limit is None or est.rows <= limit:
        return est
    return Estimate(limit, est.bytes * limit / max(est.rows, 1))


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


def _no_stats(source: TableSource) -> TableSource:
    """``source`` without its unit statistics: planning is done with them (stages stay small)."""
    if source.unit_stats or source.key_ranges:
        return replace(source, unit_stats={}, key_ranges={})
    return source


def inject_network_boundaries(
    plan: Plan,
    sources: dict[str, TableSource],
    config: PlannerConfig,
    oracle: SchemaOracle,
    materialized: dict[str, MaterializedStage] | None = None,
    query_id: str | None = None,
    first_stage_id: int = 1,
) -> StageGraph:
    """Cut ``plan`` (rewritten already) into a :class:`StageGraph`: the walk.

    The last pass of :func:`distfusion.planner.plan.plan_stages`, which has the
    arguments' meaning; ``oracle`` is the one its rewrites used.

    Raises:
        PlanningError: the plan has not exactly one root relation.
        NotDistributableError: see :func:`~distfusion.planner.plan.plan_stages`.
    """
    planner = _Planner(plan, sources, config, oracle, materialized, first_stage_id)
    if query_id is not None:
        planner.query_id = query_id
    return planner.run()
