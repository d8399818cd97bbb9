"""Seeing what a distributed query did: EXPLAIN [ANALYZE], metrics, pictures, Spark names, progress.

Every test runs real queries over TPC-H (scale factor 0.1) on the real
runtimes: in-process workers, the session's Flight worker processes and the
session's embedded Spark (``local[2]``), and checks the metrics against what
the query returned and what single-node DataFusion counts.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from html.parser import HTMLParser

import pydot
import pytest
from rich.console import Console

from distfusion import (
    DistributedConfig,
    DistributedContext,
    Distribution,
    OperatorMetrics,
    QueryMetrics,
    TaskMetrics,
    tpch,
)
from distfusion.cli import main as cli_main
from distfusion.display import with_progress
from distfusion.metrics import QueryObserver, observing
from distfusion.runtime.spark import job_group
from distfusion.stages import SHUFFLE
from tests.conftest import REPO

RUNTIMES = [("local", 3), ("flight", 3), ("spark", 2)]
QUERIES = [1, 3, 5, 6, 10]
GROUP_BY = "SELECT l_suppkey, sum(l_quantity) AS q, count(*) AS n FROM lineitem GROUP BY l_suppkey"


@pytest.fixture(params=RUNTIMES, ids=[name for name, _ in RUNTIMES])
def ctx(request, runtime_for, tpch_dir) -> DistributedContext:
    name, workers = request.param
    ctx = DistributedContext(
        runtime=runtime_for(name, workers), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _spark_ctx(runtime_for, tpch_dir) -> DistributedContext:
    ctx = DistributedContext(
        runtime=runtime_for("spark", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _check_every_task(metrics: QueryMetrics, graph) -> None:
    """One metrics entry per task of every stage of the graph that ran, each measured."""
    assert [s.stage_id for s in metrics.stages] == [s.stage_id for s in reversed(graph.stages)]
    for stage, sm in zip(reversed(graph.stages), metrics.stages, strict=True):
        assert sm.num_tasks == stage.num_tasks
        assert [t.task_index for t in sm.tasks] == list(range(stage.num_tasks)), sm.stage_id
        for t in sm.tasks:
            assert t.stage_id == stage.stage_id
            assert t.worker
            assert t.elapsed_s > 0
            assert t.cpu_s >= 0
            assert len(t.input_rows) == len(stage.inputs)
        assert sm.output_rows == sum(t.output_rows for t in sm.tasks)


# ---------------------------------------------------------------------- EXPLAIN in SQL
@pytest.mark.parametrize("q", QUERIES)
def test_explain_returns_the_distributed_plan_as_rows(ctx, q):
    table = ctx.sql("EXPLAIN " + tpch.query(q)).to_arrow_table()
    assert table.schema.names == ["plan_type", "plan"]
    rows = table.to_pylist()
    assert [r["plan_type"] for r in rows] == ["logical_plan", "distributed_plan"]
    assert rows[1]["plan"] == ctx.sql(tpch.query(q)).explain()
    assert rows[0]["plan"] == ctx.sql(tpch.query(q)).df.optimized_logical_plan().display_indent()


@pytest.mark.parametrize("q", QUERIES)
def test_explain_analyze_runs_the_query_and_shows_every_stage_with_metrics(ctx, oracle, q):
    df = ctx.sql("EXPLAIN ANALYZE " + tpch.query(q))
    rows = df.to_arrow_table().to_pylist()
    assert [r["plan_type"] for r in rows] == ["Plan with Metrics"]
    text = rows[0]["plan"]
    expected_rows = oracle.sql(tpch.query(q)).count()
    runtime = ctx.runtime.name
    assert text.startswith(
        f"Query {df.metrics().query_id[:8]} on {runtime}: {expected_rows:,} rows"
    )
    lines = text.splitlines()
    headers = [i for i, ln in enumerate(lines) if ln.startswith("Stage ")]
    graph = df.inner._ran_graph()
    assert len(headers) == len(graph.stages)
    for i in headers:
        assert lines[i + 1].startswith("  metrics: "), lines[i : i + 2]
    assert df.metrics().rows == expected_rows
    _check_every_task(df.metrics(), graph)


def test_explain_verbose_shows_each_stage_physical_plan(ctx):
    plan = ctx.sql("EXPLAIN VERBOSE " + tpch.query(3)).to_pylist()[1]["plan"]
    graph = ctx.sql(tpch.query(3)).stage_graph()
    assert "Physical plans (task 0 of each stage, planned here):" in plan
    for stage in graph.stages:
        assert f"  Stage {stage.stage_id}:" in plan
    assert "DataSourceExec" in plan


def test_explain_analyze_verbose_lists_tasks_and_operator_metrics(ctx):
    df = ctx.sql(GROUP_BY)
    text = df.explain(analyze=True, verbose=True)
    metrics = df.metrics()
    for sm in metrics.stages:
        for t in sm.tasks:
            assert f"task {t.task_index} on {t.worker}: {t.output_rows:,} rows" in text
    assert "physical plan (" in text and "output_rows=" in text and "elapsed_compute=" in text


def test_explain_format_is_checked(ctx):
    with pytest.raises(ValueError, match="format"):
        ctx.sql("SELECT 1").explain(format="svg")
    with pytest.raises(ValueError, match="FORMAT JSON"):
        ctx.sql("EXPLAIN FORMAT JSON SELECT 1")


def test_show_of_an_explain_prints_the_plan_not_the_rows(ctx, capsys):
    """As DataFusion's ``show()`` of an EXPLAIN: the rows ``(plan_type, plan)``."""
    sql = "SELECT n_nationkey * 1000003 AS k FROM nation WHERE n_nationkey = 7"
    ctx.sql("EXPLAIN " + sql).show()
    out = capsys.readouterr().out
    assert "plan_type" in out and "Stage" in out and "7000021" not in out, out
    df = ctx.sql("EXPLAIN ANALYZE " + sql)
    df.show()
    out = capsys.readouterr().out
    assert "plan_type" in out and "Stage" in out and "7000021" not in out, out
    assert df.metrics().rows == 1  # ANALYZE ran the query, for its metrics
    assert f"Query {df.metrics().query_id[:8]}" in out


