"""The 22 TPC-H queries, distributed, equal single-node DataFusion on the same files."""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from tests.compare import assert_same_result, is_ordered, oracle_result

WORKERS = (1, 2, 3, 4)


def _context(runtime, tpch_dir, workers: int, adaptive: bool = True) -> DistributedContext:
    # Force one task per worker in every stage so small data still distributes.
    config = DistributedConfig(tasks_per_stage=workers, adaptive=adaptive)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


# (runtime, workers): the local runtime on 1-4 in-process workers; the Flight
# runtime on three worker processes (tests/conftest.py: flight_workers); the Spark
# runtime on the embedded local[2] session (tests/conftest.py: spark_session).
# Adaptive execution is on by default; "static" runs the static plan as is.
CASES = [("local", w, True) for w in WORKERS] + [
    ("flight", 3, True),
    ("spark", 2, True),
    ("local", 2, False),
    ("flight", 3, False),
    ("spark", 2, False),
]
IDS = [f"{r}-{w}" + ("" if adaptive else "-static") for r, w, adaptive in CASES]


@pytest.mark.parametrize(("runtime_name", "workers", "adaptive"), CASES, ids=IDS)
@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch(q, runtime_name, workers, adaptive, runtime_for, tpch_dir, oracle):
    sql = tpch.query(q)
    ctx = _context(runtime_for(runtime_name, workers), tpch_dir, workers, adaptive)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    stats = ctx.runtime.stats().values()
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in stats), stats


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch_default_config(q, runtime_for, tpch_dir, oracle):
    """The default task estimator (bytes per task) on 4 workers."""
    sql = tpch.query(q)
    ctx = DistributedContext(runtime=runtime_for("local", 4))
    tpch.register_tpch(ctx, tpch_dir)
    assert_same_result(ctx.sql(sql).to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
