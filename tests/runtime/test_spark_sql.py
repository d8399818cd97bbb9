"""distfusion.spark.sql: Spark's temp views as distfusion tables, results back in Spark.

Every test runs twice: on the classic SparkSession and on a Spark Connect
session of the same application (``any_spark``); what Connect cannot do is
declared with ``connect_gap``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import distfusion.spark
from distfusion import tpch
from distfusion.errors import PlanningError
from tests.compare import assert_same_result, is_ordered

# TPC-H queries, read as Spark SQL (tests/runtime/test_spark_sql_semantics.py runs them all).
QUERIES = (1, 3, 5, 6, 10, 12, 14, 19)


@pytest.fixture(scope="module")
def spark(any_spark):
    """The TPC-H views on a classic session, then on a Spark Connect one."""
    return any_spark


def _spark_result(df) -> pa.Table:
    return distfusion.spark.to_spark_compatible(df.toArrow())


@pytest.mark.parametrize("q", QUERIES)
def test_same_rows_and_schema_as_spark_sql(spark, q):
    """Through ``to_spark()`` (the head stage computed in Spark's partitions): Spark's answer."""
    sql = tpch.query(q)
    expected = spark.sql(sql)
    got = distfusion.spark.sql(spark, sql).to_spark()
    assert [(f.name, f.dataType) for f in got.schema] == [
        (f.name, f.dataType) for f in expected.schema
    ]
    assert_same_result(_spark_result(got), _spark_result(expected), ordered=is_ordered(sql))


def test_spark_column_names_are_spark_sqls_for_every_tpch_query(spark):
    """Spark SQL's names wherever Spark accepts the query (all but Q15's three statements)."""
    for q in range(1, 23):
        if q == 15:  # CREATE VIEW; SELECT; DROP VIEW: spark.sql refuses several statements
            continue
        sql = tpch.query(q)
        df = distfusion.spark.sql(spark, sql)
        assert df.spark_column_names() == spark.sql(sql).columns, f"q{q}"


def test_to_spark_has_spark_sqls_column_names(spark):
    sql = tpch.query(18)  # sum(l_quantity) in Spark, sum(lineitem.l_quantity) in DataFusion
    expected = spark.sql(sql).columns
    assert "sum(l_quantity)" in expected
    assert distfusion.spark.sql(spark, sql).to_spark().columns == expected
    # A result made on the driver too; an alias keeps its case as in Spark.
    small = "SELECT count(*) AS N, max(n_name) FROM nation"
    frame = distfusion.spark.sql(spark, small).to_spark()
    assert frame.columns == ["N", "max(n_name)"] == spark.sql(small).columns
    assert frame.collect()[0]["N"] == 25
    # A query run on Spark SQL itself: Spark's names too.
    spark_only = "SELECT date_format(DATE '2024-01-31', 'yyyy-MM HH') AS Month, n_name FROM nation"
    df = distfusion.spark.sql(spark, spark_only)
    assert df.fallback is not None
    assert df.to_spark().columns == ["Month", "n_name"] == df.to_arrow_table().column_names


def test_column_names_never_run_a_statement_in_spark(spark):
    """Asking Spark for names analyzes a query; a command is not executed."""
    from distfusion.spark_sql.schema import spark_schema

    assert spark_schema(spark, "CREATE TEMP VIEW names_probe AS SELECT 1 AS a") is None
    assert not spark.catalog.tableExists("names_probe")
    assert spark_schema(spark, "SELECT 1 AS a -- a comment\n;").names == ["a"]


def test_round_trip_continues_in_spark(spark):
    df = distfusion.spark.sql(
        spark, "SELECT n_regionkey, count(*) AS nations FROM nation GROUP BY n_regionkey"
    )
    assert "scan nation" in df.explain()
    sdf = df.to_spark()
    rows = sdf.filter("nations = 5").orderBy("n_regionkey").collect()
    assert [(r.n_regionkey, r.nations) for r in rows] == [(k, 5) for k in range(5)]
    assert df.to_pandas().shape == (5, 2)


def test_view_that_is_not_a_file_scan_is_read_through_spark(spark):
    spark.table("region").filter("r_regionkey > 1").createOrReplaceTempView("big_regions")
    try:
        df = distfusion.spark.sql(spark, "SELECT count(*) AS n FROM big_regions")
        assert "spark scan big_regions" in df.explain()
        assert df.to_pylist() == [{"n": 3}]
        # The plain Parquet scan stays native.
        assert "spark scan" not in distfusion.spark.sql(spark, "SELECT * FROM region").explain()
    finally:
        spark.catalog.dropTempView("big_regions")


def test_csv_temp_view(spark, tmp_path, tpch_dir):
    nation = pq.read_table(tpch.table_path(tpch_dir, "nation"))
    nation = distfusion.spark.to_spark_compatible(nation)
    pacsv.write_csv(nation, tmp_path / "nation.csv")
    spark.read.option("header", True).schema(spark.table("nation").schema).csv(
        str(tmp_path / "nation.csv")
    ).createOrReplaceTempView("nation_csv")
    try:
        sql = "SELECT n_regionkey, count(*) AS n, min(n_name) AS first FROM nation_csv GROUP BY 1 ORDER BY 1"
        got = distfusion.spark.sql(spark, sql).to_spark()
        assert [tuple(r) for r in got.collect()] == [tuple(r) for r in spark.sql(sql).collect()]
    finally:
        spark.catalog.dropTempView("nation_csv")


def test_table_partitioned_by_directory(spark, tmp_path):
    # Written by Spark's partitionBy: the partition columns are in the paths only.
    out = str(tmp_path / "orders_by_status")
    spark.table("orders").where("o_orderkey < 20000").write.partitionBy(
        "o_orderstatus", "o_orderpriority"
    ).parquet(out)
    spark.read.parquet(out).createOrReplaceTempView("orders_parts")
    try:
        sql = (
            "SELECT o_orderstatus, o_orderpriority, count(*) AS n, sum(o_totalprice) AS total "
            "FROM orders_parts WHERE o_orderstatus <> 'P' AND o_orderpriority < '3' "
            "GROUP BY 1, 2 ORDER BY 1, 2"
        )
        df = distfusion.spark.sql(spark, sql)
        got = df.to_spark()
        assert [tuple(r) for r in got.collect()] == [tuple(r) for r in spark.sql(sql).collect()]
        # Only the matching directories' files are read: 2 statuses x 2 priorities.
        read = [u.path for st in df.stage_graph().stages for s in st.scans for u in s.source.units]
        assert read and all("o_orderstatus=P" not in p for p in read)
        assert {p.split("o_orderpriority=")[1][:1] for p in read} == {"1", "2"}
    finally:
        spark.catalog.dropTempView("orders_parts")


def test_view_over_some_files_of_a_directory_reads_exactly_those(spark, tpch_dir, tmp_path):
    """A view over a subset of a directory's files: registered as that list (no links made)."""
    import glob
    import os
    import tempfile

    files = sorted(glob.glob(os.path.join(tpch.table_path(tpch_dir, "orders"), "*.parquet")))
    assert len(files) > 2
    spark.read.parquet(*files[:2]).createOrReplaceTempView("some_orders")
    before = set(os.listdir(tempfile.gettempdir()))
    try:
        sql = "SELECT o_orderstatus, count(*) AS n FROM some_orders GROUP BY 1 ORDER BY 1"
        df = distfusion.spark.sql(spark, sql)
        assert [tuple(r) for r in df.to_spark().collect()] == [
            tuple(r) for r in spark.sql(sql).collect()
        ]
        assert sorted(u.path for u in df.context.sources["some_orders"].units) == files[:2]
    finally:
        spark.catalog.dropTempView("some_orders")
    made = set(os.listdir(tempfile.gettempdir())) - before
    assert not {n for n in made if n.startswith("distfusion-spark-")}  # no directory of links


