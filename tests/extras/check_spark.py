"""``pip install 'distfusion[spark]'``: distfusion.spark.sql(...).to_spark() on an encrypted session.

The session encrypts Spark's RPC, so the Flight data plane serves TLS (the
``cryptography`` package) and ``to_spark`` reads the executors' outputs with
``mapInArrow`` (pandas, through pyspark[sql]). Usage: ``python check_spark.py WORK_DIR``.
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import distfusion.spark
from distfusion import DistributedConfig
from distfusion.runtime.spark import SparkRuntime

work = Path(sys.argv[1])
for i in range(2):
    part = pa.table({"k": [j % 5 for j in range(500)], "v": list(range(i * 500, i * 500 + 500))})
    pq.write_table(part, work / f"t{i}.parquet")
runtime = SparkRuntime(
    master="local[2]", conf={"spark.authenticate": "true", "spark.network.crypto.enabled": "true"}
)
try:
    runtime.driver_stage_bytes = 0  # the result's last stage on the executors: mapInArrow
    spark = runtime.spark
    spark.read.parquet(str(work)).createOrReplaceTempView("t")
    sql = "SELECT a.k, count(*) AS n FROM t a JOIN t b ON a.v = b.v GROUP BY a.k"
    config = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=0)
    df = distfusion.spark.sql(spark, sql, config=config)
    assert "Flight over TLS" in df.explain(), df.explain()
    rows = sorted((r["k"], r["n"]) for r in df.to_spark().collect())
    assert rows == [(k, 200) for k in range(5)], rows
finally:
    runtime.close()
print("ok")
