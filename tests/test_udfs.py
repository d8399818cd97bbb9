"""Python UDFs (scalar, aggregate, window) run in the tasks of every runtime and give DataFusion's answers.

The UDFs (``tests/udf_funcs.py``) are registered on the DistributedContext;
local tasks use them in process, Spark ships them with each job's closure, and
Flight workers load them at start (``--udf tests.udf_funcs:ALL``). The oracle
is single-node DataFusion with the same UDFs. ``geo_mean`` is a mergeable
aggregate UDF (partial states cross the shuffle), ``median_key`` is not (raw
rows cross it).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

import distfusion
from distfusion import DistributedConfig, DistributedContext, FlightRuntime, TaskError, tpch
from distfusion.stages import COALESCE, SHUFFLE
from tests.compare import assert_same_result, is_ordered
from tests.udf_funcs import UDAFS, UDFS, UDWFS, GeoMean, Median, RunningMax

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
    # Aggregate UDFs: mergeable, not mergeable, mixed with built-in aggregates.
    "udaf-mergeable-group-by": (
        "SELECT o_orderpriority, geo_mean(o_totalprice) AS g, count(*) AS n, "
        "avg(o_totalprice) AS a FROM orders GROUP BY 1"
    ),
    "udaf-not-mergeable-group-by": (
        "SELECT o_orderstatus, median_key(o_custkey) AS m, max(o_totalprice) AS mx "
        "FROM orders GROUP BY 1"
    ),
    "udaf-mergeable-without-group-by": (
        "SELECT geo_mean(o_totalprice) AS g, sum(o_totalprice) AS s, count(*) AS n FROM orders"
    ),
    "udaf-mergeable-with-filter": (
        "SELECT o_orderstatus, geo_mean(o_totalprice) AS g, "
        "geo_mean(o_totalprice) FILTER (WHERE o_orderpriority = '1-URGENT') AS urgent "
        "FROM orders GROUP BY 1"
    ),
    # No row reaches the partial aggregates: the final one merges empty states.
    "udaf-mergeable-over-no-rows": (
        "SELECT geo_mean(o_totalprice) AS g, count(*) AS n FROM orders WHERE o_orderkey < 0"
    ),
    "udaf-without-group-by": (
        "SELECT geo_mean(o_totalprice) AS g, median_key(o_orderkey) AS m, count(*) AS n "
        "FROM orders WHERE o_orderdate < DATE '1995-01-01'"
    ),
    "udaf-mixed-after-a-join": (
        "SELECT c_mktsegment, price_band(o_totalprice) AS band, geo_mean(o_totalprice) AS g, "
        "median_key(o_custkey) AS m, sum(o_totalprice) AS s, count(DISTINCT o_custkey) AS d "
        "FROM customer JOIN orders ON c_custkey = o_custkey GROUP BY 1, 2 ORDER BY 1, 2"
    ),
    # Window UDF, and an aggregate UDF as a window function.
    "udwf": (
        "SELECT o_custkey, o_orderkey, "
        "running_max(o_totalprice) OVER (PARTITION BY o_custkey ORDER BY o_orderkey) AS r, "
        "geo_mean(o_totalprice) OVER (PARTITION BY o_custkey) AS g "
        "FROM orders WHERE o_custkey < 3000 ORDER BY o_custkey, o_orderkey"
    ),
}


@pytest.fixture(scope="module")
def flight_with_udfs():
    runtime = FlightRuntime.with_local_workers(2, udfs=("tests.udf_funcs:ALL",))
    yield runtime
    runtime.close()


@pytest.fixture(params=["local", "flight", "spark"])
def contexts(request, runtime_for, tpch_dir):
    if request.param == "flight":
        runtime = request.getfixturevalue("flight_with_udfs")
    else:
        runtime = runtime_for(request.param, 2)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    oracle = SessionContext()
    tpch.register_tpch(ctx, tpch_dir)
    for table in ("orders", "customer"):
        oracle.register_parquet(table, tpch.table_path(tpch_dir, table))
    for u in UDFS:
        ctx.register_udf(u)
        oracle.register_udf(u)
    for u in UDAFS:
        ctx.register_udaf(u)
        oracle.register_udaf(u)
    for u in UDWFS:
        ctx.register_udwf(u)
        oracle.register_udwf(u)
    return ctx, oracle


@pytest.mark.parametrize("name", list(QUERIES))
def test_udf_gives_datafusions_answer(contexts, name):
    ctx, oracle = contexts
    sql = QUERIES[name]
    df = ctx.sql(sql)
    assert df.coordinator_only() is None  # planned as stages, run by the tasks
    got = df.to_arrow_table()
    expected = oracle.sql(sql).to_arrow_table()
    assert got.num_rows > 0  # (over no rows: one row of a null geo_mean and a zero count)
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


def _only_here(kind: str):
    """A UDF the session's Flight workers lack, and a query calling it, by ``kind``."""
    name = f"only_here_{kind}"
    if kind == "window":
        u = distfusion.udwf(RunningMax, [pa.float64()], pa.float64(), "immutable", name=name)
        call = f"{name}(o_totalprice) OVER (PARTITION BY o_orderstatus ORDER BY o_orderkey)"
        return u, name, f"SELECT o_orderkey, {call} AS r FROM orders"
    states = [pa.float64(), pa.int64()]
    u = distfusion.udaf(
        GeoMean,
        [pa.float64()],
        pa.float64(),
        states,
        "immutable",
        name=name,
        mergeable=kind == "mergeable",
    )
    return u, name, f"SELECT o_orderstatus, {name}(o_totalprice) AS g FROM orders GROUP BY 1"


