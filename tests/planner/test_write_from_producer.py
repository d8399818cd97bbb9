"""Writes from the stage producing the rows (:mod:`distfusion.planner.write_from_producer`).

A row-wise head over one coalesced stage is fused into that stage: the graph
loses the stage, the head takes its tasks and inputs. Written through the
in-process runtime and read back, the rows equal single-node DataFusion's; a
head that is not row-wise, or a producer that ran already, is left alone.
"""

from __future__ import annotations

import os

import pyarrow.dataset as ds
import pytest

from distfusion.planner.write_from_producer import write_from_producer
from distfusion.stages import COALESCE, SHUFFLE
from tests.compare import assert_same_result

JOIN = "SELECT t.k, v + 1 AS v1, w FROM t JOIN u ON t.k = u.k WHERE v > 2"
GROUPED = "SELECT s, count(*) AS n, sum(v) AS sv FROM t GROUP BY s"


def test_a_row_wise_head_over_a_shuffled_join_takes_the_joins_tasks(large):
    ctx, _ = large
    graph = ctx.sql(JOIN).stage_graph()
    producer = graph.stage(graph.head.inputs[0].stage_id)
    assert graph.head.inputs[0].boundary == COALESCE and producer.num_tasks > 1

    fused = write_from_producer(graph, set())

    assert fused is not None
    assert [s.stage_id for s in fused.stages] == [
        s.stage_id for s in graph.stages if s.stage_id != producer.stage_id
    ]
    head = fused.head
    assert (head.stage_id, head.num_tasks, head.inputs) == (
        graph.head.stage_id,
        producer.num_tasks,
        producer.inputs,
    )
    assert {i.boundary for i in head.inputs} == {SHUFFLE}
    assert head.output == graph.head.output and head.output_schema == graph.head.output_schema


@pytest.mark.parametrize(
    "sql", ["SELECT k, v FROM t ORDER BY v", "SELECT count(*) AS n FROM t"], ids=["sort", "count"]
)
def test_a_head_that_is_not_row_wise_is_not_fused(large, sql):
    ctx, _ = large
    assert write_from_producer(ctx.sql(sql).stage_graph(), set()) is None


def test_a_producer_that_ran_is_not_fused(large):
    ctx, _ = large
    graph = ctx.sql(JOIN).stage_graph()
    assert write_from_producer(graph, {graph.head.inputs[0].stage_id}) is None


@pytest.mark.parametrize("sql", [JOIN, GROUPED], ids=["join", "grouped"])
def test_the_producers_tasks_write_the_querys_rows(large, sql, tmp_path):
    ctx, oracle = large
    df = ctx.sql(sql)
    producer_tasks = df.stage_graph().stage(df.stage_graph().head.inputs[0].stage_id).num_tasks
    files = df.write_parquet(tmp_path / "out")

    # one file per task of the producing stage (a task with no row writes none)
    assert 1 < len(files) <= producer_tasks
    assert {f.relpath.split("-")[1] for f in files} <= {f"{j:05d}" for j in range(producer_tasks)}
    assert "written by the tasks of stage" in df.explain()
    got = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    expected = oracle.sql(sql).to_arrow_table()
    assert_same_result(got, expected, False, check_types=False)
    assert not os.path.exists(tmp_path / "out" / "_temporary")
