"""Planning over Spark DataFrame sources (format ``spark``), without Spark.

A table read through Spark reaches each leaf task as one Spark partition,
inside the Spark task computing it. The planner must therefore keep three
rules whatever the query (:meth:`_Planner.spark_tables`): a stage reads at
most one Spark table, reads other stages only as broadcasts, and the head
stage (run on the coordinator) reads none. Runtimes other than Spark refuse
such a query with a PlanningError. tests/runtime/test_spark_sources.py runs
them on Spark.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from substrait.proto import Plan

from distfusion import DistributedConfig, DistributedContext, LocalRuntime, PlanningError
from distfusion.io.sources import spark_source
from distfusion.planner.config import PlannerConfig
from distfusion.planner.plan import plan_stages
from distfusion.stages import BROADCAST, StageGraph

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])

QUERIES = [
    "SELECT * FROM sp",
    "SELECT count(*) AS n FROM sp",
    "SELECT s, sum(v) AS v FROM sp WHERE k > 2 GROUP BY s",
    "SELECT a.k, b.v FROM sp a JOIN sp b ON a.k = b.k",
    "SELECT a.k, b.v FROM sp a JOIN sp2 b ON a.k = b.k",
    "SELECT a.k, b.v FROM sp1 a JOIN one b ON a.k = b.k",
    "SELECT a.k, b.v FROM sp1 a JOIN sp2 b ON a.k < b.k",
    "SELECT k FROM sp1 WHERE v > (SELECT avg(v) FROM sp2)",
    "SELECT k FROM sp1 UNION ALL SELECT k FROM sp2",
    "SELECT k, v FROM sp ORDER BY v DESC LIMIT 3",
    "SELECT k, row_number() OVER (PARTITION BY s ORDER BY v) AS r FROM sp1",
]


@pytest.fixture(scope="module")
def ctx():
    """A context with Spark sources of 4, 1 and unknown partitions and a memory table."""
    with DistributedContext(runtime=LocalRuntime(workers=4)) as c:
        mib = 1024 * 1024
        for name, parts, size in (("sp", 4, 400 * mib), ("sp1", 1, mib), ("sp2", None, mib)):
            c._register_streamed(spark_source(name, SCHEMA, f"id-{name}", parts, size), None)
        c.register_table("one", pa.table({"k": [1, 2, 3], "v": [1.0, 2.0, 3.0]}))
        yield c


def _graph(ctx: DistributedContext, sql: str) -> StageGraph:
    """The stage graph of ``sql``, planned as for a runtime that reads Spark tables."""
    df = ctx.sql(sql)
    plan = Plan()
    plan.ParseFromString(df._substrait())
    config = PlannerConfig.for_runtime(DistributedConfig(bytes_per_task=64 * 1024**2), ctx.runtime)
    return plan_stages(plan, ctx.sources, config)


@pytest.mark.parametrize("sql", QUERIES)
def test_spark_tables_get_stages_of_their_own(ctx, sql):
    graph = _graph(ctx, sql)
    assert not [s for s in graph.head.scans if s.source.is_spark], graph.render()
    read = 0
    for stage in graph.stages:
        spark = {s.source.name for s in stage.scans if s.source.is_spark}
        assert len(spark) <= 1, graph.render()
        if spark:
            read += 1
            assert all(i.boundary == BROADCAST for i in stage.inputs), graph.render()
            scan = next(s for s in stage.scans if s.source.is_spark)
            parts = scan.source.options["partitions"]
            assert parts is None or stage.num_tasks <= parts
            assert f"spark scan {scan.source.name}" in graph.render()
    assert read >= 1


def test_task_count_follows_spark_size_estimate(ctx):
    # 400 MiB over 4 partitions at 64 MiB per task: one task per partition.
    (leaf,) = [s for s in _graph(ctx, "SELECT * FROM sp").stages if s.scans]
    assert leaf.num_tasks == 4
    # 1 MiB of unknown partitions: no fewer tasks than workers (Spark reads in them).
    (leaf,) = [s for s in _graph(ctx, "SELECT * FROM sp2").stages if s.scans]
    assert leaf.num_tasks == 4
    # One partition: one task.
    (leaf,) = [s for s in _graph(ctx, "SELECT * FROM sp1").stages if s.scans]
    assert leaf.num_tasks == 1


def test_other_runtimes_refuse_a_spark_table_clearly(ctx):
    with pytest.raises(
        PlanningError, match=r"'sp' is a Spark DataFrame.*only the Spark runtime.*'local'"
    ):
        ctx.sql("SELECT count(*) FROM sp").collect()
    # Queries not reading it run.
    assert ctx.sql("SELECT count(*) AS n FROM one").to_pylist() == [{"n": 3}]


@pytest.mark.parametrize(
    ("sql", "columns"),
    [
        ("SELECT * FROM sp", None),
        ("SELECT count(*) AS n FROM sp", [0]),
        ("SELECT s FROM sp WHERE k > 2", [0, 2]),
        ("SELECT a.k FROM sp a JOIN sp b ON a.k = b.k WHERE b.v > 1", [0, 1]),
    ],
)
def test_spark_computes_only_the_columns_the_query_reads(ctx, sql, columns):
    graph = _graph(ctx, sql)
    scans = [s for st in graph.stages for s in st.scans if s.source.is_spark]
    assert scans and all(s.source.options["columns"] == columns for s in scans)


def test_leaf_task_reads_the_partition_offered_to_it(ctx, monkeypatch):
    """A leaf task over a Spark table runs over the batches offered to it, in chunks."""
    from distfusion.protocol.task_plan import TaskPlan
    from distfusion.worker import execute_task, spark_partitions
    from distfusion.worker.spark_partitions import offering

    graph = _graph(ctx, "SELECT s, k FROM sp WHERE k > 2")
    (leaf,) = [s for s in graph.stages if s.scans]
    assert leaf.scans[0].source.options["chunked"]
    # What Spark computes: only the columns read (k, s), as Spark names them.
    batches = [
        pa.record_batch({"K": pa.array(range(i * 5, i * 5 + 5)), "S": [f"s{i}"] * 5})
        for i in range(4)
    ]
    plan = TaskPlan.for_task(graph.query_id, leaf, 1, (), 1)
    monkeypatch.setattr(spark_partitions, "SPARK_CHUNK_BYTES", 1)  # the fragment runs per batch
    metrics = []
    with offering(plan.key, "sp", iter(batches)):
        parts = execute_task.run_task(plan, lambda i: [], on_metrics=metrics.append)
    assert metrics[0].source_bytes == sum(b.nbytes for b in batches)
    assert sum(len(p) for p in parts) >= 4  # one output batch per chunk at least
    rows = sorted(r for p in parts for b in p for r in zip(*b.to_pydict().values(), strict=True))
    assert rows == sorted((f"s{k // 5}", k) for k in range(3, 20))
    # Not offered: a clear error, not an empty table.
    with pytest.raises(
        Exception, match="'sp' is a Spark DataFrame, read only inside the Spark task"
    ):
        execute_task.run_task(plan, lambda i: [])


def test_an_empty_partition_gives_an_empty_table(ctx):
    """A chunked leaf task offered no batch runs once over an empty table (taken once)."""
    from distfusion.protocol.task_plan import TaskPlan
    from distfusion.worker import execute_task
    from distfusion.worker.spark_partitions import offering

    graph = _graph(ctx, "SELECT s, count(*) AS n FROM sp WHERE k > 2 GROUP BY s")
    (leaf,) = [s for s in graph.stages if s.scans]
    assert leaf.scans[0].source.options["chunked"]  # a partial aggregate is linear
    plan = TaskPlan.for_task(graph.query_id, leaf, 0, (), 1)
    with offering(plan.key, "sp", iter(())):
        parts = execute_task.run_task(plan, lambda i: [])
    assert sum(b.num_rows for p in parts for b in p) == 0
