"""What giving freed arena blocks back at once costs: all 22 TPC-H queries, two mimalloc settings.

distfusion sets ``MIMALLOC_ARENA_PURGE_MULT=0`` (``distfusion.allocator``) so a task
memory budget holds in resident memory. This runs the 22 queries back to back on the
local runtime, ``--passes`` times in one process per setting (``0``, then mimalloc's
default ``10``), ``--rounds`` times in turn, and prints per pass the wall seconds, the
process's CPU seconds (user, sys: ``getrusage``), its minor page faults and its peak
resident memory. CPU time is the measure on a shared machine; the first pass of a
process faults everything in under either setting, so compare the later passes.

Usage (docs/memory.md, "Measured: TPC-H SF10 Q18 under a 256 MiB budget")::

    .venv/bin/python benchmarks/arena_purge.py --data /tmp/tpch-sf10 --passes 2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SETTINGS = ("0", "10")


def run_passes(data: str, passes: int) -> None:
    """In this process: the 22 queries ``passes`` times, one JSON line per pass."""
    import distfusion  # noqa: F401  (first: it sets mimalloc's options before DataFusion loads)
    from distfusion import DistributedContext, tpch
    from distfusion.runtime.local import LocalRuntime

    ctx = DistributedContext(runtime=LocalRuntime(workers=2))
    tpch.register_tpch(ctx, data)
    for _ in range(passes):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for q in range(1, 23):
            ctx.sql(tpch.query(q)).to_arrow_table()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        print(
            json.dumps(
                {
                    "wall_s": round(t1 - t0, 2),
                    "user_s": round(r1.ru_utime - r0.ru_utime, 2),
                    "sys_s": round(r1.ru_stime - r0.ru_stime, 2),
                    "minor_faults": r1.ru_minflt - r0.ru_minflt,
                    "peak_rss_gib": round(r1.ru_maxrss / 2**20, 2),
                }
            ),
            flush=True,
        )


def main() -> None:
    """Run each setting in its own process, ``--rounds`` times in turn, and print every pass."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="TPC-H Parquet directory (distfusion datagen)")
    p.add_argument("--passes", type=int, default=2, help="passes of the 22 queries per process")
    p.add_argument("--rounds", type=int, default=2, help="processes per setting, in turn")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_passes(args.data, args.passes)
        return
    for r in range(args.rounds):
        for mult in SETTINGS:
            env = {**os.environ, "MIMALLOC_ARENA_PURGE_MULT": mult}
            cmd = [sys.executable, __file__, "--data", args.data, "--passes", str(args.passes)]
            out = subprocess.run(
                [*cmd, "--child"], env=env, capture_output=True, text=True, check=True
            )
            for i, line in enumerate(out.stdout.split("\n")):
                if line.strip():
                    setting = f"MIMALLOC_ARENA_PURGE_MULT={mult:>2}"
                    print(f"round {r + 1}  {setting}  pass {i + 1}  {line}")


if __name__ == "__main__":
    main()
