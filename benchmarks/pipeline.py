"""A PySpark pipeline through distfusion against the same pipeline in Spark SQL (issue #13).

```
spark.read.parquet(lineitem, orders) -> temp views
  distfusion:  distfusion.spark.sql(spark, Q).to_spark().write.parquet(out)
  write:       distfusion.spark.sql(spark, Q).write_parquet(out)        (no Spark DataFrame)
  spark-sql:   spark.sql(Q).write.parquet(out)
```

Q joins TPC-H ``lineitem`` with ``orders`` and aggregates per order (1.5 M
rows at SF1): an ETL step whose output is as large as a table, which before
``to_spark()`` kept its partitions on the executors went through the driver.
Every pipeline runs once to warm up, then ``--runs`` timed runs interleaved
pipeline by pipeline (machine noise hits all alike), on one SparkSession
(``local[N]``, distfusion's settings). Reported: median wall seconds, the ratio
``distfusion / spark-sql`` measured in the same run (below 1: distfusion is
faster), the peak RSS growth of the Python driver and of Spark's JVM (the
driver JVM, which runs the executors in local mode) and the machine's peak
extra memory per pipeline, and a check that the three outputs hold the same rows
(count and sums, read back with DataFusion).

Run (a few minutes at SF1 on 2 cores)::

    .venv/bin/python benchmarks/pipeline.py --data data/tpch-sf1 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from datafusion import SessionContext

import distfusion.spark
from distfusion.bench import PeakMemory, git_commit
from distfusion.runtime.spark import SparkRuntime

QUERY = """
SELECT l_orderkey, o_custkey, o_orderdate, o_orderpriority,
       sum(l_extendedprice * (1 - l_discount)) AS revenue,
       sum(l_quantity) AS quantity,
       count(*) AS lines
FROM lineitem JOIN orders ON l_orderkey = o_orderkey
GROUP BY l_orderkey, o_custkey, o_orderdate, o_orderpriority
"""

CHECK = "SELECT count(*) AS n, sum(lines) AS lines, sum(o_custkey) AS c, sum(quantity) AS q FROM r"

PIPELINES = ("distfusion", "write", "spark-sql")


def _rss_bytes(pid: str = "self") -> int:
    """Resident memory of process ``pid`` (default: this one), bytes (Linux; 0 if unknown)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak RSS growth of process ``pid`` while a block runs (sampled every 50 ms), bytes."""

    def __init__(self, pid: str = "self") -> None:
        self.pid = pid

    def __enter__(self) -> PeakRss:
        self.base = _rss_bytes(self.pid)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _rss_bytes(self.pid))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.growth_bytes = max(0, self.peak - self.base)


def run_pipeline(name: str, spark, out: str) -> None:
    """One run of pipeline ``name`` writing to directory ``out`` (replaced)."""
    shutil.rmtree(out, ignore_errors=True)
    if name == "distfusion":
        distfusion.spark.sql(spark, QUERY).to_spark().write.parquet(out)
    elif name == "write":
        distfusion.spark.sql(spark, QUERY).write_parquet(out)
    else:
        spark.sql(QUERY).write.parquet(out)


def check(out: str) -> dict:
    """Count and sums of the written files (DataFusion)."""
    ctx = SessionContext()
    ctx.register_parquet("r", out)
    row = ctx.sql(CHECK).to_pylist()[0]
    return {k: str(v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    """Run the pipelines (see the module docstring); 1 when their outputs differ."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="TPC-H Parquet directory (lineitem/, orders/)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per pipeline")
    p.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help="which pipelines to run")
    args = p.parse_args(argv)
    pipelines = [x for x in args.pipelines.split(",") if x]
    runtime = SparkRuntime(master=args.master)
    spark = runtime.spark
    for table in ("lineitem", "orders"):
        spark.read.parquet(os.path.join(args.data, table)).createOrReplaceTempView(table)
    work = tempfile.mkdtemp(prefix="distfusion-pipeline-")
    times: dict[str, list[float]] = {n: [] for n in pipelines}
    rss: dict[str, int] = dict.fromkeys(pipelines, 0)
    jvm_rss: dict[str, int] = dict.fromkeys(pipelines, 0)
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # the JVM PySpark started
    jvm = str(proc.pid) if proc is not None else "0"
    machine: dict[str, int] = dict.fromkeys(pipelines, 0)
    checks: dict[str, dict] = {}
    try:
        for name in pipelines:  # warm-up
            run_pipeline(name, spark, os.path.join(work, name))
            checks[name] = check(os.path.join(work, name))
        for i in range(args.runs):
            for name in pipelines:
                out = os.path.join(work, name)
                with PeakRss() as r, PeakRss(jvm) as j, PeakMemory() as m:
                    start = time.perf_counter()
                    run_pipeline(name, spark, out)
                    elapsed = time.perf_counter() - start
                times[name].append(elapsed)
                rss[name] = max(rss[name], r.growth_bytes)
                jvm_rss[name] = max(jvm_rss[name], j.growth_bytes)
                machine[name] = max(machine[name], m.extra_bytes or 0)
                print(f"run {i + 1} {name}: {elapsed:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        runtime.close()
    medians = {n: statistics.median(t) for n, t in times.items()}
    same = len({json.dumps(c, sort_keys=True) for c in checks.values()}) == 1
    doc = {
        "benchmark": "pipeline",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "data": os.path.abspath(args.data),
        "master": args.master,
        "runs": args.runs,
        "query": " ".join(QUERY.split()),
        "median_s": medians,
        "times_s": times,
        "driver_rss_growth_bytes": rss,
        "jvm_rss_growth_bytes": jvm_rss,
        "machine_extra_bytes": machine,
        "checks": checks,
        "same_rows": same,
    }
    if "spark-sql" in medians:
        doc["ratio_to_spark_sql"] = {
            n: medians[n] / medians["spark-sql"] for n in medians if n != "spark-sql"
        }
    for n in pipelines:
        ratio = doc.get("ratio_to_spark_sql", {}).get(n)
        extra = f"  ratio {ratio:.2f}" if ratio is not None else ""
        print(
            f"{n:>11}: median {medians[n]:.2f} s{extra}  driver RSS +{rss[n] / 2**20:.0f} MiB  "
            f"JVM RSS +{jvm_rss[n] / 2**20:.0f} MiB  machine +{machine[n] / 2**30:.2f} GiB"
        )
    print(f"same rows in every output: {same} {checks[pipelines[0]]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
