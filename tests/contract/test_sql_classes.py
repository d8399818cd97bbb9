"""SQL beyond TPC-H that single-node DataFusion answers: distfusion gives the same answer.

Each query class of issue #15 is either distributed (the planner cuts it into
stages) or, where DataFusion's Substrait producer or consumer cannot carry the
plan, run whole on the coordinator by single-node DataFusion, with the reason in
``explain()`` (one mechanism: ``DistributedDataFrame.coordinator_only``). Every
runtime, three tasks per stage where it has them, no broadcasts (forced shuffles).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from tests.compare import assert_same_result, is_ordered

T = pa.table(
    {
        "a": pa.array([1, 2, 3, None, 2, 5], pa.int64()),
        "b": ["x", "y", None, "x", "z", "y"],
        "l": pa.array([[1, 2], [3], None, [], [4, 5], [6]], pa.list_(pa.int64())),
    }
)
U = pa.table({"a": pa.array([2, 3, 4, None], pa.int64()), "c": pa.array([10.0, 20.0, None, 5.0])})

DISTRIBUTED = {
    "exists-uncorrelated": "SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u WHERE c > 1)",
    "exists-uncorrelated-empty": "SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u WHERE c > 100)",
    "not-exists-uncorrelated": "SELECT a FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE c > 100)",
    "exists-constant": "SELECT 1 AS x WHERE EXISTS (SELECT 1)",
    "less-than-all": "SELECT a FROM t WHERE a < ALL (SELECT a FROM u WHERE a IS NOT NULL)",
    "join-using": "SELECT * FROM t JOIN u USING (a)",
    "natural-join": "SELECT * FROM t NATURAL JOIN u",
    "log-one-argument": "SELECT a, log(c) AS l, log(a) AS la FROM u",
    "log-two-arguments": "SELECT log(2, c) AS l FROM u",
    "lateral": "SELECT t.a, x FROM t, LATERAL (SELECT u.c AS x FROM u WHERE u.a = t.a)",
}
"""Queries the planner now cuts into stages (they were refused before)."""

COORDINATOR = {
    "greater-than-any": "SELECT a FROM t WHERE a > ANY (SELECT a FROM u)",
    "equal-any": "SELECT a FROM t WHERE a = ANY (SELECT a FROM u)",
    "with-recursive": (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) "
        "SELECT n FROM r"
    ),
    "recursive-over-table": (
        "WITH RECURSIVE r(n, d) AS (SELECT a, 0 FROM u WHERE a IS NOT NULL "
        "UNION ALL SELECT n + 1, d + 1 FROM r WHERE d < 2) SELECT n, d FROM r"
    ),
    "left-join-using": "SELECT a, b, c FROM t LEFT JOIN u USING (a)",
    "unnest-column": "SELECT a, unnest(l) AS x FROM t",
    "unnest-table": "SELECT * FROM unnest([1, 2, 3])",
    "generate-series": "SELECT * FROM generate_series(1, 3)",
    "range": "SELECT * FROM range(5)",
    "table-function-join": "SELECT t.a, g.value FROM t JOIN generate_series(1, 3) g ON t.a = g.value",
    "information-schema": "SELECT table_name FROM information_schema.tables WHERE table_name = 't'",
    "describe": "DESCRIBE t",
}
"""Queries that run whole on the coordinator (what blocks them is the reason)."""


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    oracle.register_record_batches("t", [T.to_batches()])
    oracle.register_record_batches("u", [U.to_batches()])
    config = DistributedConfig(
        tasks_per_stage=workers, broadcast_threshold_bytes=0, runtime_filter_bytes=0
    )
    ctx = DistributedContext(runtime=runtime, config=config)
    ctx.register_table("t", T, max_rows_per_unit=2)
    ctx.register_table("u", U, max_rows_per_unit=1)
    return ctx, oracle


def _check(ctx, oracle, sql):
    df = ctx.sql(sql)
    expected = oracle.sql(sql).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, is_ordered(sql))
    return df


@pytest.mark.parametrize("name", list(DISTRIBUTED))
def test_distributed(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    df = _check(ctx, oracle, DISTRIBUTED[name])
    assert df.coordinator_only() is None
    # A plan of one stage runs in place, as single-node DataFusion on the coordinator.
    ran = 0 if len(df.stage_graph().stages) == 1 else 1
    assert len(runtime.executed) == ran, "the query ran as a stage graph"


@pytest.mark.parametrize("name", list(COORDINATOR))
def test_coordinator_fallback(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    df = _check(ctx, oracle, COORDINATOR[name])
    reason = df.coordinator_only()
    assert reason, "the query says why it runs on the coordinator"
    assert df.explain().startswith(f"coordinator only (single-node DataFusion): {reason}")
    with pytest.raises(PlanningError, match="runs on the coordinator"):
        df.stage_graph()
    assert runtime.executed == [], "no stage graph was handed to the runtime"


def test_fallback_reasons_name_the_cause(runtime, workers):
    ctx, _ = _contexts(runtime, workers)
    assert "RecursiveQuery" in ctx.sql(COORDINATOR["with-recursive"]).coordinator_only()
    assert "Unnest" in ctx.sql(COORDINATOR["unnest-column"]).coordinator_only()
    assert "generate_series" in ctx.sql(COORDINATOR["generate-series"]).coordinator_only()
    assert "mark" in ctx.sql(COORDINATOR["greater-than-any"]).coordinator_only()


def test_datafusions_own_errors_are_still_errors(runtime, workers):
    ctx, _ = _contexts(runtime, workers)
    with pytest.raises(PlanningError, match="nope"):
        ctx.sql("SELECT * FROM nope")
    with pytest.raises(PlanningError, match="must be an INTEGER"):
        ctx.sql("SELECT * FROM generate_series('a')")
