"""Single-node DataFusion over a TPC-H query's plan, as planned and after the join rules.

The rules are the planner's passes 3-6 (:func:`distfusion.planner.plan.rewrite_joins`:
semi joins pushed down, filtered dimensions joined first, eager aggregation,
aggregate inputs reduced). A query run in place runs the rewritten plan when
its scans read at least ``in_place_rewrite_bytes``; this measures what that
buys on one node. Both plans run on the coordinator's own DataFusion context,
alternating, ``--runs`` times each; the answers are compared (as sorted
rows). Q15 (a view and two statements) is skipped.

Run (about 2 minutes at SF1, 10 at SF10)::

    .venv/bin/python benchmarks/join_rules_in_place.py --data data/tpch-sf1 --runs 3

Prints one line per query: whether a rule changed the plan, the median
seconds of each plan, and whether the answers agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyarrow as pa
from substrait.proto import Plan

from distfusion import DistributedContext
from distfusion.planner.plan import rewrite_joins
from distfusion.runtime.local import LocalRuntime
from distfusion.substrait_plan.decode import consume_plan
from distfusion.tpch import query, register_tpch


def _rows(batches: list[pa.RecordBatch]) -> list[str]:
    return sorted(map(str, pa.Table.from_batches(batches).to_pylist())) if batches else []


def main() -> None:
    """Time every query of ``--queries`` both ways and print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a TPC-H directory (distfusion datagen)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queries", default=",".join(str(q) for q in range(1, 23) if q != 15))
    args = parser.parse_args()
    ctx = DistributedContext(runtime=LocalRuntime(workers=2))
    register_tpch(ctx, args.data)
    for q in (int(x) for x in args.queries.split(",")):
        df = ctx.sql(query(q))
        data = df._substrait()
        if data is None:
            print(f"Q{q}: no Substrait plan ({df.coordinator_only()})")
            continue
        plan = Plan()
        plan.ParseFromString(data)
        rewrite_joins(plan, ctx.sources, df._planner_config())
        rewritten = plan.SerializeToString()
        after = ctx.ctx.create_dataframe_from_logical_plan(consume_plan(ctx.ctx, rewritten))
        before = ctx.ctx.sql(query(q))
        times: tuple[list[float], list[float]] = ([], [])
        answers = []
        for _ in range(args.runs):
            for i, frame in enumerate((before, after)):
                start = time.perf_counter()
                answers.append(frame.collect())
                times[i].append(time.perf_counter() - start)
        same = _rows(answers[0]) == _rows(answers[1])
        print(
            f"Q{q}: changed={rewritten != data} as planned {statistics.median(times[0]):.3f} s, "
            f"rewritten {statistics.median(times[1]):.3f} s, same answer: {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
