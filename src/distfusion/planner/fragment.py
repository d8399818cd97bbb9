"""What the planner builds and plans over: fragments in progress, key sources, stages that ran.

The planner's walk (:mod:`~distfusion.planner.inject_network_boundaries`) turns
every relation into a :class:`Fragment`, the stage being built: a relation
tree, its task count, its size estimate, the stage inputs and source scans that
feed its tasks, and how its rows are spread across those tasks
(:func:`through_emit` follows that spread through a relation's emit). A
:class:`KeySource` is a sealed stage holding every key value of a fragment, for
runtime filters; a :class:`MaterializedStage` is a stage that ran, handed back
to the planner by adaptive execution. See docs/architecture.md (the planner).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from substrait.proto import Rel

from distfusion.planner.estimate import Estimate
from distfusion.stages import Stage, StageInput
from distfusion.substrait_plan.walk import read_rels, rel_kind

__all__ = ["Fragment", "KeySource", "MaterializedStage", "canonical_reads", "through_emit"]


@dataclass(frozen=True)
class KeySource:
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
class Fragment:
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
    key_source: KeySource | None = None
    # Set when the fragment is only the read of a stage that ran already
    # (adaptive execution): that stage, and the read's serialized bytes.
    passthrough: tuple[MaterializedStage, bytes] | None = None
    # Feed tables the fragment is linear in: running it over chunks of the
    # feed's units and concatenating the outputs equals running it once over
    # all of them (reads, filters, projections, partial aggregates). A leaf
    # task then runs it per chunk as units arrive (docs/work-unit-feeds.md).
    chunkable: frozenset[str] = frozenset()

    def with_rel(
        self,
        rel: Rel,
        est: Estimate | None = None,
        partitioning: tuple[int, ...] | None = None,
        keep_chunks: bool = False,
    ) -> Fragment:
        """``rel`` over this fragment; ``partitioning`` carries it (and its key source).

        ``keep_chunks``: ``rel`` is linear in its input (a filter, a projection
        without window functions, a partial aggregate), so the fragment stays
        :attr:`chunkable` in its feeds; by default it is not.
        """
        source = self.key_source if partitioning is not None else None
        return replace(
            self,
            rel=rel,
            est=est or self.est,
            partitioning=partitioning,
            key_source=source,
            passthrough=None,
            chunkable=self.chunkable if keep_chunks else frozenset(),
        )

    def with_distinct_reads(self) -> Fragment:
        """This fragment with every stage input read under a table name of its own.

        A task registers each of its inputs as a table under the input's name,
        so two inputs of one name fail the task (DataFusion: ``The table
        __stage_N already exists``). One stage output read twice the same way
        in one fragment gets one name: a stage that ran already read wherever
        the plan needs its computation (a CTE joined with itself, the same
        ``UNION ALL`` branch twice, two identical correlated subqueries, see
        :meth:`~distfusion.planner.reuse_exchanges.ExchangeReuse._read_ran`).
        The second and later such reads, in the order of the fragment's
        relation tree (depth first), are renamed ``<name>_read2``, ... in their
        ``ReadRel`` and input alike. The names follow from the fragment alone,
        so the same fragment gets the same names in every plan of the query
        (its computation digest, which adaptive execution finds stages that
        ran by, stays the same).

        Only inputs equal but for their name are renamed (which ``ReadRel``
        goes with which does not matter); ``self`` is returned when no name
        repeats.
        """
        counts = Counter(i.table for i in self.inputs)
        repeated = {t for t, n in counts.items() if n > 1}
        if not repeated:
            return self
        rel = Rel()
        rel.CopyFrom(self.rel)
        reads: dict[str, list] = {t: [] for t in repeated}
        for m in read_rels(rel):
            names = m.read.named_table.names
            if len(names) == 1 and names[0] in reads:
                reads[names[0]].append(m.read.named_table)
        taken = {i.table for i in self.inputs}
        renamed: dict[str, list[str]] = {}
        for table in repeated:
            first, *others = [replace(i, table="") for i in self.inputs if i.table == table]
            if any(o != first for o in others) or len(reads[table]) != counts[table]:
                continue  # not interchangeable reads: left as they are
            names = [table]
            for k in range(2, counts[table] + 1):
                name = f"{table}_read{k}"
                while name in taken:
                    name += "_"
                taken.add(name)
                names.append(name)
            for named_table, name in zip(reads[table], names, strict=True):
                named_table.names[0] = name
            renamed[table] = names
        if not renamed:
            return self
        inputs = []
        for i in self.inputs:
            names = renamed.get(i.table)
            inputs.append(replace(i, table=names.pop(0)) if names else i)
        return replace(self, rel=rel, inputs=inputs, passthrough=None)


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


def canonical_reads(rel: Rel, inputs: list[StageInput]) -> tuple[Rel, tuple]:
    """``rel`` with the reads of its stage ``inputs`` named after what they read; their identity.

    What a fragment computes does not depend on the names its reads got: a
    consumer of a reused stage reads it as ``__stage_N_2``, and a graph
    planned again reads a stage that ran as ``__stage_N``. Exchange reuse and
    adaptive execution compare fragments in this form, so the same computation
    is found whatever its reads are called. Input ``i`` is named
    ``#<stage>.<boundary>.<partitions>.<k>`` (its k-th read of that stage that
    way); the identity is ``(stage, boundary, partitions, groups)`` per input.
    ``rel`` is not changed (a copy is renamed).
    """
    seen: Counter = Counter()
    names: dict[str, str] = {}
    identity = []
    for i in inputs:
        key = (i.stage_id, i.boundary, i.partitions, i.groups)
        identity.append(key)
        seen[key] += 1
        names.setdefault(i.table, f"#{i.stage_id}.{i.boundary}.{i.partitions}.{seen[key]}")
    out = Rel()
    out.CopyFrom(rel)
    for m in read_rels(out) if names else ():  # a leaf fragment reads no stage
        table = m.read.named_table.names
        if len(table) == 1 and table[0] in names:
            table[0] = names[table[0]]
    return out, tuple(identity)


def through_emit(rel: Rel, candidates: list[list[int]]) -> tuple[int, ...] | None:
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
