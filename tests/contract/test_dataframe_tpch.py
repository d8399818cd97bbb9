"""TPC-H Q5 and Q18 written with the DataFrame API equal DataFusion's own DataFrames.

The same code (tests/dataframe_queries.py) builds each query on a
DistributedContext of every runtime and on a plain DataFusion SessionContext
over the same files; adaptive execution on and off. No SQL is involved.
"""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig, DistributedContext, DistributedDataFrame, tpch
from tests.compare import assert_same_result
from tests.contract.conftest import wait_idle
from tests.dataframe_queries import QUERIES


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "static"])
@pytest.mark.parametrize("q", list(QUERIES))
def test_tpch_dataframe(q, adaptive, runtime, workers, tpch_dir, oracle):
    config = DistributedConfig(tasks_per_stage=workers, adaptive=adaptive)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = QUERIES[q](ctx)
    assert isinstance(df, DistributedDataFrame)
    assert df.coordinator_only() is None
    got = df.to_arrow_table()
    assert runtime.executed, "the query did not run as stages on the runtime"
    assert_same_result(got, QUERIES[q](oracle).to_arrow_table(), ordered=True)
    wait_idle(runtime)
