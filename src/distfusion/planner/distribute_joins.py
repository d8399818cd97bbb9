"""Join distribution: how a join's two sides meet in the same tasks.

For each join (or cross product) the planner's walk reaches, in order:

- both sides one task: the join runs in that task;
- a join hint (Spark SQL's ``/*+ BROADCAST(t) */``, ``MERGE``,
  ``SHUFFLE_HASH``; :mod:`~distfusion.planner.join_hints`) that the join
  type allows: the hinted side broadcast whatever its size, or both sides
  shuffled (or co-partitioned) whatever their sizes; else the rules below;
- both sides scans of tables stored in key order, joined on that key: the
  join runs in one stage over matching file ranges, with no exchange
  (:mod:`~distfusion.planner.storage_partitioned_joins`);
- a side small enough to copy (``broadcast_pays``) that the join type allows
  to broadcast: a broadcast to the other side's tasks, or, when it only reads
  small source tables, a *broadcast scan* (every task reads those tables in
  full, no stage); a one-task probe side may instead filter the large side
  first (:mod:`~distfusion.planner.inject_runtime_filters`);
- a side already hash-partitioned by the join keys (co-partitioned): only the
  other side is shuffled, into as many partitions (Spark's
  ``EnsureRequirements``);
- equi-join keys: both sides shuffled by their key expressions, the selective
  side filtering the other first when that pays;
- otherwise both sides gathered into one task.

See docs/architecture.md (planner rules).
"""

from __future__ import annotations

from dataclasses import replace

from substrait.proto import Expression, JoinRel, Rel

from distfusion.planner.estimate import Estimate, SizesTasksByBytes
from distfusion.planner.fragment import Fragment, KeySource, through_emit
from distfusion.planner.inject_runtime_filters import REDUCE_LEFT, REDUCE_RIGHT, RuntimeFilters
from distfusion.planner.join_hints import JoinHint, join_hint
from distfusion.planner.storage_partitioned_joins import StoragePartitionedJoins
from distfusion.protocol.hashing import hash_type
from distfusion.spark_sql.hints import BROADCAST as HINT_BROADCAST
from distfusion.spark_sql.hints import MERGE, SHUFFLE_HASH
from distfusion.stages import BROADCAST, COALESCE, SHUFFLE, StageInput
from distfusion.substrait_plan.build import (
    FunctionRegistry,
    conjuncts,
    is_field_ref,
    shift_field_refs,
)
from distfusion.substrait_plan.walk import (
    children,
    field_refs,
    has_subquery,
    set_children,
    source_tables,
)

__all__ = ["JoinDistribution"]

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
# Join types whose output keys are all matched by a right row.
_MATCHED = {_J.JOIN_TYPE_INNER, _J.JOIN_TYPE_LEFT_SEMI}
_NO_HINT = JoinHint()
# Join types Spark builds a shuffled hash join's table of, by side
# (``canBuildShuffledHashJoinLeft/Right``); a mark join is its existence join.
_HASH_BUILD = {
    "left": {_J.JOIN_TYPE_INNER, _J.JOIN_TYPE_RIGHT, _J.JOIN_TYPE_OUTER},
    "right": {
        _J.JOIN_TYPE_INNER,
        _J.JOIN_TYPE_LEFT,
        _J.JOIN_TYPE_OUTER,
        _J.JOIN_TYPE_LEFT_SEMI,
        _J.JOIN_TYPE_LEFT_ANTI,
        _J.JOIN_TYPE_LEFT_MARK,
    },
}


