"""Deep plans run on every runtime and equal single-node DataFusion.

DataFusion decodes Substrait with a nesting limit of 100 messages, about 18
joins deep; the Python protobuf parser had the same limit. Single-node
DataFusion never serializes its plan, so it answers such queries: the
distributed planner and every task must too (the planner consumes deep
fragments in pieces, :func:`distfusion.substrait_plan.decode.consume_plan`). An
expression nested too deep for the decoder even in pieces runs on the
coordinator.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext
from tests.compare import assert_same_result

TABLES = 40
# DataFusion's SQL parser stops at 50 nested levels by default; single-node
# DataFusion needs the same setting for the nested queries.
PARSER_LIMIT = "SET datafusion.sql_parser.recursion_limit = 200"


def _join(n: int) -> str:
    joins = " ".join(f"JOIN t{i} ON t{i}.k = t{i - 1}.k" for i in range(1, n))
    return (
        f"SELECT t0.k, t0.v + t{n // 2}.v + t{n - 1}.v AS s, t{n - 1}.k AS last_k FROM t0 {joins}"
    )


def _nested_subqueries(n: int) -> str:
    sql = "SELECT k, v FROM t0"
    for i in range(1, n):
        sql = f"SELECT k, max(v) + {i % 3} AS v FROM ({sql}) AS s{i} WHERE v >= {i % 2} GROUP BY k"
    return sql


def _cte_chain(n: int) -> str:
    ctes = ", ".join(
        f"c{i} AS (SELECT c{i - 1}.k, c{i - 1}.v + t{i}.v AS v FROM c{i - 1} "
        f"JOIN t{i} ON c{i - 1}.k = t{i}.k WHERE c{i - 1}.v >= {i % 4})"
        for i in range(1, n)
    )
    return f"WITH c0 AS (SELECT k, v FROM t0), {ctes} SELECT k, v FROM c{n - 1}"


def _deep_expression(n: int) -> str:
    # t0.v + t1.v + ... nests n deep: too deep for the decoder even in pieces
    total = " + ".join(f"t{i}.v" for i in range(n))
    return _join(n).replace("SELECT t0.k,", f"SELECT t0.k, {total} AS total,", 1)


QUERIES = {
    "join-40-tables": _join(40),
    "nested-subqueries-50": _nested_subqueries(50),
    "cte-chain-30": _cte_chain(30),
    "sum-of-40-columns": _deep_expression(40),
}
DISTRIBUTED = ["join-40-tables", "nested-subqueries-50", "cte-chain-30"]
"""Run as stages; the rest runs on the coordinator (``coordinator_only``)."""


def _table(i: int) -> pa.Table:
    # keys 0..59 but i, so that every join drops a row
    keys = [k for k in range(60) if k != i]
    return pa.table({"k": keys, "v": [k * (i + 1) % 11 for k in keys]})


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    oracle.sql(PARSER_LIMIT)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    for i in range(TABLES):
        oracle.register_record_batches(f"t{i}", [_table(i).to_batches()])
        ctx.register_table(f"t{i}", _table(i), max_rows_per_unit=8)
    return ctx, oracle


@pytest.mark.parametrize("name", list(QUERIES))
def test_deep_plan_equals_datafusion(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    sql = QUERIES[name]
    expected = oracle.sql(sql).to_arrow_table()
    df = ctx.sql(f"{PARSER_LIMIT}; {sql}")
    assert expected.num_rows > 0
    assert_same_result(df.to_arrow_table(), expected, ordered=False)
    if name in DISTRIBUTED:
        assert df.coordinator_only() is None
        assert runtime.executed, "the query ran as stages"
    else:
        assert "deeper than DataFusion's Substrait decoder" in df.coordinator_only()


def test_planning_a_40_table_join_takes_seconds_at_most(runtime_for):
    ctx, _ = _contexts(runtime_for("local", 3), 3)
    df = ctx.sql(QUERIES["join-40-tables"])
    start = time.perf_counter()
    graph = df.stage_graph()
    elapsed_s = time.perf_counter() - start
    assert len(graph.stages) > 1
    # About 0.5 s on an idle machine; a walk of the plan gone quadratic takes minutes. The
    # bound leaves room for a busy machine (1 s failed with a benchmark on the same cores).
    assert elapsed_s < 10.0, f"planning took {elapsed_s:.2f} s"
