"""``NOT IN`` through Substrait (:mod:`distfusion.planner.rewrite_null_aware_anti_join`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion.planner.rewrite_null_aware_anti_join import rewrite_null_aware_anti_joins
from distfusion.substrait_plan.decode import consume_plan
from tests.planner.helpers import (
    consumed,
    run,
    substrait_of,
)


def test_not_in_without_nulls(small, large):
    sql = "SELECT * FROM t WHERE k IS NOT NULL AND k NOT IN (SELECT k FROM u WHERE k IS NOT NULL)"
    run(small, sql)
    run(large, sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u)",
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u WHERE k IS NOT NULL)",
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u WHERE k > 1000)",
    ],
    ids=["null-in-subquery", "null-outer-key", "empty-subquery"],
)
def test_not_in_with_nulls(small, sql):
    run(small, sql)


def _ctx_with_null_keys() -> SessionContext:
    ctx = SessionContext()
    t = pa.record_batch({"k": pa.array([1, 2, None], pa.int64()), "v": [1.0, 100.0, 10.0]})
    ctx.register_record_batches("t", [[t]])
    ctx.register_record_batches("u", [[pa.record_batch({"k": pa.array([1, None], pa.int64())})]])
    return ctx


def test_null_aware_anti_join_becomes_a_plain_one_that_keeps_not_in():
    # DataFusion's producer drops the null-aware flag: consumed as is, NOT IN
    # over a subquery holding NULL would return rows; it must return none.
    ctx = _ctx_with_null_keys()
    sql = "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u)"
    plan, logical = substrait_of(ctx, sql)
    assert consumed(ctx, plan) == "LeftAnti Join: t.k = u.k\n  TableScan: t\n  TableScan: u"
    lp = consume_plan(ctx, plan.SerializeToString())
    assert ctx.create_dataframe_from_logical_plan(lp).to_pylist() != []  # the lost meaning
    rewrite_null_aware_anti_joins(plan, logical)
    assert consumed(ctx, plan) == (
        "LeftAnti Join:  Filter: t.k = u.k OR t.k IS NULL OR u.k IS NULL\n"
        "  TableScan: t\n"
        "  TableScan: u"
    )
    lp = consume_plan(ctx, plan.SerializeToString())
    assert ctx.create_dataframe_from_logical_plan(lp).to_pylist() == ctx.sql(sql).to_pylist() == []


def test_not_exists_is_no_null_aware_join_and_stays():
    ctx = _ctx_with_null_keys()
    plan, logical = substrait_of(
        ctx, "SELECT * FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.k)"
    )
    before = plan.SerializeToString()
    rewrite_null_aware_anti_joins(plan, logical)
    assert plan.SerializeToString() == before
