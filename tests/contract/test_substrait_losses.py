"""A query whose meaning Substrait cannot carry gives DataFusion's answer anyway.

DataFusion 55's Substrait producer drops some properties without an error
(``IGNORE NULLS``, ``DISTINCT`` and ``FILTER`` of window functions, ``RANGE``
frames with an offset: distfusion.planner.detect_substrait_losses lists them,
tests/planner/test_detect_substrait_losses.py shows each on DataFusion alone).
``first_value(val ORDER BY o) IGNORE NULLS`` came back as ``first_value(val
ORDER BY o)``, NULL where DataFusion says 1. Such a query runs whole on the
coordinator with DataFusion's own plan, and ``explain()`` says so; the same
query without the property is still distributed. The check reads the plan's
structure: a column named after the property (DataFusion's default name for
an unaliased ``first_value(...) IGNORE NULLS``) does not fool it either way.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from tests.compare import assert_same_result

F = pa.table(
    {
        "k": [1, 1, 1, 1, 2, 2, 2, 3, 3, 3],
        "val": [None, 1, 2, None, None, None, 5, 7, None, 7],
        "o": [1, 2, 3, 4, 1, 2, 3, 1, 2, 3],
        "s": ["a", None, "c", "d", "e", "f", None, "h", "i", "j"],
    }
)

# name -> (SQL, a word the coordinator_only() reason names). Each answer differs
# from DataFusion's when the property is dropped (on F).
LOSSY = {
    "first-value-aggregate": (
        "SELECT k, first_value(val ORDER BY o) IGNORE NULLS AS v FROM f GROUP BY k",
        "IGNORE NULLS",
    ),
    "first-value-aggregate-unaliased": (
        "SELECT k, first_value(val ORDER BY o) IGNORE NULLS FROM f GROUP BY k",
        "IGNORE NULLS",
    ),
    "last-value-aggregate-unaliased": (
        "SELECT k, last_value(val ORDER BY o) IGNORE NULLS FROM f GROUP BY k",
        "IGNORE NULLS",
    ),
    "last-value-aggregate": (
        "SELECT k, last_value(val ORDER BY o DESC) IGNORE NULLS AS v FROM f GROUP BY k",
        "IGNORE NULLS",
    ),
    "array-agg-ignore-nulls": (
        "SELECT k, array_agg(val ORDER BY o) IGNORE NULLS AS v FROM f GROUP BY k",
        "IGNORE NULLS",
    ),
    "first-value-window": (
        "SELECT k, o, first_value(val) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) AS v FROM f",
        "IGNORE NULLS",
    ),
    "last-value-window-unaliased": (
        "SELECT k, o, last_value(val) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) FROM f",
        "IGNORE NULLS",
    ),
    "nth-value-window": (
        "SELECT k, o, nth_value(val, 2) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) AS v FROM f",
        "IGNORE NULLS",
    ),
    "lag-window": (
        "SELECT k, o, lag(val) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) AS v FROM f",
        "IGNORE NULLS",
    ),
    "lead-window": (
        "SELECT k, o, lead(val) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) AS v FROM f",
        "IGNORE NULLS",
    ),
    "count-distinct-window": (
        "SELECT k, o, count(DISTINCT val) OVER (PARTITION BY k) AS v FROM f",
        "DISTINCT",
    ),
    "sum-distinct-window-ordered": (
        "SELECT k, o, sum(DISTINCT val) OVER (PARTITION BY k ORDER BY o) AS v FROM f",
        "DISTINCT",
    ),
    "filter-window": (
        "SELECT k, o, sum(val) FILTER (WHERE o > 1) OVER (PARTITION BY k) AS v FROM f",
        "FILTER",
    ),
    "range-preceding": (
        "SELECT k, o, sum(val) OVER (PARTITION BY k ORDER BY o "
        "RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) AS v FROM f",
        "RANGE",
    ),
    "range-following": (
        "SELECT k, o, count(val) OVER (PARTITION BY k ORDER BY o "
        "RANGE BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING) AS v FROM f",
        "RANGE",
    ),
    "range-desc": (
        "SELECT k, o, sum(val) OVER (PARTITION BY k ORDER BY o DESC "
        "RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) AS v FROM f",
        "RANGE",
    ),
    "in-a-scalar-subquery": (
        "SELECT k, val - (SELECT first_value(val ORDER BY o) IGNORE NULLS FROM f) AS d FROM f",
        "subquery",
    ),
    "in-an-in-subquery-of-a-disjunction": (
        "SELECT k, o FROM f WHERE o = 3 OR val IN "
        "(SELECT first_value(val ORDER BY o) IGNORE NULLS AS x FROM f GROUP BY k)",
        "IGNORE NULLS",
    ),
}

# Carried through Substrait: distributed, and DataFusion's answer.
CARRIED = {
    "respect-nulls": "SELECT k, first_value(val ORDER BY o) AS v FROM f GROUP BY k",
    "named-like-a-lossy-one": (
        'SELECT k, first_value(val ORDER BY o) AS "first_value(f.val) IGNORE NULLS" '
        "FROM f GROUP BY k"
    ),
    "aggregate-filter": "SELECT k, sum(val) FILTER (WHERE o > 1) AS v FROM f GROUP BY k",
    "aggregate-order": "SELECT k, string_agg(s, ',' ORDER BY o DESC) AS v FROM f GROUP BY k",
    "aggregate-distinct": "SELECT k, count(DISTINCT val) AS v FROM f GROUP BY k",
    "rows-frame": (
        "SELECT k, o, sum(val) OVER (PARTITION BY k ORDER BY o "
        "ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS v FROM f"
    ),
    "range-unbounded": (
        "SELECT k, o, sum(val) OVER (PARTITION BY k ORDER BY o "
        "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS v FROM f"
    ),
    "scalar-subquery": "SELECT k, val - (SELECT max(val) FROM f) AS d FROM f",
}


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    oracle.register_record_batches("f", [F.to_batches()])
    ctx = DistributedContext(
        runtime=runtime,
        config=DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0),
    )
    ctx.register_table("f", F, max_rows_per_unit=2)
    return ctx, oracle


@pytest.mark.parametrize("name", list(LOSSY))
def test_what_substrait_drops_gives_datafusions_answer(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    sql, named = LOSSY[name]
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    assert named in df.coordinator_only()
    assert df.explain().startswith("coordinator only (single-node DataFusion)")
    with pytest.raises(PlanningError, match="runs on the coordinator"):
        df.stage_graph()
    assert runtime.executed == [], "no stage graph was handed to the runtime"


@pytest.mark.parametrize("name", list(CARRIED))
def test_what_substrait_carries_is_still_distributed(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    sql = CARRIED[name]
    df = ctx.sql(sql)
    assert df.coordinator_only() is None
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    assert len(runtime.executed) == 1
