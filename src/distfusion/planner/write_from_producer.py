"""Writes from the stage that produces the rows: no coalesce stage before the writers.

A write (``write_parquet``, ``write_delta``, ``write_iceberg``, ``INSERT``,
``MERGE``) runs the head stage as parts where the data is
(:mod:`distfusion.worker.head_parts`). A row-wise head over one stage's
coalesced output would have that stage's tasks keep their whole output (the
query's result) until the writing parts read it; the result is held twice
over, in the producers' outputs and in what the writers have not written yet.
Here the head's fragment is put on top of its producer's instead, and the
producer's tasks become the head's parts: each runs the producer's fragment
over its share of the producer's inputs, the head's projections and filters
over that, and writes what comes out (Spark's ``FileFormatWriter`` writes from
the tasks of the stage that computes the rows in the same way)::

    before                               after
    Stage 4 [head] <- coalesce stage 3   Stage 4 [head, 4 tasks] <- shuffles of stages 1, 2
      Project(__stage_3)                   Project(Join(__stage_1, __stage_2))
    Stage 3 [4 tasks] output: coalesce     part j: task j of the old stage 3, writing
      Join(__stage_1, __stage_2)
    Stages 1, 2: shuffles                Stages 1, 2: shuffles (unchanged)

The head keeps its stage id, output and schema; it takes the producer's task
count, inputs, work units and session. The fragments are joined in Substrait:
the head's read of the producer's table is replaced by the producer's root
relation (field references are positional, and the read's columns are the
relation's output columns), with the plan's extension declarations of the
larger of the two (the planner only appends declarations, so one is a prefix
of the other).
"""

from __future__ import annotations

import dataclasses

from substrait.proto import Expression, Plan

from distfusion.stages import COALESCE, Stage, StageGraph
from distfusion.substrait_plan.walk import is_subquery, own_contains, rel_kind, relations

__all__ = ["write_from_producer"]


def write_from_producer(graph: StageGraph, ran: set[int]) -> StageGraph | None:
    """``graph`` with its head fused into the one stage it reads; None when it cannot be.

    The head must be row-wise (projections and filters, without window
    functions or subqueries, over its input: as
    :func:`~distfusion.worker.head_parts.row_wise`), read exactly one stage
    through a coalesce, once, with a plain read (no filter, no projection or
    emit of its own); that stage must not have run (``ran``),
    have no other consumer, read no work unit feed nor a Spark DataFrame (its
    tasks then run where the coordinator or Spark's own partitions are), and
    its fragment must declare a prefix of the head's extensions or the
    reverse.

    Args:
        graph: the final graph of a write (adaptive waves run).
        ran: ids of the stages that ran already (their outputs exist).

    Returns:
        A graph without the producer stage, whose head has the producer's
        tasks, inputs and scans and the fused fragment; or None.
    """
    head = graph.head
    if head.scans or len(head.inputs) != 1 or head.inputs[0].boundary != COALESCE:
        return None
    producer = graph.stage(head.inputs[0].stage_id)
    if producer.stage_id in ran or producer.output.kind != COALESCE:
        return None
    if any(
        s is not head and s.stage_id != producer.stage_id and _reads(s, producer)
        for s in graph.stages
    ):
        return None
    if any(s.source.is_feed or s.source.is_spark or s.source.streamed for s in producer.scans):
        return None
    num_columns = producer.output.num_columns
    if num_columns is not None and num_columns != len(producer.output_schema):
        return None
    fragment = _fused(head.fragment, producer.fragment, head.inputs[0].table)
    if fragment is None:
        return None
    fused = dataclasses.replace(
        producer,
        stage_id=head.stage_id,
        fragment=fragment,
        output=head.output,
        plan_text=(
            f"{head.plan_text.rstrip()}\n"
            f"  (written by the tasks of stage {producer.stage_id}, over:)\n"
            f"{producer.plan_text.rstrip()}"
        ),
        output_schema=head.output_schema,
        computation="",
    )
    stages = tuple(s for s in graph.stages[:-1] if s.stage_id != producer.stage_id)
    return dataclasses.replace(graph, stages=(*stages, fused))


def _reads(stage: Stage, producer: Stage) -> bool:
    return any(i.stage_id == producer.stage_id for i in stage.inputs)


def _row_wise(rel) -> bool:
    """A read, or a projection or filter without window functions or subqueries."""
    kind = rel_kind(rel)
    if kind == "read":
        return True
    if kind not in ("project", "filter"):
        return False
    return not own_contains(
        rel, lambda m: isinstance(m, Expression.WindowFunction) or is_subquery(m)
    )


def _fused(head_fragment: bytes, producer_fragment: bytes, table: str) -> bytes | None:
    """The head's plan with its one read of ``table`` replaced by the producer's root relation."""
    head, producer = Plan(), Plan()
    head.ParseFromString(head_fragment)
    producer.ParseFromString(producer_fragment)
    if len(head.relations) != 1 or len(producer.relations) != 1:
        return None
    if not (head.relations[0].HasField("root") and producer.relations[0].HasField("root")):
        return None
    for name in ("extensions", "extension_urns", "extension_uris"):
        if not hasattr(head, name):
            continue
        mine, theirs = list(getattr(head, name)), list(getattr(producer, name))
        short, long = sorted((mine, theirs), key=len)
        if long[: len(short)] != short:
            return None
        if long is theirs:
            del getattr(head, name)[:]
            getattr(head, name).extend(theirs)
    reads = [
        r
        for r in relations(head.relations[0].root.input)
        if rel_kind(r) == "read"
        and r.read.HasField("named_table")
        and ".".join(r.read.named_table.names) == table
    ]
    if len(reads) != 1 or not all(_row_wise(r) for r in relations(head.relations[0].root.input)):
        return None
    read = reads[0].read
    if (
        read.HasField("filter")
        or read.HasField("best_effort_filter")
        or read.HasField("projection")
        or (read.HasField("common") and read.common.HasField("emit"))
    ):
        return None
    root = producer.relations[0].root
    if len(root.names) != len(read.base_schema.names):
        return None
    reads[0].CopyFrom(root.input)
    return head.SerializeToString()
