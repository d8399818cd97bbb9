"""Python scalar UDFs run in the tasks of every runtime and give DataFusion's answers.

The UDFs (``tests/udf_funcs.py``) are registered on the DistributedContext;
local tasks use them in process, Spark ships them with each job's closure, and
Flight workers load them at start (``--udf tests.udf_funcs:UDFS``). The oracle
is single-node DataFusion with the same UDFs.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

import distfusion
from distfusion import DistributedConfig, DistributedContext, FlightRuntime, TaskError, tpch
from tests.compare import assert_same_result, is_ordered
from tests.udf_funcs import UDFS

QUERIES = {
    # In a filter, a projection and a grouping key, on a leaf stage and above a shuffle.
    "filter-and-project": (
        "SELECT o_orderkey, price_band(o_totalprice) AS band FROM orders "
        "WHERE digit_sum(o_orderkey) = 12 ORDER BY o_orderkey"
    ),
    "group-by-udf": (
        "SELECT price_band(o_totalprice) AS band, count(*) AS n, sum(digit_sum(o_custkey)) AS ds "
        "FROM orders GROUP BY 1"
    ),
    "after-a-join": (
        "SELECT c_mktsegment, price_band(o_totalprice) AS band, count(*) AS n "
        "FROM customer JOIN orders ON c_custkey = o_custkey "
        "WHERE digit_sum(c_custkey) > 10 GROUP BY 1, 2"
    ),
}


@pytest.fixture(scope="module")
def flight_with_udfs():
    runtime = FlightRuntime.with_local_workers(2, udfs=("tests.udf_funcs:UDFS",))
    yield runtime
    runtime.close()


@pytest.fixture(params=["local", "flight", "spark"])
def contexts(request, runtime_for, flight_with_udfs, tpch_dir):
    runtime = flight_with_udfs if request.param == "flight" else runtime_for(request.param, 2)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    oracle = SessionContext()
    tpch.register_tpch(ctx, tpch_dir)
    for table in ("orders", "customer"):
        oracle.register_parquet(table, tpch.table_path(tpch_dir, table))
    for u in UDFS:
        ctx.register_udf(u)
        oracle.register_udf(u)
    return ctx, oracle


@pytest.mark.parametrize("name", list(QUERIES))
def test_udf_gives_datafusions_answer(contexts, name):
    ctx, oracle = contexts
    sql = QUERIES[name]
    df = ctx.sql(sql)
    assert df.coordinator_only() is None  # planned as stages, run by the tasks
    got = df.to_arrow_table()
    expected = oracle.sql(sql).to_arrow_table()
    assert got.num_rows > 0
    assert_same_result(got, expected, is_ordered(sql))


def test_a_worker_without_the_udf_says_how_to_provide_it(runtime_for, tpch_dir):
    # The session's Flight workers were started without --udf.
    ctx = DistributedContext(
        runtime=runtime_for("flight", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    only_here = distfusion.udf(lambda a: a, [pa.int64()], pa.int64(), "immutable", name="only_here")
    ctx.register_udf(only_here)
    with pytest.raises(TaskError, match="only_here.*--udf package.module:name"):
        ctx.sql("SELECT only_here(o_orderkey) AS k FROM orders").to_arrow_table()


def test_register_udf_takes_a_scalar_udf():
    with pytest.raises(TypeError, match="datafusion ScalarUDF"):
        DistributedContext().register_udf(lambda a: a)
