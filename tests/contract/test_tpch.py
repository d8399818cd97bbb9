"""The 22 TPC-H queries on every runtime equal single-node DataFusion on the same files.

Adaptive execution on (the default) and off ("static": the static plan as is);
afterwards no worker holds a task or a byte.
"""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.contract.conftest import wait_idle


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "static"])
@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch(q, adaptive, runtime, workers, tpch_dir, oracle):
    # Force one task per worker in every stage so small data still distributes.
    config = DistributedConfig(tasks_per_stage=workers, adaptive=adaptive)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    sql = tpch.query(q)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    wait_idle(runtime)
