"""What DataFusion's Substrait producer writes and its consumer rejects, repaired.

Each shape is produced by real DataFusion from SQL: its consumer rejects the
plan (or reads another table) before :func:`repair_substrait`, and after it
consumes the plan to the same answer as the SQL (an inline snapshot of the
consumed plan).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion.errors import NotDistributableError
from distfusion.planner.repair_substrait import repair_substrait
from distfusion.substrait_plan.decode import consume_plan
from distfusion.substrait_plan.walk import relations
from tests.planner.helpers import consumed, substrait_of


@pytest.fixture(scope="module")
def ctx() -> SessionContext:
    """t(k, v) and u(k): 3 and 2 rows, a NULL key in each."""
    ctx = SessionContext()
    t = pa.record_batch({"k": pa.array([1, 2, None], pa.int64()), "v": [1.0, 100.0, 10.0]})
    ctx.register_record_batches("t", [[t]])
    ctx.register_record_batches("u", [[pa.record_batch({"k": pa.array([1, None], pa.int64())})]])
    return ctx


def _rows(ctx: SessionContext, plan) -> list[dict]:
    lp = consume_plan(ctx, plan.SerializeToString())
    return ctx.create_dataframe_from_logical_plan(lp).to_pylist()


def test_a_join_without_condition_joins_on_true(ctx):
    sql = "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u)"
    plan, _ = substrait_of(ctx, sql)
    with pytest.raises(Exception, match="join condition should not be empty"):
        consumed(ctx, plan)
    repair_substrait(plan)
    assert consumed(ctx, plan) == (
        "LeftSemi Join:  Filter: Boolean(true)\n  TableScan: t\n  TableScan: u projection=[]"
    )
    assert _rows(ctx, plan) == ctx.sql(sql).to_pylist()


def test_one_argument_log_gets_its_base_ten(ctx):
    sql = "SELECT log(v) AS l FROM t"
    plan, _ = substrait_of(ctx, sql)
    with pytest.raises(Exception, match="Expect two arguments for logb"):
        consumed(ctx, plan)
    repair_substrait(plan)
    assert consumed(ctx, plan) == (
        "Projection: log(Float64(10), t.v) AS l\n  TableScan: t projection=[v]"
    )
    assert _rows(ctx, plan) == [{"l": 0.0}, {"l": 2.0}, {"l": 1.0}]


def _read_names(plan) -> list[list[str]]:
    return [
        list(r.read.named_table.names)
        for r in relations(plan.relations[0].root.input)
        if r.WhichOneof("rel_type") == "read"
    ]


def test_a_read_of_the_default_schema_reads_the_bare_name(ctx):
    plan, _ = substrait_of(ctx, "SELECT * FROM datafusion.public.t")
    assert _read_names(plan) == [["datafusion", "public", "t"]]
    repair_substrait(plan)
    assert _read_names(plan) == [["t"]]  # the planner finds sources by their bare name
    assert consumed(ctx, plan) == "TableScan: t"


def test_a_read_of_another_schema_is_not_distributable():
    ctx = SessionContext()
    ctx.sql("CREATE SCHEMA s").collect()
    ctx.sql("CREATE TABLE s.t AS VALUES (1)").collect()
    plan, _ = substrait_of(ctx, "SELECT * FROM s.t")
    with pytest.raises(NotDistributableError, match=r"table .*s\.t is not in the default schema"):
        repair_substrait(plan)


def test_a_plan_the_consumer_accepts_is_left_as_is(ctx):
    plan, _ = substrait_of(ctx, "SELECT k, v FROM t WHERE v > 2")
    before = plan.SerializeToString()
    repair_substrait(plan)
    assert plan.SerializeToString() == before
