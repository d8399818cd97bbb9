"""Queries small enough run in place: single-node DataFusion on the coordinator, unplanned.

The bound is the bytes a query's scans read (projected columns,
``scanned_bytes``), against ``DistributedConfig.in_place_bytes`` or the
runtime's ``RuntimeProfile.in_place_bytes`` (320 MiB a core where the workers
share the coordinator's cores). Real DataFusion, the local runtime, TPC-H SF0.1.
"""

from __future__ import annotations

import os

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.cli import main as cli_main
from distfusion.coordinator.checks import scanned_bytes
from distfusion.planner.config import (
    IN_PLACE_BYTES,
    IN_PLACE_BYTES_PER_CORE,
    RuntimeProfile,
    in_place_bytes,
)
from distfusion.runtime.local import LocalRuntime
from distfusion.tpch import query, register_tpch
from tests.compare import assert_same_result, is_ordered, oracle_result

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _context(tpch_dir, **config):
    ctx = DistributedContext(runtime=LocalRuntime(workers=2), config=DistributedConfig(**config))
    register_tpch(ctx, str(tpch_dir))
    return ctx


def test_scanned_bytes_are_the_projected_columns_of_every_scan(tpch_dir):
    ctx = _context(tpch_dir)
    lineitem, orders = ctx.sources["lineitem"], ctx.sources["orders"]
    df = ctx.sql(
        "SELECT l_orderkey FROM lineitem WHERE l_quantity > 49 "
        "UNION ALL SELECT l_orderkey FROM lineitem"
    )
    read = scanned_bytes(df.df, ctx.sources)
    one = lineitem.projected_bytes(["l_orderkey", "l_quantity"])
    two = lineitem.projected_bytes(["l_orderkey"])
    assert read == {"lineitem": one + two}, "both scans, each its own columns"
    assert 0 < two < one < lineitem.size_bytes
    read = scanned_bytes(ctx.sql("SELECT * FROM orders").df, ctx.sources)
    assert read == {"orders": orders.projected_bytes(orders.schema.names)}, "every column"


def test_the_bound_follows_the_cores_the_workers_share():
    assert in_place_bytes() == IN_PLACE_BYTES_PER_CORE * CORES  # threads of this process
    assert in_place_bytes(CORES) == IN_PLACE_BYTES_PER_CORE * CORES  # Spark local[cores]
    assert in_place_bytes(1) == IN_PLACE_BYTES_PER_CORE  # local[1]: one core's worth
    assert in_place_bytes(CORES + 1) == IN_PLACE_BYTES  # a cluster adds cores
    assert RuntimeProfile().in_place_bytes == IN_PLACE_BYTES
    assert LocalRuntime(workers=2).profile().in_place_bytes == in_place_bytes()


def test_a_query_within_the_bound_runs_in_place_and_answers_as_datafusion(tpch_dir, oracle):
    # Q9 at SF0.1 reads ~47 MiB of projected columns: within the local runtime's
    # bound, over the 16 MiB of a runtime whose workers add cores.
    ctx = _context(tpch_dir)
    df = ctx.sql(query(9))
    assert IN_PLACE_BYTES < sum(scanned_bytes(df.df, ctx.sources).values()) <= in_place_bytes()
    assert_same_result(df.to_arrow_table(), oracle.sql(query(9)).to_arrow_table(), True)
    assert df.coordinator_only() is None, "a query that distributes"
    assert df.metrics().stages == (), "yet no stage ran: it was never planned"
    said = df.runs_in_place()
    assert said is not None and "640.0 MiB" in said or CORES != 2
    # explain() says so above the stages in_place_bytes=0 would run; after the
    # run, that it ran in place, not a stage count with no metrics.
    first, *rest = df.explain().splitlines()
    assert first.startswith("runs in place on the coordinator") and rest[0].startswith("Stage")
    analyzed = df.explain(analyze=True).splitlines()
    assert (
        analyzed[-1].startswith("Query ") and " ran in place on the coordinator: " in analyzed[-1]
    )
    assert not any(line.endswith("across network boundaries") for line in analyzed)


@pytest.mark.parametrize("config", [{"in_place_bytes": IN_PLACE_BYTES}, {"in_place_bytes": 0}])
def test_a_query_over_the_configured_bound_is_distributed(tpch_dir, oracle, config):
    ctx = _context(tpch_dir, **config)
    df = ctx.sql(query(9))
    assert_same_result(df.to_arrow_table(), oracle.sql(query(9)).to_arrow_table(), True)
    stages = df.metrics().stages  # head first
    assert len(stages) > 1, "planned into stages"
    assert "coordinator" not in {t.worker for s in stages[1:] for t in s.tasks}
    assert df.runs_in_place() is None
    assert "in place" not in df.explain() + df.explain_run()


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="in_place_bytes must be"):
        DistributedConfig(in_place_bytes=-1)
    with pytest.raises(ValueError, match="in_place_rewrite_bytes must be"):
        DistributedConfig(in_place_rewrite_bytes=-1)


REWRITTEN = "its plan rewritten by the planner's join rules"


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch_in_place_over_the_join_rules_answers_as_datafusion(tpch_dir, oracle, q):
    ctx = _context(tpch_dir, in_place_rewrite_bytes=0)
    df = ctx.sql(tpch.query(q))
    assert_same_result(
        df.to_arrow_table(), oracle_result(oracle, tpch.query(q)), is_ordered(tpch.query(q))
    )
    assert df.metrics().stages == (), "in place: never planned"


def test_in_place_queries_over_the_bound_run_the_join_rules(tpch_dir):
    # Q17 and Q18: eager aggregation of lineitem per key (aggregate_before_join);
    # Q1 has no join: the rules change nothing, and DataFusion's own plan runs.
    ctx = _context(tpch_dir, in_place_rewrite_bytes=0)
    for q, rewritten in [(17, True), (18, True), (1, False)]:
        df = ctx.sql(query(q))
        said = df.runs_in_place()
        assert said is not None and (REWRITTEN in said) == rewritten, (q, said)
        assert (REWRITTEN in df.explain().splitlines()[0]) == rewritten
    # The default bound (64 MiB) is over what Q17 reads at SF0.1 (~38 MiB); None: never.
    for config in [{}, {"in_place_rewrite_bytes": None}]:
        df = _context(tpch_dir, **config).sql(query(17))
        assert sum(scanned_bytes(df.df, df.context.sources).values()) < 64 * 1024 * 1024
        assert REWRITTEN not in df.runs_in_place(), config


@pytest.mark.parametrize(
    ("sql", "bound", "in_place"),
    [
        (query(9), None, True),
        (query(9), "0", False),
        # Run whole on the coordinator (no Substrait for it), not in place: no stage either.
        (
            "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) "
            "SELECT count(*) FROM t, nation",
            "0",
            False,
        ),
    ],
)
def test_the_cli_says_when_a_query_ran_in_place(tpch_dir, capsys, sql, bound, in_place):
    args = ["query", sql, "--tpch", str(tpch_dir), "--runtime", "local", "--workers", "2"]
    code = cli_main(args + (["--in-place-bytes", bound] if bound else []))
    out = capsys.readouterr().out
    assert code == 0
    assert ("ran in place" in out) == in_place, out.splitlines()[-1]
