"""Any Spark DataFrame or catalog table as a distfusion source, read through Spark.

A table that is not a plain Parquet/CSV file scan (a view with a filter or a
join, a DataFrame built with the DataFrame API, JSON or ORC read by Spark) is
computed by Spark: the leaf stage reading it runs one task per partition of
the DataFrame, inside the Spark task computing that partition. Every result
equals ``spark.sql(q)`` on the same data (as sorted Arrow tables, types as
Spark gives them).

Every test runs on the classic SparkSession and on a Spark Connect session of
the same application (``any_spark``); the shuffle data plane needs RDDs, so its
cases run on the classic one only.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import distfusion.spark
from distfusion import DistributedConfig, DistributedContext, LocalRuntime, PlanningError, tpch
from distfusion.runtime.spark import SparkRuntime, is_connect_session
from tests.compare import assert_same_result, is_ordered

# Small tasks: a DataFrame of a few MiB still gets a task per partition.
SMALL_TASKS = DistributedConfig(bytes_per_task=1024 * 1024)


@pytest.fixture(scope="module")
def spark(any_spark):
    """The TPC-H views on a classic session, then on a Spark Connect one."""
    return any_spark


def _functions(spark):
    """``pyspark.sql.functions`` for ``spark``'s kind of session.

    This process holds a classic session too, so the classic functions build
    classic columns; a Connect DataFrame needs Connect's (what
    ``SparkSession.builder.remote`` switches a process to).
    """
    if is_connect_session(spark):
        from pyspark.sql.connect import functions

        return functions
    return F


def _planned_partitions(spark, partitions: int) -> int:
    """Leaf tasks over a DataFrame Spark plans in ``partitions`` partitions.

    Spark Connect does not say a DataFrame's partitions before it runs, so
    there the stage gets one task per slot (2), coalescing the DataFrame.
    """
    return 2 if is_connect_session(spark) else partitions


def _runtime_on(spark, data_plane: str):
    """The session's runtime on ``data_plane`` (the default one for ``"flight"``)."""
    if data_plane == "flight":  # the default runtime of the session
        return distfusion.spark._runtime_for(spark)
    if is_connect_session(spark):
        pytest.skip("the shuffle data plane needs RDDs: not on Spark Connect (test_spark_connect)")
    return SparkRuntime(spark=spark, data_plane=data_plane)


@pytest.fixture
def view(spark):
    """``view(name, df)`` registers a temp view for the test; dropped at its end."""
    names = []

    def make(name, df):
        df.createOrReplaceTempView(name)
        names.append(name)

    yield make
    for name in names:
        spark.catalog.dropTempView(name)


def _arrow(table: pa.Table) -> pa.Table:
    return distfusion.spark.to_spark_compatible(table)


def assert_same_as_spark(spark, sql: str, got, **kwargs) -> None:
    """``got`` (a distfusion DataFrame) has the rows and names of ``spark.sql(sql)``."""
    expected = _arrow(spark.sql(sql).toArrow())
    result = _arrow(got.to_arrow_table())
    assert_same_result(
        result, expected, ordered=is_ordered(sql), decimal_ulps=1, check_types=False, **kwargs
    )


def _spark_stages(df):
    """The stages of ``df``'s last run that read a Spark table, and their metrics."""
    graph = df._ran_graph() or df.stage_graph()
    metrics = df.metrics()
    out = []
    for stage in graph.stages:
        if any(s.source.is_spark for s in stage.scans):
            out.append((stage, metrics.stage(stage.stage_id)))
    return out


def test_filtered_and_joined_temp_view(spark, view):
    view(
        "open_orders",
        spark.sql(
            "SELECT o_orderkey, o_orderpriority, o_totalprice, c_mktsegment "
            "FROM orders JOIN customer ON o_custkey = c_custkey "
            "WHERE o_orderstatus = 'O' AND o_totalprice > 100000"
        ),
    )
    sql = (
        "SELECT c_mktsegment, o_orderpriority, count(*) AS n, sum(o_totalprice) AS total "
        "FROM open_orders GROUP BY c_mktsegment, o_orderpriority ORDER BY 1, 2"
    )
    df = distfusion.spark.sql(spark, sql)
    assert "spark scan open_orders" in df.explain()
    assert_same_as_spark(spark, sql, df)


