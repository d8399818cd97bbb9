"""Scalar subqueries as stages of their own (:mod:`distfusion.planner.plan_subqueries`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest

from distfusion.stages import BROADCAST
from tests.planner.helpers import (
    assert_explain,
    check_well_formed,
    run,
)


def test_scalar_subquery_and_correlated_filter(small):
    run(small, "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)")
    run(small, "SELECT k, v FROM t t1 WHERE v > (SELECT avg(v) FROM t t2 WHERE t2.k = t1.k)")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)",
        "SELECT k, v - (SELECT max(v) FROM t) AS d FROM t",
        "SELECT k, v FROM t WHERE v > (SELECT avg(t2.v) FROM t t2 WHERE t2.v < (SELECT max(t3.v) FROM t t3))",
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t) AND k < (SELECT max(k) FROM u)",
        "SELECT k FROM t WHERE v > (SELECT min(x) FROM e)",  # an empty subquery: NULL
    ],
)
def test_uncorrelated_scalar_subquery_is_a_stage_of_its_own(small, sql):
    # The outer scan keeps its four tasks; each reads the subquery's one row as
    # a broadcast (the subquery's own scan is distributed as any query's).
    g = run(small, sql)
    check_well_formed(g)
    readers = [s for s in g.stages if "(<subquery>)" in s.plan_text]
    assert max(s.num_tasks for s in readers) == 4, g.render()
    broadcasts = sum(i.boundary == BROADCAST for s in readers for i in s.inputs)
    assert broadcasts == sql.count("(SELECT"), g.render()


def test_uncorrelated_scalar_subquery_plan(small):
    # The subquery is a query of its own, gathered into one task; the outer
    # scan's four tasks read its one row as a broadcast.
    assert_explain(
        small,
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)",
        """
        Stage 4 [head, 1 task]
          <- coalesce from stage 3 (4 tasks) as __stage_3
            TableScan: __stage_3
        Stage 3 [4 tasks]  output: coalesce
          <- broadcast from stage 2 (1 tasks) as __stage_2
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Filter: t.v > (<subquery>)
                Subquery:
                  TableScan: __stage_2
                Projection: t.k, t.v
                  TableScan: t
        Stage 2 [1 task]  output: broadcast -> 4 tasks
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: CAST(CAST(sum(__stage_1.c0) AS Float64) / CAST(sum(__stage_1.c1) AS Float64) AS Float64) AS c0
              Aggregate: groupBy=[[]], aggr=[[sum(__stage_1.c0), sum(__stage_1.c1)]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[]], aggr=[[sum(t.v) AS c0, count(t.v) AS c1]]
              Projection: t.v
                TableScan: t
        """,
    )
