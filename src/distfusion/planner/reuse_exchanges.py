"""Exchange reuse: a computation planned or run already is read again, not planned again.

Both kinds key a fragment by what it computes:

- within one graph, a fragment over the same inputs sealed the same way as a
  stage planned already becomes one more read of that stage (Spark's
  ``ReuseExchange``): :meth:`ExchangeReuse._reuse_planned`;
- across the graphs of one query (adaptive execution), a subtree that a stage
  which ran already computes is read from that stage's output and planned
  over its measured size (Spark AQE's query stages): the computation digest
  (:meth:`ExchangeReuse._computation`, kept in :attr:`Stage.computation`), the
  :class:`~distfusion.planner.fragment.MaterializedStage` adaptive execution
  hands back, and reading it (:meth:`~ExchangeReuse._as_ran`,
  :meth:`~ExchangeReuse._passthrough`, :meth:`~ExchangeReuse._read_ran`,
  :meth:`~ExchangeReuse._seal_ran`).

See docs/architecture.md (the planner; adaptive execution).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from substrait.proto import Expression, Rel

from distfusion.planner.estimate import Estimate
from distfusion.planner.fragment import Fragment, KeySource, MaterializedStage, canonical_reads
from distfusion.planner.walk_host import WalkHost
from distfusion.stages import BROADCAST, COALESCE, RESULT, SHUFFLE, Stage, StageInput
from distfusion.substrait_plan.build import named_struct, stage_read

__all__ = ["ExchangeReuse"]


class ExchangeReuse(WalkHost):
    """The planner's exchange reuse (a mixin of the planner's walk).

    Uses the planner's ``stages``, ``computed`` (what a stage computes -> its
    index in ``stages``), ``reuses``, ``materialized`` (stages that ran, by
    computation digest), ``ran`` (the same by stage id), ``tables``,
    ``oracle`` and its ``seal``.
    """

    def _computation(self, frag: Fragment) -> str:
        """Digest of what ``frag`` computes: its relation, tasks, inputs and replicated scans.

        Taken over ``frag`` with its reads named as :meth:`seal` names them
        (:meth:`~distfusion.planner.fragment.Fragment.with_distinct_reads`),
        and then after what they read, not their names
        (:func:`~distfusion.planner.fragment.canonical_reads`).
        """
        frag = frag.with_distinct_reads()
        rel, inputs = canonical_reads(frag.rel, frag.inputs)
        h = hashlib.sha1(rel.SerializeToString(deterministic=True))
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

    def _as_ran(self, frag: Fragment) -> Fragment:
        """``frag``, or the read of the stage that ran it already, with its measured size.

        Like Spark AQE's query stages: the rest of the query is planned over
        the stage's actual output (its rows, bytes, task count and hash
        partitioning) instead of the estimate of what it would be.

        A one-task fragment that reads only source tables stays itself, sized
        as measured: a one-task parent may still take it into its own task,
        as the plan that ran did (TPC-H Q11 read ``supplier`` alone for its
        subquery and joined with ``nation`` for its main branch; reading the
        first in place of the second cut the main branch anew, and ran its
        ``partsupp`` stage a second time). Sealed, it is still read where it
        ran (:meth:`_seal_ran`).
        """
        m = self.materialized.get(self._computation(frag))
        if m is None:
            return frag
        if frag.tasks == 1 and not frag.inputs:
            return replace(frag, est=Estimate(m.rows, m.bytes, frag.est.kept))
        return self._passthrough(m, frag.est.kept)

    def _passthrough(self, m: MaterializedStage, kept: float) -> Fragment:
        """A fragment that only reads stage ``m`` that ran, sized as measured.

        A shuffle output is read partition by partition (one task each, hash
        partitioned by its keys), and holds every value its keys take: a
        runtime filter may read it again as a broadcast, as it could the
        stage before it ran (without this, planning again over a measured
        stage dropped TPC-H Q4's semi-join reduction of ``lineitem``); any
        other output by one task reading it all.
        """
        out = m.stage.output
        est = Estimate(m.rows, m.bytes, kept)
        num_columns = out.num_columns if out.num_columns is not None else len(m.stage.output_schema)
        if out.kind == SHUFFLE and out.num_partitions > 1:
            ran = self._read_ran(m, SHUFFLE, out.num_partitions, out.key_columns)
            assert ran is not None  # read as it was cut: always served
            read, inp = ran
            keys = out.key_columns
            part = keys if keys and all(k < num_columns for k in keys) else None
            tasks = out.num_partitions
            source = None if part is None else KeySource(inp, tuple(part), est)
        else:
            ran = self._read_ran(m, BROADCAST, 1, ())
            assert ran is not None  # every row: always served
            read, inp = ran
            part, tasks, source = None, 1, None
        return Fragment(
            read,
            tasks,
            est,
            [inp],
            partitioning=part,
            key_source=source,
            passthrough=(m, read.SerializeToString(deterministic=True)),
        )

    def _seal_ran(
        self,
        frag: Fragment,
        computation: str,
        kind: str,
        partitions: int,
        keys: list[Expression] | None,
        readers: int,
        key_columns: list[int],
    ) -> tuple[Rel, StageInput] | None:
        """:meth:`seal` of ``frag`` as the read of a stage that ran already, if one serves.

        ``computation`` is ``frag``'s digest; ``key_columns`` the output columns
        ``keys`` hash. None when no stage that ran computes ``frag``.
        """
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
            if frag.rel.SerializeToString(deterministic=True) == read_bytes:
                return self._read_ran(ran, kind, partitions, tuple(key_columns))
        return None

    def _reuse_planned(self, what: tuple, readers: int) -> tuple[int, str]:
        """The stage planned already for ``what``, read by ``readers`` more tasks.

        The same fragment over the same inputs, cut the same way: the stage
        planned already is read once more (Spark's ``ReuseExchange``), under a
        table name of its own (one consumer may read it both ways). Returns
        its id and that table name.
        """
        producer = self.stages[self.computed[what]]
        output = replace(producer.output, readers=producer.output.readers + readers)
        self.stages[self.computed[what]] = replace(producer, output=output)
        self.reuses += 1
        return producer.stage_id, f"__stage_{producer.stage_id}_{self.reuses}"
