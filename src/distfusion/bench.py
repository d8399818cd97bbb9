"""``distfusion bench tpch``: distfusion against its peers, measured in the same run.

For every query, each engine runs once to warm up (file caches, JIT-free but
allocator and OS caches), then ``runs`` timed runs, interleaved engine by engine
so that machine noise hits all of them alike. Reported: the median wall time
(seconds) per query and engine, the sum of medians as the total, and each
peer's ratio to distfusion (``ratio = distfusion / peer``; below 1 means
distfusion is faster). The peers are single-node DataFusion on the same files
(always) plus whatever the runtime adds (:func:`peers_for`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from distfusion import tpch

__all__ = ["run_tpch_bench", "peers_for"]

Runner = Callable[[str], int]
"""Runs one SQL text to completion; returns the result's row count."""


def _datafusion_runner(data_dir: str) -> Runner:
    from datafusion import SessionContext

    from distfusion.context import plan_statements

    ctx = SessionContext()
    tpch.register_tpch(ctx, data_dir)
    return lambda sql: plan_statements(ctx, sql).to_arrow_table().num_rows


def _spark_sql_runner(spark, data_dir: str) -> Runner:
    """Spark SQL on distfusion's SparkSession, the same files as temp views.

    The result is collected on the driver as Arrow (``DataFrame.toArrow()``), as
    distfusion's is. Q15's ``create view`` becomes a temporary view (Spark does
    not let a permanent view read temporary ones).
    """
    import re

    from distfusion.context import split_statements

    for table in tpch.TABLES:
        spark.read.parquet(tpch.table_path(data_dir, table)).createOrReplaceTempView(table)

    def run(sql: str) -> int:
        rows = 0
        for stmt in split_statements(sql):
            stmt = re.sub(r"(?i)^create view", "CREATE OR REPLACE TEMPORARY VIEW", stmt)
            stmt = re.sub(r"(?i)^drop view", "DROP VIEW IF EXISTS", stmt)
            df = spark.sql(stmt)
            if df.columns:
                rows = df.toArrow().num_rows
        return rows

    return run


def peers_for(runtime_name: str, runtime, data_dir: str) -> dict[str, Runner]:
    """Peers measured next to distfusion: single-node DataFusion, plus per-runtime ones.

    The Spark runtime adds Spark SQL on the same SparkSession (``spark-sql``).

    Returns:
        Peer name -> runner, in display order.
    """
    peers = {"datafusion": _datafusion_runner(data_dir)}
    if runtime_name == "spark":
        peers["spark-sql"] = _spark_sql_runner(runtime.spark, data_dir)
    return peers


def _time(run: Runner, sql: str) -> tuple[float, int]:
    start = time.perf_counter()
    rows = run(sql)
    return time.perf_counter() - start, rows


def _shape(graph) -> str:
    """``graph`` in a few words: stages and tasks, and whether it ran on the coordinator only."""
    if len(graph.stages) == 1:
        return "1 stage: the whole query on the coordinator"
    tasks = sum(s.num_tasks for s in graph.stages)
    return f"{len(graph.stages)} stages, {tasks} tasks"


def run_tpch_bench(args, queries: list[int], console: Console | None = None) -> dict:
    """Run the benchmark described by CLI ``args`` over ``queries``; print and return it.

    Returns:
        ``{"queries": {q: {engine: median_s}}, "total": {engine: s}}``.

    Raises:
        RuntimeError: an engine returned a different row count than DataFusion.
    """
    from distfusion.cli import make_runtime
    from distfusion.context import DistributedContext

    console = console or Console()
    runtime = make_runtime(args.runtime, args.workers, args)
    with DistributedContext(runtime=runtime) as ctx:
        tpch.register_tpch(ctx, args.data)

        def distfusion_run(sql: str) -> int:
            return ctx.sql(sql).to_arrow_table().num_rows

        peers = peers_for(args.runtime, runtime, args.data)
        engines: dict[str, Runner] = {"distfusion": distfusion_run, **peers}
        console.print(
            f"TPC-H at {args.data}: distfusion on the {args.runtime} runtime "
            f"({runtime.num_workers()} workers) vs {', '.join(peers)}; "
            f"{args.runs} timed runs per query, medians in seconds"
        )
        results: dict[int, dict[str, float]] = {}
        for q in queries:
            sql = tpch.query(q)
            times: dict[str, list[float]] = {e: [] for e in engines}
            rows = {e: _time(run, sql)[1] for e, run in engines.items()}  # warm-up
            if len(set(rows.values())) != 1:
                msg = f"Q{q}: engines disagree on the row count: {rows}"
                raise RuntimeError(msg)
            for _ in range(args.runs):
                for e, run in engines.items():
                    times[e].append(_time(run, sql)[0])
            results[q] = {e: statistics.median(t) for e, t in times.items()}
            line = "  ".join(f"{e} {m:.3f}" for e, m in results[q].items())
            shape = _shape(ctx.sql(sql).stage_graph())
            console.print(f"Q{q:<2} {line}  ({shape})")
    totals = {e: sum(r[e] for r in results.values()) for e in engines}
    table = Table("query", *[f"{e} (s)" for e in engines], *[f"distfusion / {p}" for p in peers])
    for q, r in results.items():
        table.add_row(
            f"Q{q}",
            *[f"{r[e]:.3f}" for e in engines],
            *[f"{r['distfusion'] / r[p]:.2f}x" for p in peers],
        )
    table.add_row(
        "total",
        *[f"{totals[e]:.3f}" for e in engines],
        *[f"{totals['distfusion'] / totals[p]:.2f}x" for p in peers],
        style="bold",
    )
    console.print(table)
    return {"queries": results, "total": totals}