class JoinDistribution(RuntimeFilters, StoragePartitionedJoins):
    """The planner's join distribution (a mixin of the planner's walk).

    Uses the planner's ``config``, ``oracle``, ``registry``, ``sources`` and
    its ``visit``, ``seal``, ``exchange``, ``gather`` and ``shuffle_tasks``.
    """

    def visit_join(self, rel: Rel) -> Fragment:
        """A join: its equi keys (and whether they may filter by ``=``), then :meth:`_join`."""
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
        hint = join_hint(rel)
        return self._join(rel, join.type, left, right, keys, reducible=not null_safe, hint=hint)

    def visit_cross(self, rel: Rel) -> Fragment:
        """A cross product: an inner join without keys."""
        left, right = self.visit(rel.cross.left), self.visit(rel.cross.right)
        return self._join(rel, _J.JOIN_TYPE_INNER, left, right, [], hint=join_hint(rel))

    def _one_wave(self, probe: Fragment, broadcast_bytes: float) -> Fragment:
        """``probe``, about to read a broadcast of ``broadcast_bytes``, in one wave of tasks.

        Where tasks may outnumber the workers (the estimator's
        ``wave_bytes_per_task``, Spark's slots), every task past the first
        wave loads each broadcast and builds its hash table again, while its
        probe side streams: for a broadcast of at least 1/16 of a wave task's
        bytes, more waves mostly repeat that work, so the fragment gets one
        task per worker. TPC-H SF10 on Spark: Q9's lineitem stage reads 420 MiB
        of broadcasts per task, and ran 0.55-1.15 s faster in 2 tasks than in
        4; Q19's reads a few MiB, and ran 0.28-0.38 s slower in 2: there
        smaller tasks even out the slots (docs/benchmarks.md, "Where Spark's
        time goes at SF10"). Not for a fragment whose task count
        is fixed: a shuffle's partitions, a feed, a Spark table, a stage that
        ran, or ``tasks_per_stage``.
        """
        estimator = self.config.estimator
        wave = estimator.wave_bytes_per_task if isinstance(estimator, SizesTasksByBytes) else None
        if (
            probe.tasks <= self.config.workers
            or wave is None
            or any(n in self.aligned_units for n in source_tables(probe.rel, self.sources))
            or broadcast_bytes * 16 < wave
            or (isinstance(estimator, SizesTasksByBytes) and estimator.tasks_per_stage)
            or probe.partitioning is not None
            or probe.passthrough is not None
            or probe.chunkable
            or any(i.boundary != BROADCAST for i in probe.inputs)
        ):
            return probe
        return replace(probe, tasks=self.config.workers)

    def _replicable(self, build: Fragment, probe: Fragment) -> frozenset[str] | None:
        """The source tables of ``build`` if every probe task can read them in full.

        That is a broadcast without a stage: ``build`` must be one task over
        source tables only, all of them at most ``replicate_scan_bytes`` in total
        (re-reading costs a scan per task), none also read split by the probe,
        none on an object store (where every task would list, open and read
        the footer of every file again: a broadcast stage reads them once).
        """
        if build.tasks != 1 or build.inputs:
            return None
        names = frozenset(source_tables(build.rel, self.sources))
        total = sum(self.sources[n].size_bytes for n in names)
        if any(self.sources[n].streamed for n in names):
            return None  # a feed or Spark table streams each part to one task, never all to all
        if any(self.sources[n].remote for n in names):
            return None  # on an object store every read costs requests: read once, broadcast
        if not names or total > self.config.replicate_scan_bytes:
            return None
        split = set(source_tables(probe.rel, self.sources)) - probe.replicated
        return None if names & split else names

    def _co_partition(
        self, rel: Rel, left: Fragment, right: Fragment, keys: list[tuple[Expression, Expression]]
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
        candidates: list[list[int]] = []
        for lk, rk in pairs:
            left_col, right_col = is_field_ref(lk), is_field_ref(rk)
            cands = [] if left_col is None else [left_col]
            if join_type == _J.JOIN_TYPE_INNER and right_col is not None:
                cands.append(left_arity + right_col)
            if not cands:
                return None
            candidates.append(cands)
        return through_emit(rel, candidates)

    def _join(
        self,
        rel: Rel,
        join_type: int,
        left: Fragment,
        right: Fragment,
        keys: list[tuple[Expression, Expression]],
        reducible: bool = True,
        hint: JoinHint = _NO_HINT,
    ) -> Fragment:
        if join_type in _SEMI_LIKE:
            est = left.est
        elif keys and join_type == _J.JOIN_TYPE_INNER:
            est = left.est.equi_join(right.est)
        elif keys:
            est = Estimate(max(left.est.rows, right.est.rows), left.est.bytes + right.est.bytes)
        else:
            est = Estimate(left.est.rows * right.est.rows, left.est.bytes * max(right.est.rows, 1))
        if left.tasks == 1 and right.tasks == 1:
            # A stage reading a Spark table reads no other stage but broadcasts.
            left, right = self.apart(left), self.apart(right)
            new = set_children(rel, [left.rel, right.rel])
            return Fragment(
                new, 1, est, left.inputs + right.inputs, left.replicated | right.replicated
            )
        hinted = _hinted_broadcast(hint, join_type)
        shuffled = not hinted and _hinted_shuffle(hint, join_type, keys)
        aligned = (
            None
            if hinted
            else self._storage_partitioned(rel, join_type, left, right, keys, reducible, est)
        )
        if aligned is not None:
            return aligned
        co = self._co_partition(rel, left, right, keys) if keys and not hinted else None
        pays = self.config.broadcast_pays
        candidates = []
        if join_type in _BROADCAST_RIGHT and pays(right.est.bytes, left.est.bytes, left.tasks):
            candidates.append((right.est.bytes, "right"))
        if join_type in _BROADCAST_LEFT and pays(left.est.bytes, right.est.bytes, right.tasks):
            candidates.append((left.est.bytes, "left"))
        if hinted:  # whatever its size, as Spark: a hint is the user's call
            candidates = [((right if h == "right" else left).est.bytes, h) for h in hinted]
        elif shuffled:
            candidates = []
        if not keys and not candidates:
            # No keys to shuffle by: broadcast whatever side the join type allows.
            if join_type in _BROADCAST_RIGHT:
                candidates.append((right.est.bytes, "right"))
            elif join_type in _BROADCAST_LEFT:
                candidates.append((left.est.bytes, "left"))
        if co is not None:
            # Broadcast only if copying the build side to every other probe task
            # moves fewer bytes than shuffling the side that is not partitioned.
            moved_bytes = (right if co[0] == "left" else left).est.bytes
            candidates = [
                (b, side)
                for b, side in candidates
                if b * ((left if side == "right" else right).tasks - 1) < moved_bytes
            ]
        if candidates:
            side = min(candidates)[1]
            build, probe = (right, left) if side == "right" else (left, right)
            replicated = self._replicable(build, probe)
            if replicated is not None:
                new_children = [probe.rel, build.rel] if side == "right" else [build.rel, probe.rel]
                return Fragment(
                    set_children(rel, new_children),
                    probe.tasks,
                    est,
                    probe.inputs,
                    probe.replicated | replicated,
                )
            kind = BROADCAST if probe.tasks > 1 else COALESCE
            if kind == BROADCAST:
                probe = self._one_wave(probe, build.est.bytes)
            if kind == COALESCE and keys and reducible:
                reduced = self._one_task_reduction(rel, join_type, side, probe, build, keys, est)
                if reduced is not None:
                    return reduced
            read, inp = self.seal(build, kind, readers=probe.tasks if kind == BROADCAST else 1)
            part = probe.partitioning
            if part is not None and side == "left":  # the probe's columns follow the build's
                arity = len(self.oracle.schema(children(rel)[0]))  # a join or a cross
                part = tuple(arity + p for p in part) if join_type == _J.JOIN_TYPE_INNER else None
            part = None if part is None else through_emit(rel, [[p] for p in part])
            probe_side = "left" if side == "right" else "right"
            return _in_tasks_of(rel, probe, probe_side, read, inp, est, part, probe.key_source)
        if co is not None:
            side, pairs = co
            kept, moved = (left, right) if side == "left" else (right, left)
            moved_keys = [k[1] if side == "left" else k[0] for k in pairs]
            if reducible and join_type in (REDUCE_RIGHT if side == "left" else REDUCE_LEFT):
                kept_keys = [k[0] if side == "left" else k[1] for k in pairs]
                source = self._smallest_key_source(kept, kept.key_source, kept_keys)
                moved = self._reduce(moved, moved_keys, source)
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
                source = self._key_source(right, rinp, rkeys)
                source = self._smallest_key_source(right, source, rkeys)
                left = self._reduce(left, lkeys, source)
                lread, linp = self.exchange(left, n, lkeys)
            else:
                lread, linp = self.exchange(left, n, lkeys)
                if creator == "left":
                    source = self._key_source(left, linp, lkeys)
                    source = self._smallest_key_source(left, source, lkeys)
                    right = self._reduce(right, rkeys, source)
                rread, rinp = self.exchange(right, n, rkeys)
            part = self._join_partitioning(rel, join_type, keys) if n > 1 else None
            source = self._key_source(left, linp, lkeys) if part else None
            return Fragment(
                set_children(rel, [lread, rread]),
                n,
                est,
                [linp, rinp],
                partitioning=part,
                key_source=source,
            )
        left, right = self.gather(left), self.gather(right)
        new = set_children(rel, [left.rel, right.rel])
        return Fragment(new, 1, est, left.inputs + right.inputs)


def _hinted_broadcast(hint: JoinHint, join_type: int) -> list[str]:
    """The sides a ``BROADCAST`` hint names that the join type lets be broadcast.

    Spark's ``JoinSelection`` the same: a hint on the preserved side of an
    outer join (the left of a LEFT JOIN) cannot be followed and is ignored.
    """
    sides = []
    if hint.left == HINT_BROADCAST and join_type in _BROADCAST_LEFT:
        sides.append("left")
    if hint.right == HINT_BROADCAST and join_type in _BROADCAST_RIGHT:
        sides.append("right")
    return sides


def _hinted_shuffle(hint: JoinHint, join_type: int, keys: list) -> bool:
    """Whether a ``MERGE`` or ``SHUFFLE_HASH`` hint asks an equi-join to shuffle both sides.

    Spark's order (``JoinSelection``): a sort-merge join for ``MERGE`` on
    either side; a shuffled hash join for ``SHUFFLE_HASH`` on a side Spark
    can build a hash table of for the join type. Both are a shuffle of both
    sides by the keys here (each task then joins as DataFusion chooses). A
    join without equi keys follows neither, as in Spark.
    """
    if not keys:
        return False
    if MERGE in (hint.left, hint.right):
        return True
    return any(
        getattr(hint, side) == SHUFFLE_HASH and join_type in _HASH_BUILD[side]
        for side in ("left", "right")
    )


def _in_tasks_of(
    rel: Rel,
    kept: Fragment,
    kept_side: str,
    read: Rel,
    inp: StageInput,
    est: Estimate,
    partitioning: tuple[int, ...] | None,
    key_source: KeySource | None,
) -> Fragment:
    """Join ``rel`` in ``kept``'s tasks (its ``kept_side`` input), the other side via ``inp``."""
    new_children = [kept.rel, read] if kept_side == "left" else [read, kept.rel]
    return Fragment(
        set_children(rel, new_children),
        kept.tasks,
        est,
        kept.inputs + [inp],
        kept.replicated,
        partitioning,
        key_source if partitioning is not None else None,
    )


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
        if has_subquery(a) or has_subquery(b):
            continue
        ra, rb = field_refs(a), field_refs(b)
        if not ra or not rb:
            continue
        if max(ra) < left_arity <= min(rb):
            keys.append((a, shift_field_refs(b, -left_arity)))
        elif max(rb) < left_arity <= min(ra):
            keys.append((b, shift_field_refs(a, -left_arity)))
    return keys
