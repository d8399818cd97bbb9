"""What the walk builds (:mod:`distfusion.planner.fragment`).

Small relations of stage reads (``ReadRel``s of ``__stage_N``, as the walk
writes them), consumed by DataFusion where their meaning matters.
"""

from __future__ import annotations

import pyarrow as pa
from datafusion import SessionContext
from substrait.proto import Expression, JoinRel, Plan, Rel

from distfusion.planner.estimate import Estimate
from distfusion.planner.fragment import Fragment, canonical_reads, through_emit
from distfusion.stages import BROADCAST, SHUFFLE, StageInput
from distfusion.substrait_plan.build import join_rel, named_struct, stage_read
from distfusion.substrait_plan.decode import consume_plan
from distfusion.substrait_plan.walk import relations

SCHEMA = pa.schema([("c0", pa.int64(), True)])


def stage_input(table: str, stage_id: int = 3, boundary: str = SHUFFLE) -> StageInput:
    return StageInput(table, stage_id, boundary, SCHEMA, partitions=4)


def cross(left: str, right: str) -> Rel:
    """An inner join on true of reads of stage tables ``left`` and ``right``."""
    cond = Expression()
    cond.literal.boolean = True
    return join_rel(
        stage_read(left, named_struct(SCHEMA)),
        stage_read(right, named_struct(SCHEMA)),
        cond,
        JoinRel.JOIN_TYPE_INNER,
    )


def read_names(rel: Rel) -> list[str]:
    return [
        r.read.named_table.names[0] for r in relations(rel) if r.WhichOneof("rel_type") == "read"
    ]


def test_canonical_reads_name_reads_after_what_they_read():
    # The same computation reading stage 3 under two names is found equal ...
    a, ida = canonical_reads(
        cross("__stage_3", "__stage_4"), [stage_input("__stage_3"), stage_input("__stage_4", 4)]
    )
    b, idb = canonical_reads(
        cross("__stage_3_2", "__stage_4"), [stage_input("__stage_3_2"), stage_input("__stage_4", 4)]
    )
    assert a == b and ida == idb
    assert read_names(a) == ["#3.shuffle.4.1", "#4.shuffle.4.1"]
    # ... and one reading it another way is not.
    c, idc = canonical_reads(
        cross("__stage_3", "__stage_4"),
        [stage_input("__stage_3", boundary=BROADCAST), stage_input("__stage_4", 4)],
    )
    assert idc != ida and read_names(c)[0] == "#3.broadcast.4.1"


def test_canonical_reads_leave_the_relation_itself_unchanged():
    rel = cross("__stage_3", "__stage_4")
    canonical_reads(rel, [stage_input("__stage_3"), stage_input("__stage_4", 4)])
    assert read_names(rel) == ["__stage_3", "__stage_4"]


def test_two_equal_reads_of_one_stage_get_names_of_their_own():
    # A task registers each input under its name: one name twice would fail it.
    frag = Fragment(
        cross("__stage_3", "__stage_3"),
        4,
        Estimate(10, 80),
        inputs=[stage_input("__stage_3"), stage_input("__stage_3")],
    )
    out = frag.with_distinct_reads()
    assert read_names(out.rel) == ["__stage_3", "__stage_3_read2"]
    assert [i.table for i in out.inputs] == ["__stage_3", "__stage_3_read2"]
    ctx = SessionContext()
    for name in ("__stage_3", "__stage_3_read2"):
        ctx.register_record_batches(name, [[pa.record_batch({"c0": pa.array([1, 2], pa.int64())})]])
    plan = Plan()
    plan.relations.add().root.input.CopyFrom(out.rel)
    plan.relations[0].root.names.extend(["a", "b"])
    lp = consume_plan(ctx, plan.SerializeToString())
    assert len(ctx.create_dataframe_from_logical_plan(lp).to_pylist()) == 4
    # Inputs read differently are not interchangeable: left as they are.
    mixed = Fragment(
        cross("__stage_3", "__stage_3"),
        4,
        Estimate(10, 80),
        inputs=[stage_input("__stage_3"), stage_input("__stage_3", boundary=BROADCAST)],
    )
    assert mixed.with_distinct_reads() is mixed


def test_through_emit_follows_partitioning_columns_through_an_emit():
    rel = Rel()
    rel.project.input.CopyFrom(stage_read("__stage_1", named_struct(SCHEMA)))
    assert through_emit(rel, [[0]]) == (0,)  # no emit: the columns stay
    rel.project.common.emit.output_mapping.extend([2, 0])
    assert through_emit(rel, [[0]]) == (1,)
    assert through_emit(rel, [[1, 2]]) == (0,)  # either candidate holds the column
    assert through_emit(rel, [[1]]) is None  # the emit drops it: partitioning unknown
