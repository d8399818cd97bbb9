"""Reading and building Substrait shapes (:mod:`distfusion.substrait_plan.build`).

What is built is consumed again by DataFusion, so a wrong shape fails there.
"""

from __future__ import annotations

import pyarrow as pa
from substrait.proto import Plan, Type

from distfusion.substrait_plan.build import (
    FunctionRegistry,
    conjunct_names,
    conjuncts,
    field_ref,
    is_field_ref,
    named_struct,
    shift_field_refs,
    stage_read,
    unproject_read,
)
from distfusion.substrait_plan.walk import rel_kind, relations
from tests.planner.helpers import consumed, substrait_of


def test_field_refs_round_trip_and_shift():
    assert is_field_ref(field_ref(3)) == 3
    assert is_field_ref(shift_field_refs(field_ref(3), 2)) == 5


def test_conjuncts_of_a_pushed_down_filter(ctx):
    plan, _ = substrait_of(ctx, "SELECT k FROM p WHERE v > 2 AND s = 'b' AND k IS NOT NULL")
    (read,) = [r for r in relations(plan.relations[0].root.input) if rel_kind(r) == "read"]
    registry = FunctionRegistry(plan)
    parts = conjuncts(read.read.filter, registry)
    assert sorted(registry.name(p.scalar_function.function_reference) for p in parts) == [
        "equal",
        "gt",
        "is_not_null",
    ]
    assert registry.conjunction(parts) == read.read.filter
    assert conjunct_names(read.read.filter, registry) is not None


def test_named_struct_declares_nullable_positional_columns():
    ns = named_struct(pa.schema([("x", pa.int32(), False), ("y", pa.string())]))
    assert list(ns.names) == ["c0", "c1"]
    nullable = Type.Nullability.NULLABILITY_NULLABLE
    assert [ns.struct.types[0].i32.nullability, ns.struct.types[1].string.nullability] == [
        nullable,
        nullable,
    ]  # x was declared NOT NULL: a task's output satisfies either way


def test_a_stage_read_is_consumed_as_a_table_of_that_schema(ctx):
    schema = pa.schema([("c0", pa.int64()), ("c1", pa.string())])
    ctx.register_record_batches(
        "__stage_7", [[pa.record_batch({"c0": pa.array([1], pa.int64()), "c1": ["a"]})]]
    )
    plan = Plan()
    plan.relations.add().root.input.CopyFrom(stage_read("__stage_7", named_struct(schema)))
    plan.relations[0].root.names.extend(["c0", "c1"])
    assert consumed(ctx, plan) == "TableScan: __stage_7"
    ctx.deregister_table("__stage_7")


def test_unproject_read_moves_projection_and_filter_above_the_read(ctx):
    sql = "SELECT s FROM p WHERE v > 2"
    plan, _ = substrait_of(ctx, sql)
    rel = plan.relations[0].root.input
    (read,) = [r for r in relations(rel) if rel_kind(r) == "read"]
    assert read.read.HasField("projection") and read.read.HasField("filter")
    read.CopyFrom(unproject_read(read))
    assert not read.read.HasField("projection") and not read.read.HasField("filter")
    assert [rel_kind(r) for r in relations(rel)][-3:] == ["project", "filter", "read"]
    assert "Filter: p.v > Float64(2)" in consumed(ctx, plan)
