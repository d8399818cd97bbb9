"""The same sub-plan used twice in one query gives DataFusion's answer.

A CTE joined with itself, the same ``UNION ALL`` on both sides of a join, two
identical correlated subqueries: the planner computes such a sub-plan once and
reads its stage twice (exchange reuse), and a stage that ran already (adaptive
execution) is read wherever the plan needs it again. Each read a task's
fragment makes is a table of its own: two reads under one name made every task
of the consumer fail with ``The table __stage_N already exists``. Several
tasks per stage and joins forced to shuffle (no broadcast), adaptive
execution on and off, on TPC-H SF0.1.
"""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from tests.compare import assert_same_result, oracle_result
from tests.contract.conftest import wait_idle

SHAPES = {
    "cte-joined-with-itself": (
        "WITH t AS (SELECT l_suppkey, sum(l_quantity) AS q FROM lineitem GROUP BY l_suppkey) "
        "SELECT x.l_suppkey, x.q, y.q AS q2 FROM t x JOIN t y ON x.l_suppkey = y.l_suppkey"
    ),
    "cte-joined-with-itself-other-columns": (
        "WITH t AS (SELECT l_suppkey, sum(l_quantity) AS q, count(*) AS n "
        "FROM lineitem GROUP BY l_suppkey) "
        "SELECT x.l_suppkey, x.q, y.n FROM t x JOIN t y ON x.l_suppkey = y.l_suppkey"
    ),
    "cte-joined-with-itself-on-another-key": (
        "WITH t AS (SELECT l_suppkey, sum(l_quantity) AS q FROM lineitem GROUP BY l_suppkey) "
        "SELECT x.l_suppkey, x.q, y.q AS q2 FROM t x JOIN t y ON x.l_suppkey = y.l_suppkey + 1"
    ),
    "union-all-on-both-sides-of-a-join": (
        "SELECT a.k, count(*) AS n FROM "
        "(SELECT l_orderkey AS k FROM lineitem WHERE l_quantity > 45 "
        " UNION ALL SELECT l_orderkey FROM lineitem WHERE l_quantity > 45) a JOIN "
        "(SELECT l_orderkey AS k FROM lineitem WHERE l_quantity > 45 "
        " UNION ALL SELECT l_orderkey FROM lineitem WHERE l_quantity > 45) b "
        "ON a.k = b.k GROUP BY a.k"
    ),
    "union-all-of-identical-branches": (
        "SELECT k, count(*) AS n FROM "
        "(SELECT l_suppkey AS k FROM lineitem WHERE l_discount > 0.05 "
        " UNION ALL SELECT l_suppkey FROM lineitem WHERE l_discount > 0.05) GROUP BY k"
    ),
    "two-identical-correlated-counts": (
        "SELECT s_suppkey, "
        "(SELECT count(*) FROM lineitem WHERE l_suppkey = s_suppkey) AS c1, "
        "(SELECT count(*) FROM lineitem WHERE l_suppkey = s_suppkey) AS c2 FROM supplier"
    ),
}


# adaptive execution as by default; every shuffle run before its consumers are
# planned (so a sub-plan used twice is read twice as a stage that ran); static.
MODES = {
    "adaptive": {},
    "every-shuffle-first": {"adaptive_shuffle_bytes": 1},
    "static": {"adaptive": False},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_subplan_used_twice(shape, mode, runtime, workers, tpch_dir, oracle):
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0, **MODES[mode])
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    sql = SHAPES[shape]
    df = ctx.sql(sql)
    assert df.coordinator_only() is None
    assert_same_result(df.to_arrow_table(), oracle_result(oracle, sql), ordered=False)
    graph = df.stage_graph()
    for stage in graph.stages:  # every read of a fragment under a name of its own
        names = [i.table for i in stage.inputs]
        assert len(names) == len(set(names)), (stage.stage_id, names)
    wait_idle(runtime)
