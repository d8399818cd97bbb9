"""Aggregates (:mod:`distfusion.planner.decompose_aggregate`): partial below the exchange, final above; what does not decompose.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from distfusion.stages import SHUFFLE
from tests.planner.helpers import (
    assert_explain,
    check_well_formed,
    kinds,
    run,
)


def test_grouped_aggregate_partial_below_shuffle_final_above(small):
    # Partial aggregate in the producing stage, shuffle by the key, final above.
    assert_explain(
        small,
        "SELECT k, sum(v) AS sv, count(*) AS n, min(s) AS lo, max(s) AS hi FROM t GROUP BY k",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, sum(__stage_1.c1) AS c1, sum(__stage_1.c2) AS c2, min(__stage_1.c3) AS c3, max(__stage_1.c4) AS c4
              Projection: __stage_1.c0, CAST(sum(__stage_1.c1) AS Float64), CAST(sum(__stage_1.c2) AS Int64), CAST(min(__stage_1.c3) AS Utf8), CAST(max(__stage_1.c4) AS Utf8)
                Aggregate: groupBy=[[__stage_1.c0]], aggr=[[sum(__stage_1.c1), sum(__stage_1.c2), min(__stage_1.c3), max(__stage_1.c4)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[t.k AS c0]], aggr=[[sum(t.v) AS c1, count(Int64(1)) AS c2, min(t.s) AS c3, max(t.s) AS c4]]
              Projection: t.k, t.v, t.s
                TableScan: t
        """,
    )


def test_global_aggregate_partial_per_task_then_coalesce(small):
    # Partial per task, coalesced into the head, final there.
    assert_explain(
        small,
        "SELECT count(*) AS n, sum(v) AS sv, min(k) AS lo, max(s) AS hi, avg(v) AS av FROM t",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: sum(__stage_1.c0) AS c0, sum(__stage_1.c1) AS c1, min(__stage_1.c2) AS c2, max(__stage_1.c3) AS c3, sum(__stage_1.c4) / sum(__stage_1.c5) AS c4
              Projection: CAST(sum(__stage_1.c0) AS Int64), CAST(sum(__stage_1.c1) AS Float64), CAST(min(__stage_1.c2) AS Int64), CAST(max(__stage_1.c3) AS Utf8), CAST(CAST(sum(__stage_1.c4) AS Float64) / CAST(sum(__stage_1.c5) AS Float64) AS Float64)
                Aggregate: groupBy=[[]], aggr=[[sum(__stage_1.c0), sum(__stage_1.c1), min(__stage_1.c2), max(__stage_1.c3), sum(__stage_1.c4), sum(__stage_1.c5)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[]], aggr=[[count(Int64(1)) AS c0, sum(t.v) AS c1, min(t.k) AS c2, max(t.s) AS c3, sum(t.v) AS sum(t.v)__temp__0 AS c4, count(t.v) AS c5]]
              Projection: t.k, t.v, t.s
                TableScan: t
        """,
    )


def test_non_decomposable_aggregate_shuffles_raw_rows(small):
    # median does not decompose: raw rows shuffled by the key, aggregated once.
    assert_explain(
        small,
        "SELECT k, median(v) AS m FROM t GROUP BY k",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, median(__stage_1.c1) AS c1
              Aggregate: groupBy=[[__stage_1.c0]], aggr=[[median(__stage_1.c1)]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_distinct_shuffles_by_the_distinct_columns(small):
    # DISTINCT is a grouping without aggregates: shuffled by the column.
    assert_explain(
        small,
        "SELECT DISTINCT s FROM t",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0
              Aggregate: groupBy=[[__stage_1.c0]], aggr=[[]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[t.s AS c0]], aggr=[[]]
              Projection: t.s
                TableScan: t
        """,
    )


def test_distinct_over_several_columns(small):
    run(small, "SELECT DISTINCT k, s FROM t")


def test_count_distinct_global(small):
    g = run(small, "SELECT count(DISTINCT s) AS ds, count(DISTINCT k) AS dk, count(*) AS n FROM t")
    check_well_formed(g)
    assert g.stages[0].num_tasks == 4


def test_count_distinct_grouped(small):
    g = run(small, "SELECT k, count(DISTINCT s) AS ds FROM t GROUP BY k")
    check_well_formed(g)
    assert SHUFFLE in kinds(g)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT s, sum(d) AS sd, avg(d) AS ad, min(d) AS lo, max(d) AS hi FROM t GROUP BY s",
        "SELECT sum(d) AS sd, avg(d) AS ad FROM t",
        "SELECT s, sum(v) AS sv, avg(v) AS av, count(v) AS cv FROM t GROUP BY s",
        "SELECT avg(v) AS av, avg(k) AS ak, stddev(v) AS sd, var_samp(v) AS vs FROM t",
        "SELECT k, avg(d) AS ad, avg(v) AS av FROM t GROUP BY k",
        "SELECT bool_and(v > 2) AS ba, bool_or(v > 10) AS bo FROM t",
    ],
    ids=[
        "decimal-grouped",
        "decimal-global",
        "float-grouped",
        "float-global-stats",
        "avg-grouped",
        "bool",
    ],
)
def test_decimal_and_float_aggregates(small, sql):
    g = run(small, sql)
    check_well_formed(g)


def test_decimal_avg_keeps_type(small):
    ctx, oracle = small
    sql = "SELECT s, avg(d) AS ad FROM t GROUP BY s"
    got = ctx.sql(sql).to_arrow_table()
    assert got.schema == oracle.sql(sql).to_arrow_table().schema
    assert pa.types.is_decimal(got.schema.field("ad").type)
