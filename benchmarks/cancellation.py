"""How soon a stopped query's DataFusion work stops, on every runtime (issue #14).

A query's stages (all but the head) run in a thread; after ``--after`` seconds
the run is closed, as a coordinator does on Ctrl-C or an error. The figure is
the time from the close until the engine's processes are idle: the start of
the first 0.2 s window in which this process and its descendants (the Flight
workers, Spark's Python workers; never the JVM) use less than 0.02 CPU
seconds together. CPU time, read from ``/proc``, is the work itself, not its
bookkeeping.

Scenarios (``--data``, TPC-H; every stage two tasks, shuffles only):

- ``leaf_agg``: TPC-H Q1's aggregate (four groups), stopped in its leaf
  stage: Parquet scans feed partial aggregates, which yield nothing until
  their scans end (use SF10 data: at SF1 the stage ends within a second);
- ``join_agg``: a join with 1,500 matches per row under a sum, stopped in
  its join stage (the aggregate yields nothing until the join ends);
- ``sort``: lineitem sorted by its comment;
- ``limit``: the ``join_agg`` join without its sum, ``LIMIT 100``, run whole
  (no stop time): the figure is from the result's return until idle, after
  the head stage had its rows and closed the query.

Usage::

    python benchmarks/cancellation.py --runtime local --data data/tpch-sf1 --runs 3

Prints, per scenario and stop time, the CPU use before the stop (cores) and
the seconds to idle of every run, and their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from distfusion import DistributedConfig, DistributedContext, tpch

QUERIES = {
    "leaf_agg": (
        "SELECT l_returnflag, l_linestatus, sum(l_extendedprice * (1 - l_discount)) s, "
        "avg(l_quantity) q FROM lineitem GROUP BY l_returnflag, l_linestatus"
    ),
    "join_agg": (
        "SELECT sum(a.l_quantity * b.l_quantity) AS s FROM (SELECT l_suppkey % 100 AS k, "
        "l_quantity FROM lineitem WHERE l_linenumber = 1) b "
        "JOIN lineitem a ON a.l_suppkey % 100 = b.k"
    ),
    "sort": "SELECT * FROM lineitem ORDER BY l_comment",
    "limit": (
        "SELECT a.l_orderkey, b.l_quantity FROM (SELECT l_suppkey % 100 AS k, "
        "l_quantity FROM lineitem WHERE l_linenumber = 1) b "
        "JOIN lineitem a ON a.l_suppkey % 100 = b.k LIMIT 100"
    ),
}
RUN_WHOLE = {"limit"}
CONFIG = DistributedConfig(
    tasks_per_stage=2, broadcast_threshold_bytes=0, max_broadcast_bytes=0, adaptive=False
)
WINDOW_S = 0.2
IDLE_CPU_S = 0.02
_TICK = os.sysconf("SC_CLK_TCK")


def _engine_pids() -> list[int]:
    """This process and its descendants, JVMs left out (their own threads never run DataFusion)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/comm") as f:
                is_java = f.read().strip() == "java"
        except OSError:
            continue
        if not is_java:
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError):
            continue
    return total


def _cpu_in(seconds: float) -> float:
    pids = _engine_pids()
    start = _cpu_s(pids)
    time.sleep(seconds)
    return _cpu_s(pids) - start


def _seconds_to_idle(t0: float, limit_s: float) -> float:
    while time.monotonic() - t0 < limit_s:
        start = time.monotonic()
        if _cpu_in(WINDOW_S) < IDLE_CPU_S:
            return start - t0
    return float("inf")


def stop_once(runtime, data: str, query: str, after_s: float) -> tuple[float, float, str]:
    """Run ``query``'s stages and close the run after ``after_s`` seconds.

    Returns:
        (cores busy just before the close, seconds to idle, how the run ended).
    """
    ctx = DistributedContext(runtime=runtime, config=CONFIG)
    tpch.register_tpch(ctx, data)
    graph = ctx.sql(query).stage_graph()
    run = runtime.start_query(graph.query_id)
    ended: list[str] = []

    def go() -> None:
        try:
            run.run_stages(graph, [s.stage_id for s in graph.stages[:-1]])
            ended.append("finished")
        except BaseException as exc:  # the cancellation, expected
            ended.append(type(exc).__name__)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    time.sleep(after_s)
    busy = _cpu_in(0.5) / 0.5
    t0 = time.monotonic()
    run.close()
    idle = _seconds_to_idle(t0, 60.0)
    thread.join(60)
    return busy, idle, ended[0] if ended else "running"


def run_whole(runtime, data: str, query: str) -> tuple[float, float, str]:
    """Run ``query`` to its result; returns (0, seconds from the result to idle, rows)."""
    ctx = DistributedContext(runtime=runtime, config=CONFIG)
    tpch.register_tpch(ctx, data)
    rows = ctx.sql(query).to_arrow_table().num_rows
    t0 = time.monotonic()
    return 0.0, _seconds_to_idle(t0, 60.0), f"finished with {rows} rows"


def _runtime(name: str, workers: int):
    """The runtime to measure; closing it stops what it started (workers, Spark)."""
    if name == "local":
        from distfusion.runtime.local import LocalRuntime

        return LocalRuntime(workers=workers)
    if name == "flight":
        from distfusion.runtime.flight import FlightRuntime

        return FlightRuntime.with_local_workers(workers)
    from distfusion.runtime.spark import SparkRuntime

    return SparkRuntime(master=f"local[{workers}]")


def main() -> None:
    """Measure every scenario on one runtime and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runtime", choices=["local", "flight", "spark"], default="local")
    parser.add_argument("--data", required=True, help="TPC-H Parquet directory")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--after", default="1,3", help="seconds before the stop, comma-separated")
    parser.add_argument(
        "--scenarios", default=",".join(QUERIES), help="comma-separated, of " + ", ".join(QUERIES)
    )
    args = parser.parse_args()
    runtime = _runtime(args.runtime, args.workers)
    try:
        if args.runtime == "spark":  # start the Python workers before timing
            ctx = DistributedContext(runtime=runtime, config=CONFIG)
            tpch.register_tpch(ctx, args.data)
            ctx.sql(tpch.query(6)).to_arrow_table()
        for name in args.scenarios.split(","):
            query = QUERIES[name]
            whole = name in RUN_WHOLE
            for after in [0.0] if whole else (float(a) for a in args.after.split(",")):
                if whole:
                    runs = [run_whole(runtime, args.data, query) for _ in range(args.runs)]
                else:
                    runs = [stop_once(runtime, args.data, query, after) for _ in range(args.runs)]
                idles = [r[1] for r in runs]
                shown = ", ".join(f"{i:.2f}" for i in idles)
                print(
                    f"{args.runtime:6s} {name:9s} "
                    + ("run whole" if whole else f"stopped at {after:g} s")
                    + ": "
                    f"busy {statistics.median(r[0] for r in runs):.2f} cores, "
                    f"idle after {shown} s (median {statistics.median(idles):.2f} s); "
                    f"ended: {', '.join(sorted({r[2] for r in runs}))}",
                    flush=True,
                )
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
