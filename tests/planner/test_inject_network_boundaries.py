"""Stage cutting (:mod:`distfusion.planner.inject_network_boundaries`): leaf stages, sorts, limits, windows, unions, empty inputs, task counts.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distfusion.stages import COALESCE, SHUFFLE
from tests.planner.helpers import (
    LARGE,
    SMALL,
    TABLES,
    T,
    assert_explain,
    check_well_formed,
    kinds,
    make_contexts,
    run,
)


def test_leaf_stage_splits_work_units_across_tasks(small):
    # Filter and projection pipeline into the leaf; its output is gathered by the head.
    assert_explain(
        small,
        "SELECT k, v FROM t WHERE v > 2",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Filter: t.v > Float64(2)
                Projection: t.k, t.v
                  TableScan: t
        """,
    )


def test_tasks_capped_by_workers_and_work_units(runtimes):
    ctx, oracle = make_contexts(runtimes[2], TABLES, tasks=4)
    g = run((ctx, oracle), "SELECT count(*) FROM t")
    assert g.stages[0].num_tasks == 2  # 2 workers
    ctx, oracle = make_contexts(runtimes[4], {"t": (T, 6)}, tasks=4)
    g = run((ctx, oracle), "SELECT count(*) FROM t")
    assert g.stages[0].num_tasks == 2  # 2 work units


def test_sort_per_task_then_merge_on_coalesce(small):
    # Each task sorts its rows; the head merges them.
    assert_explain(
        small,
        "SELECT k, v, s FROM t ORDER BY v DESC NULLS LAST, k",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Sort: __stage_1.c1 DESC NULLS LAST, __stage_1.c0 ASC NULLS LAST
              TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1, t.s AS c2
              Sort: t.v DESC NULLS LAST, t.k ASC NULLS LAST
                Projection: t.k, t.v, t.s
                  TableScan: t
        """,
    )


def test_top_k_per_task_then_again_after_coalesce(small):
    # Each task keeps its top 3; the head takes the top 3 of those.
    assert_explain(
        small,
        "SELECT k, v FROM t ORDER BY v DESC NULLS LAST LIMIT 3",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Limit: skip=0, fetch=3
              Sort: __stage_1.c1 DESC NULLS LAST
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Limit: skip=0, fetch=3
                Sort: t.v DESC NULLS LAST
                  Projection: t.k, t.v
                    TableScan: t
        """,
    )


def test_top_k_with_offset(small):
    g = run(small, "SELECT k, v FROM t ORDER BY v LIMIT 2 OFFSET 3", ordered=True)
    # Each task keeps offset + count rows; the offset applies once, after the merge.
    assert "fetch=5" in g.stages[0].plan_text and "skip=3" in g.head.plan_text


def test_sort_after_aggregate(small):
    g = run(small, "SELECT s, sum(v) AS sv FROM t GROUP BY s ORDER BY sv DESC, s", ordered=True)
    check_well_formed(g)
    assert kinds(g) == [COALESCE, SHUFFLE]


def test_limit_without_order_by(small):
    ctx, _ = small
    df = ctx.sql("SELECT k, v, s FROM t LIMIT 5")
    g = df.stage_graph()
    check_well_formed(g)
    leaf, head = g.stages
    assert leaf.num_tasks == 4 and "Limit" in leaf.plan_text and "Limit" in head.plan_text
    got = df.to_arrow_table()
    # Which rows is unspecified; how many is not, and each is a row of t.
    assert got.num_rows == 5
    table_rows = T.select(["k", "v", "s"]).to_pylist()
    for row in got.to_pylist():
        assert row in table_rows
    assert ctx.sql("SELECT k FROM t LIMIT 100").to_arrow_table().num_rows == 12
    assert ctx.sql("SELECT k FROM t LIMIT 0").to_arrow_table().num_rows == 0


def test_limit_with_offset_without_order_by(small):
    ctx, _ = small
    got = ctx.sql("SELECT k, v FROM t LIMIT 4 OFFSET 10").to_arrow_table()
    assert got.num_rows == 2
    table_rows = T.select(["k", "v"]).to_pylist()
    assert all(r in table_rows for r in got.to_pylist())