def test_tables_from_object_store_urls(spark, s3_tpch, s3_store, tpch_dir):
    import distfusion.io.object_store as stores

    stores.register("s3://", s3_store(), "tpch")
    sql = "SELECT o_orderstatus, count(*) AS n, sum(o_totalprice) AS t FROM o GROUP BY 1 ORDER BY 1"
    got = distfusion.spark.sql(spark, sql, tables={"o": f"{s3_tpch}/orders/"}).to_spark()
    spark.read.parquet(tpch.table_path(tpch_dir, "orders")).createOrReplaceTempView("o")
    try:
        assert [tuple(r) for r in got.collect()] == [tuple(r) for r in spark.sql(sql).collect()]
    finally:
        spark.catalog.dropTempView("o")


@pytest.mark.connect_gap(
    raises=AttributeError,
    reason="a Connect session has no Hadoop configuration (sparkContext): "
    "test_s3a_settings_of_a_connect_session",
)
def test_s3a_files_map_to_s3_urls_with_spark_s3a_settings(spark):
    from distfusion.io import object_store as stores
    from distfusion.runtime.spark.files import native_path, s3_store_from_hadoop

    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set("fs.s3a.endpoint", "minio.local:9000")
    conf.set("fs.s3a.connection.ssl.enabled", "false")
    conf.set("fs.s3a.bucket.lake.access.key", "lake-key-id")
    conf.set("fs.s3a.bucket.lake.secret.key", "lake-secret")
    try:
        store = s3_store_from_hadoop(spark, "lake")
        assert store.arguments == {
            "bucket_name": "lake",
            "allow_http": True,
            "endpoint": "http://minio.local:9000",
            "access_key_id": "lake-key-id",
            "secret_access_key": "lake-secret",
        }
        assert "lake-secret" not in repr(store)
        other = s3_store_from_hadoop(spark, "other").arguments  # the global settings only
        assert other["endpoint"] == "http://minio.local:9000"
        assert other.get("access_key_id") != "lake-key-id"
        assert native_path(spark, "s3a://lake/t/part-0.parquet") == "s3://lake/t/part-0.parquet"
        assert stores.registered()["s3://lake"] == store.spec()
        assert native_path(spark, "hdfs://nn/t/part-0.parquet") is None
    finally:
        for key in ("endpoint", "connection.ssl.enabled"):
            conf.unset(f"fs.s3a.{key}")
        for key in ("access.key", "secret.key"):
            conf.unset(f"fs.s3a.bucket.lake.{key}")
        stores.deregister("s3://", "lake")


