"""Peak memory of one TPC-H query under a task memory budget, in a fresh process.

Runs the query once on the runtime given, in this process, and prints the
process's peak resident memory over its level just before the query (the
"peak RSS increase"): the kernel's high-water mark (``VmHWM``), reset just
before the query through ``/proc/self/clear_refs`` (Linux), so no sampling
misses a short peak. Also prints the seconds, the rows, what DataFusion's
operators and the exchange buffers spilled, and the tasks that ran again
over their budget (the worker's warnings).

Usage (docs/memory.md, "Measured: a 256 MiB budget holds")::

    .venv/bin/python benchmarks/memory_budget_peak.py --data /tmp/tpch-sf10 --query 18 \
        --memory-per-task 256MiB --runs 3

``--runs N`` starts N processes in turn and prints each, then the median.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time

GIB = 1024**3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    msg = f"no {field} in /proc/self/status"
    raise RuntimeError(msg)


def run_once(args: argparse.Namespace) -> dict:
    """Run the query once in this process; the measures as a dict."""
    import distfusion
    from distfusion import DistributedConfig, DistributedContext, tpch
    from distfusion.runtime.local import LocalRuntime
    from distfusion.worker.memory import parse_bytes

    budget = parse_bytes(args.memory_per_task)
    runtime = LocalRuntime(workers=args.workers)
    extra = {"unbounded_retry": True} if args.unbounded_retry else {}
    config = DistributedConfig(memory_per_task_bytes=budget, **extra)
    runs_again = []
    handler = logging.Handler()
    handler.emit = lambda r: (
        runs_again.append(r.getMessage()) if "again" in r.getMessage() else None
    )
    logging.getLogger("distfusion").addHandler(handler)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, args.data)
    df = ctx.sql(tpch.query(args.query))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    error = None
    rows = 0
    try:
        rows = df.to_arrow_table().num_rows
    except distfusion.DistfusionError as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    stats = runtime.stats().values()
    out = {
        "seconds": round(seconds, 2),
        "rows": rows,
        "error": error,
        "rss_before_gib": round(before / 2**20, 3),
        "peak_increase_gib": round((peak - before) / 2**20, 3),
        "spilled_bytes": sum(s["spilled_bytes"] for s in stats),
        "output_spilled_bytes": sum(s["output_spilled_bytes"] for s in stats),
        "runs_again": [m[:160] for m in runs_again],
    }
    runtime.close()
    return out


def main() -> None:
    """Parse the arguments; run each measure in a process of its own."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--query", type=int, default=18)
    parser.add_argument("--memory-per-task", default="256MiB")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--unbounded-retry", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_once(args)))
        return
    peaks = []
    for _ in range(args.runs):
        argv = [sys.executable, __file__, *sys.argv[1:], "--child"]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(result), flush=True)
        peaks.append(result["peak_increase_gib"])
    print(f"median peak RSS increase: {statistics.median(peaks):.2f} GiB")


if __name__ == "__main__":
    main()
