"""A SparkSession's own Python UDFs: distfusion's tasks against Spark SQL on the same session.

```
spark.udf.register("...", f, type)  /  @pandas_udf  /  @arrow_udf, registered by name
  distfusion:  distfusion.spark.sql(spark, q).to_arrow_table()   (the UDF runs in the tasks)
  spark-sql:   spark.sql(q).toArrow()
```

TPC-H ``lineitem`` as a temp view over Parquet. Each query runs once per
engine to warm up (answers compared), then ``--runs`` timed rounds, the
engines' order alternating; medians and their ratio are printed.

Run::

    .venv/bin/python benchmarks/session_udfs.py --data data/tpch-sf1 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pyarrow.compute as pc

import distfusion.spark
from distfusion import tpch
from distfusion.runtime.spark import SparkRuntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.compare
from tests.compare import assert_same_answer  # noqa: E402

QUERIES = {
    "plain": "SELECT l_returnflag, sum(bucket(l_quantity)) AS s FROM lineitem "
    "GROUP BY l_returnflag ORDER BY l_returnflag",
    "pandas": "SELECT l_returnflag, sum(half(l_extendedprice)) AS s FROM lineitem "
    "GROUP BY l_returnflag ORDER BY l_returnflag",
    "arrow": "SELECT l_returnflag, sum(plus_one(l_orderkey)) AS s FROM lineitem "
    "GROUP BY l_returnflag ORDER BY l_returnflag",
}


def _register(spark) -> None:
    from pyspark.sql.functions import arrow_udf, pandas_udf

    spark.udf.register("bucket", lambda q: None if q is None else int(q) // 10, "int")

    @pandas_udf("double")
    def half(s):
        return s.astype("float64") / 2

    @arrow_udf("bigint")
    def plus_one(a):
        return pc.add(a, 1)

    spark.udf.register("half", half)
    spark.udf.register("plus_one", plus_one)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print one line per UDF kind."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="TPC-H Parquet directory")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (default: %(default)s)")
    p.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    args = p.parse_args(argv)
    runtime = SparkRuntime(master=args.master)
    spark = runtime.spark
    spark.read.parquet(tpch.table_path(args.data, "lineitem")).createOrReplaceTempView("lineitem")
    _register(spark)
    engines = {
        "distfusion": lambda q: distfusion.spark.sql(spark, q, runtime=runtime).to_arrow_table(),
        "spark-sql": lambda q: spark.sql(q).toArrow(),
    }
    try:
        for name, sql in QUERIES.items():
            expected = engines["spark-sql"](sql)
            df = distfusion.spark.sql(spark, sql, runtime=runtime)
            assert_same_answer(df.to_arrow_table(), expected, sql)
            times: dict[str, list[float]] = {e: [] for e in engines}
            for r in range(args.runs):
                for engine in engines if r % 2 == 0 else reversed(list(engines)):
                    start = time.perf_counter()
                    engines[engine](sql)
                    times[engine].append(time.perf_counter() - start)
            d, s = (statistics.median(times[e]) for e in engines)
            mode = "spark" if df.fallback else "native"
            print(
                f"{name:>7} {mode:>6} distfusion {d:7.2f} s  spark-sql {s:7.2f} s  "
                f"ratio {d / s:.2f}",
                flush=True,
            )
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