# ---------------------------------------------------------------------- metrics
def test_metrics_add_up_to_what_the_query_returned(ctx):
    df = ctx.sql(GROUP_BY)
    table = df.to_arrow_table()
    metrics = df.metrics()
    graph = df._ran_graph()
    assert metrics.runtime == ctx.runtime.name
    assert metrics.rows == table.num_rows
    assert metrics.stage(graph.head.stage_id).output_rows == table.num_rows
    _check_every_task(metrics, graph)


def test_shuffle_moves_every_row_the_producer_made(ctx):
    df = ctx.sql(GROUP_BY)
    df.collect()
    metrics = df.metrics()
    shuffles = [b for b in metrics.boundaries if b.kind == SHUFFLE]
    assert shuffles, df.explain()
    for b in shuffles:
        producer = metrics.stage(b.producer_stage_id)
        assert b.rows == producer.output_rows > 0
        assert b.bytes > 0
    # every boundary's consumer read what its producer made (no broadcast here)
    for b in metrics.boundaries:
        assert b.rows == metrics.stage(b.producer_stage_id).output_rows
    assert metrics.bytes_moved == sum(b.bytes for b in metrics.boundaries) > 0


def test_leaf_stage_rows_equal_single_node_counts(ctx, oracle):
    sql = "SELECT l_orderkey, l_quantity FROM lineitem WHERE l_quantity < 5"
    df = ctx.sql(sql)
    df.collect()
    metrics = df.metrics()
    graph = df._ran_graph()
    leaves = [s for s in graph.stages if s.is_leaf and s is not graph.head]
    assert leaves, df.explain()
    expected = oracle.sql(sql).count()
    assert sum(metrics.stage(s.stage_id).output_rows for s in leaves) == expected
    # DataFusion's own scan metrics, summed over the leaf tasks of a scan that
    # filters nothing: every row of the table
    df = ctx.sql("SELECT o_orderpriority, count(*) FROM orders GROUP BY 1")
    df.collect()
    graph = df._ran_graph()
    (leaf,) = [s for s in graph.stages if s.is_leaf]
    scanned = sum(
        op.output_rows
        for t in df.metrics().stage(leaf.stage_id).tasks
        for op in t.operators
        if op.operator.startswith("DataSourceExec")
    )
    assert scanned == oracle.sql("SELECT count(*) FROM orders").to_pylist()[0]["count(*)"]
    assert df.metrics().stage(leaf.stage_id).source_bytes > 0


