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

from dataclasses import dataclass, field, replace

from substrait.proto import Rel

from distfusion.planner.estimate import Estimate
from distfusion.planner.walk import rel_kind
from distfusion.stages import Stage, StageInput

__all__ = ["Fragment", "KeySource", "MaterializedStage", "through_emit"]


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
