"""``NOT IN`` through Substrait (:mod:`distfusion.planner.rewrite_null_aware_anti_join`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest

from tests.planner.helpers import (
    run,
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
