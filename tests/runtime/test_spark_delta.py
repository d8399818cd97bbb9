"""distfusion.spark.sql with Delta tables in ``tables=``: read natively from their log.

On the classic SparkSession and on a Spark Connect one (``any_spark``).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext
from deltalake import DeltaTable, write_deltalake

import distfusion.spark
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