def test_dataframe_api_through_tables_runs_over_its_partitions(spark, tpch_dir):
    fn = _functions(spark)
    lineitem = (
        spark.read.parquet(tpch.table_path(tpch_dir, "lineitem"))
        .where(fn.col("l_shipdate") >= fn.lit("1995-01-01").cast("date"))
        .withColumn("revenue", fn.col("l_extendedprice") * (1 - fn.col("l_discount")))
        .select("l_orderkey", "l_returnflag", "revenue", "l_quantity")
        .repartition(3)
    )
    sql = (
        "SELECT l_returnflag, count(*) AS n, sum(revenue) AS revenue "
        "FROM big_items GROUP BY l_returnflag"
    )
    runtime = distfusion.spark._runtime_for(spark)
    df = distfusion.spark.sql(spark, sql, config=SMALL_TASKS, tables={"big_items": lineitem})
    lineitem.createOrReplaceTempView("big_items")  # for spark.sql only, after planning
    try:
        assert_same_as_spark(spark, sql, df)
    finally:
        spark.catalog.dropTempView("big_items")
    # The leaf stage ran as Spark tasks over the DataFrame's 3 partitions, each
    # reading its own Arrow batches on an executor: none ran on the driver.
    ((stage, metrics),) = _spark_stages(df)
    assert stage.num_tasks == _planned_partitions(spark, 3)
    tasks = metrics.tasks
    assert len(tasks) == stage.num_tasks
    driver = runtime._driver_worker.url if runtime._driver_worker is not None else None
    assert all(t.worker not in (driver, "coordinator") for t in tasks)
    assert all(t.source_bytes > 0 for t in tasks)
    # Only the 2 columns the query reads were converted (a flag and a decimal:
    # ~21 bytes a row; with the other two ~45).
    rows = sum(r["n"] for r in df.to_pylist())
    assert 0 < sum(t.source_bytes for t in tasks) < rows * 32


def test_json_table_with_spark_schema_inference(spark, view, tmp_path):
    path = str(tmp_path / "orders_json")
    spark.table("orders").where("o_orderkey % 7 = 0").write.json(path)
    inferred = spark.read.json(path)  # dates as strings, numbers as bigint/double
    assert dict(inferred.dtypes)["o_orderkey"] == "bigint"
    view("orders_json", inferred)
    sql = (
        "SELECT o_orderpriority, substr(o_orderdate, 1, 4) AS year, count(*) AS n, "
        "avg(o_totalprice) AS avg_price, min(o_clerk) AS clerk "
        "FROM orders_json WHERE o_orderstatus <> 'P' GROUP BY 1, 2"
    )
    df = distfusion.spark.sql(spark, sql)
    assert "spark scan orders_json" in df.explain()
    assert_same_as_spark(spark, sql, df)


@pytest.mark.parametrize("data_plane", ["flight", "shuffle"])
def test_orc_table_joined_with_a_native_parquet_table(spark, view, tmp_path, data_plane):
    path = str(tmp_path / "customer_orc")
    spark.table("customer").write.orc(path)
    view("customer_orc", spark.read.orc(path))
    sql = (
        "SELECT n_name, c_mktsegment, count(*) AS customers, sum(c_acctbal) AS balance "
        "FROM customer_orc JOIN nation ON c_nationkey = n_nationkey "
        "WHERE c_acctbal > 0 GROUP BY n_name, c_mktsegment ORDER BY n_name, c_mktsegment"
    )
    runtime = _runtime_on(spark, data_plane)  # shuffle: nothing outlives close()
    try:
        df = distfusion.spark.sql(spark, sql, runtime=runtime)
        plan = df.explain()
        assert "spark scan customer_orc" in plan and "scan nation" in plan
        assert_same_as_spark(spark, sql, df)
        assert runtime.data_plane == data_plane and _spark_stages(df)
    finally:
        if data_plane != "flight":
            runtime.close()


def test_time_stamps_in_the_session_time_zone_and_names_of_any_case(spark):
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        # Hourly across the start of daylight saving time (2024-03-10 02:00 local).
        events = spark.sql(
            "SELECT id AS EventId, timestamp'2024-03-09 12:00:00' + make_interval(0, 0, 0, 0, "
            "cast(id AS int), 0, 0) AS Ts FROM range(40)"
        )
        sql = (
            "SELECT date_trunc('day', TS) AS day, count(*) AS n, min(eventid) AS first "
            "FROM events WHERE ts >= '2024-03-10 00:00:00' GROUP BY 1"
        )
        # date_trunc runs natively in the session's zone, on a table only distfusion knows too.
        own = distfusion.spark.sql(spark, sql, tables={"Events": events})
        assert own.fallback is None
        events.createOrReplaceTempView("events")
        try:
            assert_same_as_spark(spark, sql, own)
            df = distfusion.spark.sql(spark, sql)  # from Spark's catalog: Spark's schema
            assert df.fallback is None
            assert df.schema().field("day").type.tz == "UTC"  # toArrow()'s label, same instants
            assert_same_as_spark(spark, sql, df)
        finally:
            spark.catalog.dropTempView("events")
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_other_runtimes_refuse_a_spark_table(spark):
    with DistributedContext(runtime=LocalRuntime(workers=2)) as ctx:
        distfusion.spark.register_spark_dataframe(ctx, "regions", spark.table("region").limit(3))
        with pytest.raises(
            PlanningError,
            match=r"'regions' is a Spark DataFrame.*only the Spark runtime.*'local'",
        ):
            ctx.sql("SELECT count(*) FROM regions").collect()


