"""Spark SQL join hints on the drop-in: Spark's answers, and Spark's choice of join.

Oracle: ``spark.sql(query)`` on the same session, over the TPC-H views. Both
engines are set never to broadcast by size (Spark's
``spark.sql.autoBroadcastJoinThreshold`` -1; distfusion's
``broadcast_threshold_bytes`` and ``max_broadcast_bytes`` 0), so a broadcast
is a followed hint. For each hinted query: the answer is Spark's (names,
types, values), the query runs natively, and distfusion broadcasts the join
exactly when Spark's physical plan is a broadcast join: the hint named the
same relation under Spark's resolution rules, and both ignore a hint the join
type cannot follow. The planner side of the same rules, without Spark, is
tests/planner/test_join_hints.py.
"""

from __future__ import annotations

import contextlib

import pytest

import distfusion.spark
from distfusion import DistributedConfig
from distfusion.stages import BROADCAST, COALESCE, SHUFFLE
from tests.compare import assert_same_result, is_ordered

CONFIG = DistributedConfig(
    tasks_per_stage=2,  # a leaf stage of several tasks, however small the table
    in_place_bytes=0,
    broadcast_threshold_bytes=0,
    max_broadcast_bytes=0,
    replicate_scan_bytes=0,
    runtime_filter_bytes=0,
)

SUPPLIERS = (
    "SELECT {hint} n.n_name, count(*) AS c FROM supplier s "
    "JOIN nation n ON s.s_nationkey = n.n_nationkey GROUP BY n.n_name ORDER BY n.n_name"
)
ORDERS = (
    "SELECT {hint} c.c_custkey, count(o.o_orderkey) AS c FROM customer c "
    "LEFT JOIN orders o ON c.c_custkey = o.o_custkey "
    "GROUP BY c.c_custkey ORDER BY c DESC, c.c_custkey LIMIT 10"
)
COUNTS = (
    "SELECT {hint} c.c_mktsegment, sum(x.c) AS c FROM customer c JOIN "
    "(SELECT o_custkey, count(*) AS c FROM orders GROUP BY o_custkey) x "
    "ON c.c_custkey = x.o_custkey GROUP BY c.c_mktsegment ORDER BY c.c_mktsegment"
)
QUERIES = {SUPPLIERS: "suppliers", ORDERS: "orders", COUNTS: "counts"}

# (query, hint, how distfusion's join reads its other side: a broadcast, a
# broadcast to the one task of its probe side (a coalesce), or both shuffled);
# Spark broadcasts in the first two cases and only then
HINTED = [
    (SUPPLIERS, "", SHUFFLE),
    (SUPPLIERS, "/*+ BROADCAST(n) */", BROADCAST),
    (SUPPLIERS, "/*+ MAPJOIN(s) */", COALESCE),  # nation is one file: one task
    (SUPPLIERS, "/*+ BROADCAST(nation) */", SHUFFLE),  # aliased n: the table name names nothing
    (SUPPLIERS, "/*+ MERGE(s), BROADCAST(n) */", BROADCAST),  # BROADCAST outranks MERGE
    (SUPPLIERS, "/*+ SHUFFLE_HASH(n) */", SHUFFLE),
    (ORDERS, "/*+ BROADCAST(c) */", SHUFFLE),  # the preserved side of a LEFT JOIN
    (ORDERS, "/*+ BROADCASTJOIN(o) */", BROADCAST),
    (COUNTS, "/*+ BROADCAST(x) */", BROADCAST),  # a derived table
    (COUNTS, "/*+ REPARTITION(3), COALESCE(1), REBALANCE */", SHUFFLE),
]


@contextlib.contextmanager
def _no_size_broadcasts(spark):
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)


def _spark_broadcasts(spark, sql: str, capsys) -> bool:
    """Whether Spark's physical plan of ``sql`` joins by broadcast (its explain text)."""
    capsys.readouterr()
    spark.sql(sql).explain()
    plan = capsys.readouterr().out
    assert "Join" in plan, plan
    return "BroadcastHashJoin" in plan or "BroadcastNestedLoopJoin" in plan


# The default run keeps one case of each rule; the others are slow (10-20 s each).
_FAST = {"", "/*+ BROADCAST(n) */", "/*+ BROADCAST(c) */", "/*+ MERGE(s), BROADCAST(n) */"}


@pytest.mark.parametrize(
    ("query", "hint", "reads"),
    [pytest.param(q, h, r, marks=() if h in _FAST else pytest.mark.slow) for q, h, r in HINTED],
    ids=[f"{QUERIES[q]}: {h or 'no hint'}" for q, h, _ in HINTED],
)
def test_hinted_join_answers_and_distributes_as_spark(any_spark, capsys, query, hint, reads):
    sql = query.format(hint=hint)
    with _no_size_broadcasts(any_spark):
        assert _spark_broadcasts(any_spark, sql, capsys) is (reads != SHUFFLE)
        expected = any_spark.sql(sql).toArrow()
        df = distfusion.spark.sql(any_spark, sql, config=CONFIG)
        got = df.to_arrow_table()
    assert df.fallback is None
    assert got.column_names == expected.column_names
    assert got.schema.types == expected.schema.types
    assert_same_result(got, expected, ordered=is_ordered(sql))
    (join,) = [s for s in df.stage_graph().stages if " Join:" in s.plan_text]
    assert sorted(i.boundary for i in join.inputs) == sorted(
        [reads, reads] if reads == SHUFFLE else [reads]
    ), df.explain()
