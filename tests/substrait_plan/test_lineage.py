"""Column lineage (:mod:`distfusion.substrait_plan.lineage`) on DataFusion's own plans."""

from __future__ import annotations

import pytest

from distfusion.substrait_plan.lineage import arity, read_column
from tests.planner.helpers import substrait_of


def _root(ctx, sql):
    plan, _ = substrait_of(ctx, sql)
    return plan.relations[0].root.input


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # through a filter and a projection: t's column k (t is k, v, s)
        ("SELECT s, k FROM t WHERE v > 2", [("t", 2), ("t", 0)]),
        # either side of an inner or outer join, past a sort and a limit
        (
            "SELECT u.w, t.s FROM t JOIN u ON t.k = u.k ORDER BY t.s LIMIT 2",
            [("u", 1), ("t", 2)],
        ),
        ("SELECT u.k, t.v FROM t LEFT JOIN u ON t.k = u.k", [("u", 0), ("t", 1)]),
        # a semi join keeps its own side's columns; an aggregate its grouping keys
        ("SELECT k FROM t WHERE k IN (SELECT k FROM u)", [("t", 0)]),
        ("SELECT s, count(*) AS n FROM t GROUP BY s", [("t", 2), None]),
        # a computed column comes from no read
        ("SELECT k + 1 AS k1, s FROM t", [None, ("t", 2)]),
    ],
)
def test_read_column_follows_columns_that_pass_unchanged(ctx, sql, expected):
    root = _root(ctx, sql)
    assert arity(root) == len(expected)
    assert [read_column(root, c) for c in range(len(expected))] == expected
