"""Eager aggregation below a join (:mod:`distfusion.planner.aggregate_before_join`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest

from distfusion.planner.aggregate_before_join import aggregate_before_joins
from tests.planner.helpers import LARGE, D, F, apply_pass, check_well_formed, make_contexts, run

# f keeps keys below 150 only: d's keys 150..199 match nothing (a count of 0, NULL min/max).
MATCHED = "(SELECT * FROM f WHERE k < 150 AND x % 3 = 0)"


def _contexts(runtimes):
    return make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50)}, **LARGE)


def _rewritten(contexts, sql: str) -> tuple[str, str]:
    return apply_pass(
        contexts,
        sql,
        lambda plan, oracle: aggregate_before_joins(plan, oracle, contexts[0].sources),
    )


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT d.c, count(f.x) AS n, min(f.x) AS lo, max(f.x) AS hi "
        f"FROM d LEFT JOIN {MATCHED} f ON d.k = f.k GROUP BY d.c",
        # TPC-H Q13's shape: a count per left row, then its distribution.
        f"SELECT n, count(*) AS rows_ FROM (SELECT d.k, count(f.x) AS n "
        f"FROM d LEFT JOIN {MATCHED} f ON d.k = f.k GROUP BY d.k) t GROUP BY n",
    ],
)
def test_the_many_side_is_aggregated_by_its_key_before_the_join(runtimes, sql):
    contexts = _contexts(runtimes)
    before, after = _rewritten(contexts, sql)  # answers as DataFusion does
    assert before != after
    join = after.index(" Join: ")
    assert "Aggregate: groupBy=[[f.k]]" in after[join:], after
    # Distributed: the same answer (compared by run) over the rewritten plan.
    graph = run(contexts, sql)
    check_well_formed(graph)
    (scan,) = [s for s in graph.stages if any(c.source.name == "f" for c in s.scans)]
    assert "Aggregate: groupBy=[[f.k" in scan.plan_text, graph.render()


def test_an_inner_join_is_aggregated_before_too(runtimes):
    sql = "SELECT d.c, count(f.x) AS n, max(f.x) AS hi FROM d JOIN f ON d.k = f.k GROUP BY d.c"
    before, after = _rewritten(_contexts(runtimes), sql)  # answers as DataFusion does
    assert "Aggregate: groupBy=[[f.k]]" in after[after.index("Inner Join: ") :], after


@pytest.mark.parametrize(
    "sql",
    [
        # a measure over the left side's columns
        "SELECT d.c, count(d.k) AS n FROM d LEFT JOIN f ON d.k = f.k GROUP BY d.c",
        # count(*) counts joined rows, NULL-extended ones too
        "SELECT d.c, count(*) AS n FROM d LEFT JOIN f ON d.k = f.k GROUP BY d.c",
        # DISTINCT, and a sum (its type would widen)
        "SELECT d.c, count(DISTINCT f.x) AS n FROM d LEFT JOIN f ON d.k = f.k GROUP BY d.c",
        "SELECT d.c, sum(f.x) AS s FROM d LEFT JOIN f ON d.k = f.k GROUP BY d.c",
        # a condition beyond the keys, and a full join
        "SELECT d.c, count(f.x) AS n FROM d LEFT JOIN f ON d.k = f.k AND f.x > d.k GROUP BY d.c",
        "SELECT d.c, count(f.x) AS n FROM d FULL JOIN f ON d.k = f.k GROUP BY d.c",
        # a selective left side: its keys filter f before it moves instead
        "SELECT d.k, count(f.x) AS n FROM (SELECT * FROM d WHERE c = 'c3') d "
        "LEFT JOIN f ON f.k = d.k GROUP BY d.k",
        # the right side is the small one: few rows per key to fold
        "SELECT f.x, count(d.c) AS n FROM f LEFT JOIN d ON f.k = d.k GROUP BY f.x",
    ],
)
def test_no_eager_aggregation_where_it_could_change_the_answer_or_saves_nothing(runtimes, sql):
    before, after = _rewritten(_contexts(runtimes), sql)
    assert before == after
