"""The PySpark drop-in against Spark SQL on the same session: TPC-H in Spark's dialect (issue #38).

```
spark.read.parquet(<table>) -> temp views, one SparkSession (local[N])
  distfusion:  distfusion.spark.sql(spark, q).to_arrow_table()   (Spark SQL's semantics)
  spark-sql:   spark.sql(q).toArrow()
```

Every query runs once per engine to warm up, then ``--runs`` timed rounds,
the engines' order alternating round by round. Reported per query: median
wall seconds of each, their ratio (below 1: distfusion is faster), whether
distfusion ran it natively or on Spark SQL (``fallback``), and the sum over
the queries. The fallback rows (queries distfusion hands to Spark SQL) show
what the hand-over costs on top of Spark's own time. The warm-up round's
answers are compared (names, types and rows; ``answer_equal`` in the JSON).

Run (about ten minutes at SF1 on 2 cores)::

    .venv/bin/python benchmarks/spark_sql_dropin.py --data data/tpch-sf1 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import distfusion.spark
from distfusion import tpch
from distfusion.runtime.spark import SparkRuntime

# Queries distfusion hands to Spark SQL (a Java datetime pattern, a double rounded):
# the hand-over's cost over Spark's own time.
FALLBACK_QUERIES = {
    "fb-date_format": (
        "SELECT date_format(o_orderdate, 'yyyy-MM') AS m, count(*) AS n FROM orders "
        "GROUP BY 1 ORDER BY 1"
    ),
    "fb-round-double": (
        "SELECT round(CAST(o_totalprice AS DOUBLE), 1) AS r FROM orders "
        "WHERE o_orderkey < 1000 ORDER BY 1"
    ),
}


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _rows(table) -> list[tuple]:
    """The table's rows, sorted (an unordered result's order is no part of its answer)."""
    rows = [tuple(r.values()) for r in table.to_pylist()]
    return sorted(rows, key=repr)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print a table and optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="TPC-H Parquet directory (distfusion datagen)")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (default: %(default)s)")
    p.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    runtime = SparkRuntime(master=args.master)
    spark = runtime.spark
    for table in tpch.TABLES:
        spark.read.parquet(tpch.table_path(args.data, table)).createOrReplaceTempView(table)
    queries = {f"q{q}": tpch.query(q) for q in range(1, 23) if q != 15}
    queries.update(FALLBACK_QUERIES)
    engines = {
        "distfusion": lambda sql: distfusion.spark.sql(
            spark, sql, runtime=runtime
        ).to_arrow_table(),
        "spark-sql": lambda sql: spark.sql(sql).toArrow(),
    }
    rows = []
    try:
        for name, sql in queries.items():
            fallback = distfusion.spark.sql(spark, sql, runtime=runtime).fallback
            answers = {engine: run(sql) for engine, run in engines.items()}  # warm-up
            got, expected = answers["distfusion"], answers["spark-sql"]
            same = (
                got.column_names == expected.column_names
                and got.schema.types == expected.schema.types
                and _rows(got) == _rows(expected)
            )
            times: dict[str, list[float]] = {engine: [] for engine in engines}
            for r in range(args.runs):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for engine in order:
                    times[engine].append(_timed(lambda e=engine, q=sql: engines[e](q))[0])
            medians = {engine: statistics.median(t) for engine, t in times.items()}
            row = {
                "query": name,
                "fallback": fallback,
                "answer_equal": same,
                "distfusion_s": medians["distfusion"],
                "spark_sql_s": medians["spark-sql"],
                "ratio": medians["distfusion"] / medians["spark-sql"],
            }
            rows.append(row)
            mode = "spark" if fallback else "native"
            print(
                f"{name:>16} {mode:>6} distfusion {row['distfusion_s']:7.3f} s  "
                f"spark-sql {row['spark_sql_s']:7.3f} s  ratio {row['ratio']:.2f}"
                + ("" if same else "  ANSWER DIFFERS"),
                flush=True,
            )
    finally:
        runtime.close()
    native = [r for r in rows if not r["fallback"]]
    total_d = sum(r["distfusion_s"] for r in native)
    total_s = sum(r["spark_sql_s"] for r in native)
    print(
        f"native queries: {len(native)}; summed distfusion {total_d:.2f} s, "
        f"spark-sql {total_s:.2f} s: Spark SQL takes {total_s / total_d:.1f}x distfusion's time"
    )
    for r in rows:
        if r["fallback"]:
            extra_ms = (r["distfusion_s"] - r["spark_sql_s"]) * 1000
            print(
                f"{r['query']}: on Spark SQL, {extra_ms:+.0f} ms over spark.sql ({r['fallback']})"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "date": datetime.date.today().isoformat(),
                    "data": args.data,
                    "runs": args.runs,
                    "master": args.master,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