@pytest.mark.connect_gap(
    raises=PlanningError,
    reason="an Iceberg table's work unit feed streams from the client, which the "
    "executors cannot reach on Spark Connect",
)
def test_an_iceberg_table_on_s3_through_tables(spark, s3_server, s3_store, tmp_path):
    """``tables={"t": <pyiceberg Table>}``: planned on the driver, the executors pull its files."""
    from datafusion import SessionContext

    from distfusion.io import object_store
    from tests.iceberg_tables import build_events, s3_catalog

    s3_server.create_bucket("iceberg")
    object_store.register("s3://", s3_store("iceberg"), "iceberg")  # no keys: the workers' own
    events = build_events(s3_catalog("spark_sql", tmp_path / "c.db", s3_server.endpoint))
    sql = "SELECT region, count(*) AS n, sum(value) AS s FROM events GROUP BY region"
    df = distfusion.spark.sql(spark, sql, tables={"Events": events.table})
    oracle = SessionContext()
    rows = events.table.scan().to_arrow()
    oracle.register_record_batches(
        "events", [rows.cast(df.context.sources["events"].schema).to_batches()]
    )
    expected = oracle.sql(sql).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, ordered=False)
    assert "Iceberg snapshot" in df.explain_run()
    back = df.to_spark().orderBy("region").collect()
    assert [r.region for r in back] == sorted(expected.column("region").to_pylist())


def test_s3a_settings_of_a_connect_session(connect_session):
    """On Spark Connect the ``spark.hadoop.fs.s3a.*`` settings the server exposes make the store.

    Keys are not exposed to a Connect client (Spark hides them): the tasks
    take credentials from the executors' environment.
    """
    from distfusion.runtime.spark.files import s3_store_from_hadoop

    conf = connect_session.conf
    conf.set("spark.hadoop.fs.s3a.endpoint", "minio.local:9000")
    conf.set("spark.hadoop.fs.s3a.connection.ssl.enabled", "false")
    conf.set("spark.hadoop.fs.s3a.bucket.lake.access.key", "lake-key-id")
    try:
        store = s3_store_from_hadoop(connect_session, "lake")
        assert store.arguments == {
            "bucket_name": "lake",
            "allow_http": True,
            "endpoint": "http://minio.local:9000",
        }
    finally:
        for key in ("endpoint", "connection.ssl.enabled", "bucket.lake.access.key"):
            conf.unset(f"spark.hadoop.fs.s3a.{key}")
