"""distfusion.spark.sql with Delta tables in ``tables=``: read natively from their log.

On the classic SparkSession and on a Spark Connect one (``any_spark``).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext
from deltalake import DeltaTable, write_deltalake

import distfusion.spark
from distfusion.errors import PlanningError
from distfusion.io import object_store
from tests.compare import assert_same_result
from tests.delta_tables import comparable

SQL = "SELECT region, count(*) AS n, sum(id) AS s FROM t WHERE id > 3 GROUP BY region"


@pytest.fixture
def delta_path(tmp_path) -> str:
    """A table whose directory also holds the files an overwrite removed from it."""
    path = str(tmp_path / "t")
    rows = pa.table({"id": pa.array(range(60), pa.int64()), "region": ["EU", "US", "AP"] * 20})
    write_deltalake(path, rows, partition_by=["region"])
    write_deltalake(path, rows, mode="append", partition_by=["region"])
    eu = rows.filter(pa.compute.equal(rows["region"], "EU")).slice(0, 5)
    write_deltalake(path, eu, mode="overwrite", predicate="region = 'EU'")
    return path


def _expected(path: str) -> pa.Table:
    oracle = SessionContext()
    table = comparable(DeltaTable(path).to_pyarrow_table())
    oracle.register_record_batches("t", [table.to_batches()])
    return oracle.sql(SQL).to_arrow_table()


def test_delta_table_and_path_are_read_natively(any_spark, delta_path):
    spark_session = any_spark
    files = len(DeltaTable(delta_path).file_uris())
    df = distfusion.spark.sql(spark_session, SQL, tables={"t": DeltaTable(delta_path)})
    plan = df.explain()
    assert f"scan t ({files} work units" in plan and "spark scan" not in plan
    expected = comparable(_expected(delta_path))
    assert_same_result(comparable(df.to_arrow_table()), expected, ordered=False)
    # a path is a Delta table's root, not its Parquet files (which include removed
    # ones); any case of the name; the result goes on in Spark
    df = distfusion.spark.sql(spark_session, SQL, tables={"T": delta_path})
    assert f"scan t ({files} work units" in df.explain()
    rows = sorted((r.region, r.n, r.s) for r in df.to_spark().collect())
    assert rows == sorted(tuple(r.values()) for r in expected.to_pylist())


# ---------------------------------------------------------------------- tables given by URL
IN_PROCESS_BUCKET = "delta-in-process"


@pytest.fixture(scope="module")
def in_process_s3():
    """An S3 server (moto's) as a thread of this process (as docs/delta.md runs it), a bucket made.

    A client that waits for it while holding Python's GIL gets no answer
    (deltalake's ``DeltaTable.is_deltatable`` waited 30 s, then failed).
    Yields the deltalake storage options of the bucket; its store is
    registered for the drop-in's tasks.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=IN_PROCESS_BUCKET)
    store = object_store.AmazonS3(bucket_name=IN_PROCESS_BUCKET, endpoint=endpoint, allow_http=True)
    object_store.register("s3://", store, IN_PROCESS_BUCKET)
    try:
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    finally:
        object_store.deregister("s3://", IN_PROCESS_BUCKET)
        server.stop()


def test_a_delta_url_is_read_from_its_log_without_a_stall(spark_session, in_process_s3):
    """A Delta table's URL reads its current version, never its directory's Parquet files.

    The table is overwritten: its directory holds the removed files too, which
    a Parquet listing would count again (200 rows, not 100). Plain Parquet
    files by URL are told apart with one listing request, not a 30 s wait.
    """
    options = in_process_s3
    uri = f"s3://{IN_PROCESS_BUCKET}/ev"
    rows = pa.table({"id": pa.array(range(100), pa.int64())})
    write_deltalake(uri, rows, storage_options=options)
    write_deltalake(uri, rows, mode="overwrite", storage_options=options)
    plain = f"s3://{IN_PROCESS_BUCKET}/plain/"
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink)
    object_store.put_bytes(plain + "part-0.parquet", sink.getvalue().to_pybytes())
    for url, kind in ((uri, "Delta"), (plain, "Parquet")):
        start = time.monotonic()
        df = distfusion.spark.sql(spark_session, "SELECT count(*) AS n FROM e", tables={"e": url})
        assert time.monotonic() - start < 25, f"{kind} URL {url} took a stall to register"
        assert df.to_pylist() == [{"n": 100}], (kind, df.explain())
    # a bucket that is not there: whether it is a Delta table is unknown, and said so
    missing = object_store.AmazonS3(
        bucket_name="delta-nowhere", endpoint=options["AWS_ENDPOINT_URL"], allow_http=True
    )
    object_store.register("s3://", missing, "delta-nowhere")
    try:
        with pytest.raises(PlanningError, match="s3://delta-nowhere/t is a Delta table"):
            distfusion.spark.sql(
                spark_session, "SELECT count(*) FROM e", tables={"e": "s3://delta-nowhere/t"}
            )
    finally:
        object_store.deregister("s3://", "delta-nowhere")