def test_operator_metrics_off_keeps_task_sizes_and_drops_operators(ctx, tpch_dir):
    on = ctx.sql(GROUP_BY)
    on.collect()
    quiet = DistributedContext(
        runtime=ctx.runtime,
        config=DistributedConfig(tasks_per_stage=2, operator_metrics=False),
    )
    tpch.register_tpch(quiet, tpch_dir)
    off = quiet.sql(GROUP_BY)
    assert sorted(off.to_arrow_table().to_pylist(), key=str) == sorted(
        on.to_arrow_table().to_pylist(), key=str
    )
    assert all(t.operators for sm in on.metrics().stages for t in sm.tasks)
    for sm in off.metrics().stages:
        assert sm.tasks and all(t.operators == () for t in sm.tasks)
    assert off.metrics().rows == on.metrics().rows
    assert [sm.output_rows for sm in off.metrics().stages] == [
        sm.output_rows for sm in on.metrics().stages
    ]


def test_stage_spread_is_min_median_max_over_tasks(ctx):
    df = ctx.sql(GROUP_BY)
    df.collect()
    for sm in df.metrics().stages:
        times = sorted(t.elapsed_s for t in sm.tasks)
        assert sm.task_elapsed_s.min == times[0]
        assert sm.task_elapsed_s.max == times[-1]
        assert times[0] <= sm.task_elapsed_s.median <= times[-1]
        assert sm.task_output_rows.sum == sm.output_rows


def test_spark_shuffle_plane_returns_metrics_too(runtime_for, tpch_dir):
    ctx = _spark_ctx(runtime_for, tpch_dir)
    runtime = ctx.runtime
    runtime.data_plane = "shuffle"
    try:
        df = ctx.sql(GROUP_BY)
        table = df.to_arrow_table()
    finally:
        runtime.data_plane = "flight"
    metrics = df.metrics()
    graph = df._ran_graph()
    assert metrics.stage(graph.head.stage_id).output_rows == table.num_rows
    _check_every_task(metrics, graph)
    for b in metrics.boundaries:
        assert b.rows == metrics.stage(b.producer_stage_id).output_rows
        assert b.bytes > 0


def test_metrics_before_a_run_are_none(ctx):
    assert ctx.sql(GROUP_BY).metrics() is None


# ---------------------------------------------------------------------- pictures
def test_dot_is_a_digraph_with_one_node_per_stage(ctx):
    df = ctx.sql(tpch.query(3))
    before = pydot.graph_from_dot_data(df.explain(format="dot"))
    df.collect()
    dot = df.explain(format="dot")
    (graph_dot,) = pydot.graph_from_dot_data(dot)
    assert len(before) == 1
    assert graph_dot.get_type() == "digraph"
    graph = df._ran_graph()
    nodes = {n.get_name() for n in graph_dot.get_nodes() if n.get_name().startswith("stage_")}
    assert nodes == {f"stage_{s.stage_id}" for s in graph.stages}
    edges = {(e.get_source(), e.get_destination()) for e in graph_dot.get_edges()}
    assert edges == {
        (f"stage_{i.stage_id}", f"stage_{s.stage_id}") for s in graph.stages for i in s.inputs
    }
    for e in graph_dot.get_edges():
        label = e.get_label()
        assert any(k in label for k in ("shuffle", "coalesce", "broadcast")), label
        assert "rows" in label  # after a run: what crossed


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stages: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        if tag == "tr" and dict(attrs).get("data-stage"):
            self.stages.append(dict(attrs)["data-stage"])

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()


def test_html_has_every_stage(ctx):
    df = ctx.sql(tpch.query(5))
    df.collect()
    parser = _Cells()
    parser.feed(df.explain_run(format="html"))
    parser.close()
    assert parser.stack == []
    graph = df._ran_graph()
    assert sorted(map(int, parser.stages)) == sorted(s.stage_id for s in graph.stages)