def test_window_with_partition_by_shuffles_by_its_keys(small):
    # Shuffled once, by the PARTITION BY key (k, column 0 of the producer).
    assert_explain(
        small,
        "SELECT k, v, sum(v) OVER (PARTITION BY k) AS sv FROM t",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, __stage_1.c1, sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING AS c2
              Projection: __stage_1.c0, __stage_1.c1, sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                WindowAggr: windowExpr=[[sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_ranking_windows_with_partition_and_order(small):
    g = run(
        small,
        "SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v) AS rn, "
        "rank() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM t",
    )
    check_well_formed(g)
    assert SHUFFLE in kinds(g)


def test_window_on_string_partition_key(small):
    g = run(
        small,
        "SELECT s, v, avg(v) OVER (PARTITION BY s) AS av, count(*) OVER (PARTITION BY s) AS n FROM t",
    )
    check_well_formed(g)


def test_window_without_partition_by_coalesces(small):
    # No PARTITION BY: every row in one task, no shuffle.
    assert_explain(
        small,
        "SELECT k, v, rank() OVER (ORDER BY v DESC) AS r, sum(v) OVER () AS total FROM t",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW AS c2, sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING AS c3
              Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW, sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                WindowAggr: windowExpr=[[sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING]]
                  Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
                    WindowAggr: windowExpr=[[rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW]]
                      TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_windows_with_different_partitions_coalesce(small):
    g = run(
        small,
        "SELECT k, s, sum(v) OVER (PARTITION BY k) AS a, sum(v) OVER (PARTITION BY s) AS b FROM t",
    )
    check_well_formed(g)


def test_union_all_inputs_side_by_side_in_one_stage(small):
    # Each input shuffled round-robin into the union's stage.
    assert_explain(
        small,
        "SELECT k FROM t UNION ALL SELECT CAST(k AS BIGINT) FROM u",
        """
        Stage 4 [head, 1 task]
          <- coalesce from stage 3 (4 tasks) as __stage_3
            TableScan: __stage_3
        Stage 3 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
          <- shuffle from stage 2 (4 tasks) as __stage_2
            Union
              TableScan: __stage_1
              TableScan: __stage_2
        Stage 2 [leaf, 4 tasks]  output: shuffle (round-robin) -> 4 partitions
          <- scan u (4 work units, per task [1, 1, 1, 1])
            Projection: CAST(u.k AS Int64) AS c0
              Projection: u.k
                TableScan: u
        Stage 1 [leaf, 4 tasks]  output: shuffle (round-robin) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0
              TableScan: t
        """,
    )


def test_union_distinct(small):
    g = run(small, "SELECT k FROM t UNION SELECT k FROM u")
    check_well_formed(g)
    # The distinct runs after the union, shuffled by the column.
    assert kinds(g).count(SHUFFLE) == 3


def test_union_all_of_three_with_aggregate(small):
    run(
        small,
        "SELECT s, count(*) AS n FROM (SELECT s FROM t UNION ALL SELECT w FROM u "
        "UNION ALL SELECT 'z') GROUP BY s",
    )


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM e",
        "SELECT k, sum(x) AS sx FROM e GROUP BY k",
        "SELECT count(*) AS n, sum(x) AS sx, avg(x) AS ax, min(k) AS lo FROM e",
        "SELECT * FROM t WHERE v > 1000",
        "SELECT k, count(*) AS n, sum(v) AS sv FROM t WHERE v > 1000 GROUP BY k",
        "SELECT count(*) AS n, sum(v) AS sv, avg(d) AS ad, max(s) AS ms FROM t WHERE v > 1000",
        "SELECT count(DISTINCT s) AS n FROM t WHERE v > 1000",
        "SELECT t.k, t.v, e.x FROM t JOIN e ON t.k = e.k",
        "SELECT t.k, t.v, e.x FROM t LEFT JOIN e ON t.k = e.k",
        "SELECT t.k, e.x FROM e RIGHT JOIN t ON t.k = e.k",
        "SELECT t.k, e.x FROM t FULL JOIN e ON t.k = e.k",
        "SELECT * FROM t WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.k = t.k)",
        "SELECT * FROM t WHERE k IN (SELECT k FROM e)",
        "SELECT t.k, u.w FROM t JOIN u ON t.k = u.k WHERE t.v > 1000",
        "SELECT k, v FROM t WHERE v > 1000 ORDER BY v LIMIT 3",
        "SELECT k, sum(v) OVER (PARTITION BY k) AS sv FROM t WHERE v > 1000",
        "SELECT k FROM e UNION ALL SELECT k FROM t WHERE v > 1000",
    ],
)
@pytest.mark.parametrize("contexts", ["small", "large"])
def test_empty_inputs(request, contexts, sql):
    g = run(request.getfixturevalue(contexts), sql)
    check_well_formed(g)


def test_global_aggregate_over_empty_input_gives_one_row(small):
    ctx, _ = small
    got = ctx.sql("SELECT count(*) AS n, sum(v) AS sv FROM t WHERE v > 1000").to_pylist()
    assert got == [{"n": 0, "sv": None}]


def test_table_registered_with_no_rows_is_one_work_unit(small):
    ctx, _ = small
    (stage,) = ctx.sql("SELECT * FROM e").stage_graph().stages
    assert stage.num_tasks == 1 and len(stage.scans[0].source.units) == 1


def test_cte_and_nested_aggregate(small):
    run(
        small,
        "WITH g AS (SELECT k, sum(v) AS sv FROM t GROUP BY k) "
        "SELECT g.k, g.sv, u.w FROM g LEFT JOIN u ON g.k = u.k",
    )


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_fewer_workers(runtimes, workers):
    contexts = make_contexts(runtimes[workers], TABLES, tasks=None)
    for sql in (
        "SELECT k, sum(v) AS sv FROM t GROUP BY k",
        "SELECT t.k, u.w FROM t FULL JOIN u ON t.k = u.k",
        "SELECT k, v FROM t ORDER BY v LIMIT 4",
    ):
        g = run(contexts, sql, ordered="ORDER BY" in sql)
        check_well_formed(g)
        assert max(s.num_tasks for s in g.stages) <= workers


_keys = st.one_of(st.none(), st.integers(-3, 3))


_rows = st.lists(st.tuples(_keys, st.one_of(st.none(), st.integers(-100, 100))), max_size=30)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    left=_rows,
    right=_rows,
    workers=st.integers(1, 4),
    rows_per_unit=st.integers(1, 8),
    broadcast=st.booleans(),
    key_type=st.sampled_from([pa.int32(), pa.int64(), pa.int8()]),
)
def test_random_tables_match_single_node(
    runtimes, left, right, workers, rows_per_unit, broadcast, key_type
):
    a = pa.table(
        {
            "k": pa.array([r[0] for r in left], pa.int64()),
            "x": pa.array([r[1] for r in left], pa.int64()),
        }
    )
    b = pa.table(
        {
            "k": pa.array([r[0] for r in right], key_type),
            "y": pa.array([r[1] for r in right], pa.int64()),
        }
    )
    contexts = make_contexts(
        runtimes[workers],
        {"a": (a, rows_per_unit), "b": (b, rows_per_unit)},
        tasks=workers,
        **(SMALL if broadcast else LARGE),
    )
    for sql in (
        "SELECT k, count(*) AS n, count(x) AS nx, sum(x) AS sx, min(x) AS lo, max(x) AS hi, avg(x) AS ax "
        "FROM a GROUP BY k",
        "SELECT a.k, a.x, b.y FROM a JOIN b ON a.k = b.k",
        "SELECT a.k, a.x, b.k AS bk, b.y FROM a FULL JOIN b ON a.k = b.k",
        "SELECT b.k, count(*) AS n, sum(a.x) AS sx FROM a JOIN b ON a.k = b.k GROUP BY b.k",
    ):
        check_well_formed(run(contexts, sql))


def test_explain_snapshot(runtimes):
    ctx, _ = make_contexts(runtimes[2], {"t": (T, 6)}, tasks=2)
    text = ctx.sql("SELECT k, count(*) AS n FROM t WHERE v > 2 GROUP BY k").explain()
    assert text == textwrap.dedent(
        """\
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (2 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [2 tasks]  output: coalesce
          <- shuffle from stage 1 (2 tasks) as __stage_1
            Projection: __stage_1.c0, sum(__stage_1.c1) AS c1
              Projection: __stage_1.c0, CAST(sum(__stage_1.c1) AS Int64)
                Aggregate: groupBy=[[__stage_1.c0]], aggr=[[sum(__stage_1.c1)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 2 tasks]  output: shuffle (hash ['c0']) -> 2 partitions
          <- scan t (2 work units, per task [1, 1])
            Aggregate: groupBy=[[t.k AS c0]], aggr=[[count(Int64(1)) AS c1]]
              Projection: t.k
                Filter: t.v > Float64(2)
                  Projection: t.k, t.v
                    TableScan: t"""
    )
