"""The PySpark drop-in against Spark SQL on the same session: TPC-H or TPC-DS in Spark's dialect.

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
A query Spark itself fails (TPC-DS q30 reads a column tpcgen-cli names
otherwise) is reported, and must fail in distfusion too.

Run (TPC-H about ten minutes at SF1 on 2 cores, TPC-DS about an hour)::

    .venv/bin/python benchmarks/spark_sql_dropin.py --data data/tpch-sf1 --runs 3 --json out.json
    .venv/bin/python benchmarks/spark_sql_dropin.py --suite tpcds --data data/tpcds-sf1 --runs 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import distfusion.spark
from distfusion import tpcds, tpch
from distfusion.runtime.spark import SparkRuntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.compare
from tests.compare import assert_same_answer  # noqa: E402

# Queries distfusion hands to Spark SQL (an approximate percentile, a FLOAT rounded):
# the hand-over's cost over Spark's own time.
FALLBACK_QUERIES = {
    "fb-percentile": (
        "SELECT o_orderpriority, percentile_approx(o_totalprice, 0.5) AS p FROM orders "
        "GROUP BY 1 ORDER BY 1"
    ),
    "fb-round-float": (
        "SELECT round(CAST(o_totalprice AS FLOAT), 1) AS r FROM orders "
        "WHERE o_orderkey < 1000 ORDER BY 1"
    ),
}


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _same(got, expected, sql: str) -> bool:
    """Names, types and rows equal: tests/compare.py's ``assert_same_answer``."""
    try:
        assert_same_answer(got, expected, sql)
    except AssertionError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print a table and optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("tpch", "tpcds"), default="tpch")
    p.add_argument("--data", required=True, help="Parquet directory (distfusion datagen <suite>)")
    p.add_argument("--queries", help="comma-separated query names (default: all)")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (default: %(default)s)")
    p.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    runtime = SparkRuntime(master=args.master)
    spark = runtime.spark
    if args.suite == "tpch":
        for table in tpch.TABLES:
            spark.read.parquet(tpch.table_path(args.data, table)).createOrReplaceTempView(table)
        queries = {f"q{q}": tpch.query(q) for q in range(1, 23) if q != 15}
        queries.update(FALLBACK_QUERIES)
    else:
        tpcds.spark_views(spark, args.data)
        queries = {name: tpcds.query(name) for name in tpcds.QUERIES}
    if args.queries:
        queries = {n: queries[n] for n in args.queries.split(",")}
    engines = {
        "distfusion": lambda sql: distfusion.spark.sql(
            spark, sql, runtime=runtime
        ).to_arrow_table(),
        "spark-sql": lambda sql: spark.sql(sql).toArrow(),
    }
    rows = []
    try:
        for name, sql in queries.items():
            try:
                expected = engines["spark-sql"](sql)  # warm-up
            except Exception as exc:  # Spark's own error: distfusion must fail too
                try:
                    engines["distfusion"](sql)
                    failed_too = False
                except Exception:
                    failed_too = True
                first = str(exc).strip().splitlines()[0][:120]
                rows.append({"query": name, "spark_error": first, "distfusion_fails": failed_too})
                print(f"{name:>16} Spark fails ({first}); distfusion fails too: {failed_too}")
                continue
            fallback = distfusion.spark.sql(spark, sql, runtime=runtime).fallback
            got = engines["distfusion"](sql)
            same = _same(got, expected, sql)
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
    timed = [r for r in rows if "spark_error" not in r]
    native = [r for r in timed if not r["fallback"]]
    print(f"answers equal: {sum(r['answer_equal'] for r in timed)} of {len(timed)}")
    total_d = sum(r["distfusion_s"] for r in native)
    total_s = sum(r["spark_sql_s"] for r in native)
    print(
        f"native queries: {len(native)}; summed distfusion {total_d:.2f} s, "
        f"spark-sql {total_s:.2f} s: Spark SQL takes {total_s / total_d:.1f}x distfusion's time"
    )
    for r in timed:
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
                    "suite": args.suite,
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
