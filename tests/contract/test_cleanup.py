"""Cleanup and cancellation: a query leaves nothing behind, however it ends.

Ended early (the result stream closed after one batch, or before any),
cancelled while its tasks run (its QueryRun closed), satisfied by a LIMIT, or
run twice: afterwards no worker holds a task, a byte or a query.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from distfusion import QueryCancelled, tpch
from tests.contract.conftest import idle, wait_idle
from tests.contract.data import FILES, ROWS_PER_FILE, context, parquet_context


def test_closing_the_result_stream_early_frees_every_task(runtime, tmp_path):
    ctx, _ = parquet_context(runtime, tmp_path / "data")
    df = ctx.sql("SELECT k, v, s FROM p")
    total = df.to_arrow_table().num_rows
    assert total == FILES * ROWS_PER_FILE
    stream = df.execute_stream()
    first = next(stream)
    assert 0 < first.num_rows < total, "the result comes in several batches"
    stream.close()
    wait_idle(runtime)
    # The runtime still answers, with every row.
    assert df.to_arrow_table().num_rows == total
    wait_idle(runtime)


def test_closing_a_stream_before_reading_runs_nothing(runtime):
    stream = context(runtime).sql("SELECT k FROM t").execute_stream()
    stream.close()
    assert runtime.executed == []
    assert idle(runtime)


def test_same_dataframe_runs_twice_as_two_queries(runtime, tmp_path):
    ctx, _ = parquet_context(runtime, tmp_path / "data")
    df = ctx.sql("SELECT k, count(*) AS n, sum(v) AS sv FROM p GROUP BY k ORDER BY k")
    first = df.to_arrow_table()
    wait_idle(runtime)
    second = df.to_arrow_table()
    assert first.equals(second) and first.num_rows == 97
    wait_idle(runtime)
    assert len(runtime.executed) == 2
    assert runtime.executed[0].query_id != runtime.executed[1].query_id


def test_limit_over_a_large_scan_leaves_nothing_running(runtime, tpch_dir):
    ctx = context(runtime)
    tpch.register_tpch(ctx, tpch_dir)
    got = ctx.sql("SELECT l_orderkey, l_comment FROM lineitem LIMIT 10").to_arrow_table()
    assert got.num_rows == 10
    wait_idle(runtime)


# Runs for seconds on every runtime (a self-join on a low-cardinality key).
HEAVY = "SELECT count(*) AS n FROM lineitem a JOIN lineitem b ON a.l_suppkey = b.l_suppkey"


def test_closing_a_running_query_cancels_its_tasks(runtime, tpch_dir):
    ctx = context(runtime)
    tpch.register_tpch(ctx, tpch_dir)
    graph = ctx.sql(HEAVY).stage_graph()
    run = runtime.start_query(uuid.uuid4().hex)
    outcome: list[BaseException | None] = []

    def go() -> None:
        try:
            run.run_stages(graph, [s.stage_id for s in graph.stages if s is not graph.head])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(s["live_tasks"] for s in runtime.stats().values()):
        assert time.monotonic() < deadline and not outcome, "the query never ran"
        time.sleep(0.02)
    run.close()
    thread.join(timeout=30)
    assert not thread.is_alive()
    wait_idle(runtime)
    (error,) = outcome
    if error is None:
        pytest.fail("the run finished although it was closed while its tasks ran")
    if not isinstance(error, QueryCancelled):
        raise error