def test_columns_that_differ_only_in_case_are_refused(spark):
    twins = spark.sql("SELECT 1 AS a, 2 AS A")
    with pytest.raises(PlanningError, match="differ only in case"):
        distfusion.spark.sql(spark, "SELECT * FROM t", tables={"t": twins})


def test_an_empty_dataframe(spark):
    empty = spark.table("region").where("r_regionkey < 0")
    sql = "SELECT count(*) AS n, max(r_name) AS m FROM e"
    df = distfusion.spark.sql(spark, sql, tables={"e": empty})
    assert df.to_pylist() == [{"n": 0, "m": None}]


def test_more_tasks_than_spark_makes_partitions(spark):
    """An adaptive DataFrame's partitions are known only when it runs: extra tasks read none."""
    fn = _functions(spark)
    grouped = spark.table("orders").groupBy("o_custkey").agg(fn.count("*").alias("orders"))
    sql = "SELECT orders, count(*) AS customers FROM g GROUP BY orders"
    df = distfusion.spark.sql(spark, sql, tables={"g": grouped})
    grouped.createOrReplaceTempView("g")
    try:
        assert_same_as_spark(spark, sql, df)
    finally:
        spark.catalog.dropTempView("g")
    # One task per worker planned; Spark's adaptive shuffle made one partition
    # of these few MiB: the other task ran over an empty one.
    ((stage, metrics),) = _spark_stages(df)
    assert stage.num_tasks == len(metrics.tasks) == 2
    assert sorted(t.source_bytes > 0 for t in metrics.tasks) == [False, True]


@pytest.mark.parametrize("data_plane", ["flight", "shuffle"])
def test_a_failed_task_over_a_partition_runs_again(spark, data_plane, monkeypatch, request):
    """Task 1 of the leaf stage fails on its first attempt; only its partition runs again.

    On Spark Connect the failure is injected through a job tag
    (``fail_connect_task``); the query succeeds only if the attempt ran again.
    """
    from distfusion.runtime.spark import FAIL_TASK_PROPERTY

    runtime = _runtime_on(spark, data_plane)
    connect = is_connect_session(spark)
    jobs = []  # partitions of each job run on part of an RDD
    if connect:
        fail = request.getfixturevalue("fail_connect_task")
    else:
        run_job = type(spark.sparkContext).runJob

        def counted(self, rdd, fn, partitions=None, allowLocal=False):
            jobs.append(partitions)
            return run_job(self, rdd, fn, partitions, allowLocal)

        monkeypatch.setattr(type(spark.sparkContext), "runJob", counted)
        sc = spark.sparkContext

        def fail(spec: str) -> None:
            sc.setLocalProperty(FAIL_TASK_PROPERTY, spec)

    parts = spark.table("orders").select("o_orderkey", "o_totalprice").repartition(3)
    sql = "SELECT count(*) AS n, sum(o_totalprice) AS total FROM parts"
    try:
        df = distfusion.spark.sql(
            spark,
            sql,
            runtime=runtime,
            config=DistributedConfig(tasks_per_stage=3),
            tables={"parts": parts},
        )
        (leaf,) = [s for s in df.stage_graph().stages if s.scans]
        assert leaf.num_tasks == _planned_partitions(spark, 3)
        fail(f"{leaf.stage_id}:1:1")
        got = df.to_arrow_table()
        if data_plane == "flight" and not connect:  # Spark retries the shuffle plane's itself
            assert [1] in jobs
    finally:
        if not connect:
            sc.setLocalProperty(FAIL_TASK_PROPERTY, None)
        if data_plane != "flight":
            runtime.close()
    parts.createOrReplaceTempView("parts")
    try:
        assert_same_as_spark(spark, sql, _Done(got))
    finally:
        spark.catalog.dropTempView("parts")


class _Done:
    """A result already computed, as :func:`assert_same_as_spark` reads one."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def to_arrow_table(self) -> pa.Table:
        return self.table