@pytest.mark.parametrize("kind", ["mergeable", "aggregate", "window"])
def test_a_worker_without_the_udaf_or_udwf_names_it(runtime_for, tpch_dir, kind):
    # The session's Flight workers were started without --udf.
    ctx = DistributedContext(
        runtime=runtime_for("flight", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    u, name, sql = _only_here(kind)
    (ctx.register_udwf if kind == "window" else ctx.register_udaf)(u)
    # A mergeable UDAF's companion (only_here_mergeable__partial) is named as the UDAF.
    with pytest.raises(TaskError, match=f"function '{name}'.*--udf package.module:name"):
        ctx.sql(sql).to_arrow_table()


def _planned(runtime_for, sql: str):
    """``sql`` over a few in-memory rows, 2 tasks per stage on the local runtime."""
    ctx = DistributedContext(
        runtime=runtime_for("local", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    ctx.register_record_batches(
        "t",
        [[pa.record_batch({"k": [i % 3 for i in range(6)], "x": [float(i) for i in range(6)]})]]
        * 2,
    )
    for u in UDAFS:
        ctx.register_udaf(u)
    return ctx.sql(sql)


def test_a_mergeable_udaf_shuffles_partial_states(runtime_for):
    df = _planned(runtime_for, "SELECT k, geo_mean(x) AS g FROM t GROUP BY k")
    graph = df.stage_graph()
    (partial,) = [s for s in graph.stages if s.output.kind == SHUFFLE]
    assert "geo_mean__partial" in partial.plan_text, df.explain()
    assert "geo_mean__final" in graph.consumers(partial.stage_id)[0].plan_text, df.explain()


@pytest.mark.parametrize(
    ("sql", "boundary"),
    [
        ("SELECT k, median_key(CAST(x AS BIGINT)) AS m FROM t GROUP BY k", SHUFFLE),
        ("SELECT median_key(CAST(x AS BIGINT)) AS m, geo_mean(x) AS g FROM t", COALESCE),
    ],
)
def test_a_udaf_not_mergeable_moves_raw_rows(runtime_for, sql, boundary):
    df = _planned(runtime_for, sql)
    graph = df.stage_graph()
    (producer,) = [s for s in graph.stages if s.output.kind == boundary]
    # The raw rows cross the boundary: no aggregate below it, the whole one above it.
    assert "Aggregate" not in producer.plan_text, df.explain()
    consumer = graph.consumers(producer.stage_id)[0]
    assert "median_key" in consumer.plan_text, df.explain()
    assert "__partial" not in df.explain()
    if boundary == COALESCE:
        assert consumer.num_tasks == 1


def test_register_udf_takes_a_scalar_udf():
    with pytest.raises(TypeError, match="datafusion ScalarUDF"):
        DistributedContext().register_udf(lambda a: a)


def test_register_udaf_and_udwf_take_their_kind():
    with pytest.raises(TypeError, match="datafusion AggregateUDF"):
        DistributedContext().register_udaf(UDFS[0])
    with pytest.raises(TypeError, match="datafusion WindowUDF"):
        DistributedContext().register_udwf(UDAFS[0])
    with pytest.raises(ValueError, match="state_type"):
        distfusion.udaf(Median, [pa.int64()], pa.float64(), [], "immutable", mergeable=True)
    with pytest.raises(TypeError, match="Accumulator"):
        distfusion.udaf(lambda: 1, [pa.int64()], pa.int64(), [pa.int64()], "immutable")
    assert (
        distfusion.udaf(
            Median, [pa.int64()], pa.float64(), [pa.list_(pa.int64())], "immutable"
        ).name
        == "median"
    )


@pytest.mark.parametrize("session", ["classic", "connect"])
def test_pyspark_users_pass_udfs_to_distfusion_spark_sql(session, runtime_for, tpch_dir, request):
    """On the classic SparkSession and on a Spark Connect one: the UDFs travel to the executors."""
    import distfusion.spark

    if session == "classic":
        runtime = runtime_for("spark", 2)
        spark = runtime.spark
    else:
        spark = request.getfixturevalue("connect_session")
        runtime = distfusion.spark._runtime_for(spark)
    spark.read.parquet(tpch.table_path(tpch_dir, "orders")).createOrReplaceTempView("orders")
    # Spark SQL's own functions answer as Spark (tests/runtime/test_spark_sql_semantics.py);
    # here the UDF, whose answer the single-node DataFusion oracle gives.
    sql = (
        "SELECT o_orderpriority, geo_mean(o_totalprice) AS g, count(*) AS n FROM orders GROUP BY 1"
    )
    df = distfusion.spark.sql(spark, sql, runtime=runtime, udfs=[*UDFS, *UDAFS, *UDWFS])
    assert df.fallback is None
    oracle = SessionContext()
    oracle.register_parquet("orders", tpch.table_path(tpch_dir, "orders"))
    for u in UDAFS:
        oracle.register_udaf(u)
    got = df.to_arrow_table()
    # the table's types are Spark's (string, not DataFusion's string_view)
    expected = oracle.sql(sql).to_arrow_table().cast(got.schema)
    assert_same_result(got, expected, is_ordered(sql))
    with pytest.raises(TypeError, match="register_udf takes"):
        distfusion.spark.sql(spark, sql, runtime=runtime, udfs=[len])


@pytest.mark.parametrize("runtime", ["local", "flight"])
def test_cli_query_loads_udfs_for_the_sql_and_the_workers_it_starts(
    runtime, tpch_dir, tmp_path, capsys
):
    import pyarrow.parquet as pq

    from distfusion.cli import main

    out = tmp_path / "r.parquet"
    sql = QUERIES["udaf-mergeable-group-by"]
    argv = ["query", sql, "--tpch", str(tpch_dir), "--runtime", runtime, "--workers", "2"]
    argv += ["--udf", "tests.udf_funcs:ALL", "--output", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    oracle = SessionContext()
    oracle.register_parquet("orders", tpch.table_path(tpch_dir, "orders"))
    for u in UDAFS:
        oracle.register_udaf(u)
    expected = oracle.sql(sql).to_arrow_table()
    got = pq.read_table(out)
    assert_same_result(got.cast(expected.schema), expected, is_ordered(sql))
    assert main(["query", "SELECT 1", "--runtime", "local", "--udf", "tests.udf_funcs"]) == 2
    assert "module:name" in capsys.readouterr().err