def test_cli_explain_analyze_and_dot(tpch_dir, tmp_path, capsys):
    dot = tmp_path / "plan.dot"
    code = cli_main(
        [
            "query",
            tpch.query(3),
            "--tpch",
            str(tpch_dir),
            "--runtime",
            "local",
            "--workers",
            "2",
            "--explain-analyze",
            "--dot",
            str(dot),
            "--in-place-bytes",  # planned and distributed, however small
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "on local:" in out and "  metrics: " in out
    (graph,) = pydot.graph_from_dot_data(dot.read_text())
    assert graph.get_type() == "digraph"
    assert any(n.get_name().startswith("stage_") for n in graph.get_nodes())


# ---------------------------------------------------------------------- Spark UI names
@pytest.mark.parametrize("plane", ["flight", "shuffle"])
def test_every_spark_job_names_the_query_and_its_stages(runtime_for, tpch_dir, plane):
    ctx = _spark_ctx(runtime_for, tpch_dir)
    runtime = ctx.runtime
    runtime.data_plane = plane
    try:
        df = ctx.sql(tpch.query(5))
        df.collect()
    finally:
        runtime.data_plane = "flight"
    query_id = df.metrics().query_id
    sc = runtime.sc
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(job_group(query_id))
    assert jobs
    prefix = f"distfusion query {query_id[:8]} stage"
    store = sc._jsc.sc().statusStore()
    for job_id in jobs:
        description = store.job(job_id).description()
        assert description.isDefined() and description.get().startswith(prefix), job_id
        for stage_id in tracker.getJobInfo(job_id).stageIds:
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                assert info.name.startswith(prefix), info.name


# ---------------------------------------------------------------------- progress
def test_progress_line_on_spark(runtime_for, tpch_dir):
    ctx = _spark_ctx(runtime_for, tpch_dir)
    graph = ctx.sql(tpch.query(5)).stage_graph()
    observer = QueryObserver(graph.query_id)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with observing(observer):
        batches = list(with_progress(ctx.runtime.execute(graph), observer, console, every_s=0.05))
    assert sum(b.num_rows for b in batches) > 0
    assert "distfusion: stages " in out.getvalue()
    observer.refresh()
    done = observer.progress()
    assert done.stages_done == done.stages_total == len(graph.stages)
    assert done.tasks_done == done.tasks_total == sum(s.num_tasks for s in graph.stages)
    assert done.rows >= sum(b.num_rows for b in batches)


def test_progress_true_on_the_api_returns_the_result(ctx, oracle):
    got = ctx.sql(tpch.query(6)).to_arrow_table(progress=True)
    assert got.num_rows == oracle.sql(tpch.query(6)).count()


@pytest.mark.slow
def test_cli_on_spark_prints_no_console_progress_bar(tpch_dir):
    """``make run``'s command prints no ``[Stage 0:> ...]`` into its output.

    At scale factor 0.1 every Spark job ends before Spark's bar would show
    (500 ms), so this runs ``make run``'s query on the scale factor 1 data
    it generates (before this fix, its output held ``[Stage 0:>``).
    """
    sf1 = next(
        (p for p in (REPO / "data" / "tpch-sf1", tpch_dir.parent / "tpch-sf1") if p.is_dir()), None
    )
    if sf1 is None:
        pytest.skip("no TPC-H scale factor 1 data (make run generates data/tpch-sf1)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "distfusion",
            "query",
            "--file",
            str(REPO / "src/distfusion/tpch/queries/q5.sql"),
            "--tpch",
            str(sf1),
            "--explain",
            "--runtime",
            "spark",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "5 rows" in done.stdout
    assert "[Stage " not in done.stdout + done.stderr


# ---------------------------------------------------------------------- the data model
def test_task_metrics_travel_as_json_unchanged():
    m = TaskMetrics(
        stage_id=2,
        task_index=1,
        worker="grpc://127.0.0.1:1",
        partition_rows=(3, 4),
        partition_bytes=(30, 40),
        elapsed_s=0.5,
        cpu_s=0.25,
        input_wait_s=0.125,
        input_rows=(7,),
        input_bytes=(70,),
        source_bytes=0,
        spilled_bytes=0,
        operators=(OperatorMetrics("ProjectionExec: expr=[a@0 as a]", 0, 7, 0.001, None, None),),
    )
    again = TaskMetrics.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m
    assert (again.output_rows, again.output_bytes) == (7, 70)


def test_distribution_and_skew():
    d = Distribution.of([3.0, 1.0, 2.0, 6.0])
    assert (d.sum, d.min, d.median, d.max) == (12.0, 1.0, 2.5, 6.0)
    assert d.skew == 6.0 / 2.5
    assert Distribution.of([]).skew == 1.0


def test_log_records_carry_query_stage_and_task(runtime_for, tpch_dir, caplog):
    ctx = DistributedContext(
        runtime=runtime_for("local", 3), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(GROUP_BY)
    with caplog.at_level(logging.DEBUG, logger="distfusion"):
        df.collect()
    query_id = df.metrics().query_id
    tasks = {
        (r.stage_id, r.task_index)
        for r in caplog.records
        if getattr(r, "query_id", None) == query_id and hasattr(r, "task_index")
    }
    assert tasks == {(t.stage_id, t.task_index) for t in df.metrics().tasks()}
