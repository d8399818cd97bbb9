"""``pip install 'distfusion[connect]'``: distfusion.spark.sql(...) on a Spark Connect session.

``SparkSession.builder.remote("local[2]")`` starts a local Spark Connect
server (PySpark's Connect client: grpcio, protobuf, zstandard, from
pyspark[connect]); the query runs as DataFrame jobs on it, its result comes
back through Connect (``to_arrow_table``) and as a Connect DataFrame
(``to_spark``, ``mapInArrow``: pandas). Usage: ``python check_connect.py WORK_DIR``.
"""

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

os.environ["PYSPARK_PYTHON"] = sys.executable  # the server's Python workers: this venv's

from pyspark.sql import SparkSession  # noqa: E402

import distfusion.spark  # noqa: E402
from distfusion import DistributedConfig  # noqa: E402
from distfusion.runtime.spark.connect import SparkConnectRuntime  # noqa: E402

work = Path(sys.argv[1])
for i in range(2):
    part = pa.table({"k": [j % 5 for j in range(500)], "v": list(range(i * 500, i * 500 + 500))})
    pq.write_table(part, work / f"t{i}.parquet")
spark = SparkSession.builder.remote("local[2]").getOrCreate()
try:
    spark.read.parquet(str(work)).createOrReplaceTempView("t")
    sql = "SELECT a.k, count(*) AS n FROM t a JOIN t b ON a.v = b.v GROUP BY a.k"
    config = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=0)
    df = distfusion.spark.sql(spark, sql, config=config)
    assert isinstance(df.context.runtime, SparkConnectRuntime), df.context.runtime
    got = sorted(df.to_arrow_table().to_pylist(), key=lambda r: r["k"])
    assert got == [{"k": k, "n": 200} for k in range(5)], got
    rows = sorted((r["k"], r["n"]) for r in df.to_spark().collect())
    assert rows == [(k, 200) for k in range(5)], rows
finally:
    spark.stop()
print("ok")
