"""Adaptive execution: the rest of a query is planned again over measured stage sizes.

Each rule runs on tables whose estimates are wrong on purpose, in both
directions, on every runtime; results equal single-node DataFusion's.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.coordinator.adaptive import next_wave
from distfusion.stages import BROADCAST, SHUFFLE
from tests.compare import assert_same_result

ROWS = 200_000
KiB = 1024

# The fact table, and a dimension whose column x is 7 on only 10 rows while
# y and z are 1 on every row: "x = 7" keeps 10 rows where the planner guesses
# a tenth, "y = 1 AND z = 1" keeps all where it guesses a twentieth.
FACT = pa.table({"k": pa.array([i % 50_000 for i in range(ROWS)], pa.int64()), "v": range(ROWS)})
DIM = pa.table(
    {
        "k": pa.array(range(ROWS), pa.int64()),
        "x": [7 if i % 20_000 == 0 else i % 5 for i in range(ROWS)],
        "y": [1] * ROWS,
        "z": [1] * ROWS,
    }
)
SELECTIVE = "SELECT sum(f.v) AS s, count(*) AS n FROM fact f JOIN dim d ON f.k = d.k WHERE d.x = 7"
UNSELECTIVE = (
    "SELECT d.x, sum(f.v) AS s, count(*) AS n FROM fact f JOIN dim d ON f.k = d.k "
    "WHERE d.y = 1 AND d.z = 1 GROUP BY d.x"
)

# Runtimes: in-process, Flight worker processes and Spark (tests/conftest.py).
RUNTIMES = [("local", 2), ("flight", 2), ("spark", 2)]


def _contexts(runtime, **config) -> tuple[DistributedContext, SessionContext]:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2, **config))
    oracle = SessionContext()
    for name, table in (("fact", FACT), ("dim", DIM)):
        ctx.register_table(name, table, max_rows_per_unit=ROWS // 4)
        oracle.register_record_batches(name, [table.to_batches()])
    return ctx, oracle


def _join_contexts(runtime, broadcast_bytes: int, **config):
    """:func:`_contexts` broadcasting join sides up to ``broadcast_bytes``, no runtime filters."""
    return _contexts(
        runtime,
        broadcast_threshold_bytes=broadcast_bytes,
        max_broadcast_bytes=broadcast_bytes,
        runtime_filter_bytes=0,
        **config,
    )


def _readers(graph, boundary: str) -> list[tuple[int, int]]:
    """``(consumer, producer)`` pairs of ``graph`` reading across ``boundary``."""
    return [
        (s.stage_id, i.stage_id) for s in graph.stages for i in s.inputs if i.boundary == boundary
    ]


def _shuffled_inputs(stage) -> int:
    return sum(i.boundary == SHUFFLE for i in stage.inputs)


def _scans(graph, table: str):
    return [s for s in graph.stages if any(sc.source.name == table for sc in s.scans)]


@pytest.mark.parametrize(("runtime_name", "workers"), RUNTIMES, ids=[r for r, _ in RUNTIMES])
def test_shuffle_join_whose_small_side_is_measured_becomes_a_broadcast(
    runtime_name, workers, runtime_for
):
    # dim's side is estimated at ~480 KB (a tenth of dim) and fact's at ~3 MB: over
    # the 64 KiB broadcast threshold, both are shuffled. Measured, dim's side is 10 rows.
    ctx, oracle = _join_contexts(runtime_for(runtime_name, workers), 64 * KiB)
    df = ctx.sql(SELECTIVE)
    shuffle_join = [s for s in df.stage_graph().stages if _shuffled_inputs(s) == 2]
    assert len(shuffle_join) == 1

    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(SELECTIVE).to_arrow_table(), ordered=False)

    run = df.last_run
    final = run.final
    (dim_stage,) = _scans(final, "dim")
    assert run.stats[dim_stage.stage_id].rows == 10
    (fact_stage,) = _scans(final, "fact")
    # The join runs in fact's tasks, which read dim's measured output as a broadcast:
    # nothing of fact crosses the network before the join.
    assert (fact_stage.stage_id, dim_stage.stage_id) in _readers(final, BROADCAST)
    assert fact_stage.output.kind != SHUFFLE or fact_stage.output.key_columns != (0,)
    assert any("read as a broadcast" in d and "10 rows" in d for d in run.decisions), run.decisions
    assert not [s for s in final.stages if _shuffled_inputs(s) == 2]
    assert "Adaptive decisions:" in df.explain() and "measured" in df.explain()
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in ctx.runtime.stats().values())


@pytest.mark.parametrize(("runtime_name", "workers"), RUNTIMES, ids=[r for r, _ in RUNTIMES])
def test_broadcast_side_measured_large_is_shuffled_instead(runtime_name, workers, runtime_for):
    # "y = 1 AND z = 1" is guessed to keep 5% of dim (~240 KB: under the 1 MiB
    # threshold, broadcast statically) and keeps all of it (~4.8 MB).
    ctx, oracle = _join_contexts(runtime_for(runtime_name, workers), 1024 * KiB)
    df = ctx.sql(UNSELECTIVE)
    static = df.stage_graph()
    (static_dim,) = _scans(static, "dim")
    (static_fact,) = _scans(static, "fact")
    assert (static_fact.stage_id, static_dim.stage_id) in _readers(static, BROADCAST)

    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(UNSELECTIVE).to_arrow_table(), ordered=False)

    run = df.last_run
    assert run.stats[static_dim.stage_id].rows == ROWS
    final = run.final
    (fact_stage,) = _scans(final, "fact")
    # fact's tasks do not read dim's large output as a broadcast: both sides are
    # shuffled (dim's measured output is read once more and shuffled by k).
    assert (fact_stage.stage_id, static_dim.stage_id) not in _readers(final, BROADCAST)
    assert fact_stage.output.kind == SHUFFLE
    assert [s for s in final.stages if _shuffled_inputs(s) == 2]
    assert any(f"stage {static_dim.stage_id}" in d for d in run.decisions), run.decisions


def test_measured_shuffle_partitions_are_coalesced(runtime_for):
    # Estimated large (every shuffle is measured: adaptive_shuffle_bytes=0) but
    # a few KiB: the consumers need one task each, not four.
    ctx = DistributedContext(
        runtime=runtime_for("local", 4),
        config=DistributedConfig(bytes_per_task=1024 * KiB, adaptive_shuffle_bytes=0),
    )
    ctx.register_table("fact", FACT, max_rows_per_unit=ROWS // 4)
    oracle = SessionContext()
    oracle.register_record_batches("fact", [FACT.to_batches()])
    sql = "SELECT k % 1000 AS g, count(*) AS n, sum(v) AS s FROM fact GROUP BY k % 1000"
    df = ctx.sql(sql)
    static = df.stage_graph()
    (final_agg,) = [s for s in static.stages if s.inputs and s is not static.head]
    assert final_agg.num_tasks > 1

    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(sql).to_arrow_table(), ordered=False)
    coalesced = df.last_run.final.stage(final_agg.stage_id)
    assert coalesced.num_tasks == 1
    (inp,) = coalesced.inputs
    assert inp.groups == (tuple(range(final_agg.num_tasks)),)
    assert any("coalesced" in d for d in df.last_run.decisions)


def test_adaptive_off_runs_the_static_plan(runtime_for):
    ctx, oracle = _contexts(
        runtime_for("local", 2),
        broadcast_threshold_bytes=64 * KiB,
        max_broadcast_bytes=64 * KiB,
        adaptive=False,
    )
    df = ctx.sql(SELECTIVE)
    assert_same_result(df.to_arrow_table(), oracle.sql(SELECTIVE).to_arrow_table(), ordered=False)
    assert df.last_run is None
    assert df.explain() == df.stage_graph().render()


def test_next_wave_runs_the_smaller_join_side_first(runtime_for):
    ctx, _ = _join_contexts(runtime_for("local", 2), 64 * KiB)
    graph = ctx.sql(SELECTIVE).stage_graph()
    (dim_stage,) = _scans(graph, "dim")
    (fact_stage,) = _scans(graph, "fact")
    assert dim_stage.estimated_bytes < fact_stage.estimated_bytes
    assert next_wave(graph, set(), 64 * KiB, float("inf")) == [dim_stage.stage_id]
    # Once it ran, nothing waits on a decision: the rest runs in one go.
    assert next_wave(graph, {dim_stage.stage_id}, 64 * KiB, float("inf")) == []


def test_runtime_filter_survives_planning_again_over_its_measured_source(
    runtime_for, tpch_dir, oracle
):
    # TPC-H Q4: orders' filtered keys (a shuffle: over the 16 KiB broadcast
    # limit) filter lineitem before lineitem's shuffle. Once orders' stage ran,
    # the rest is planned again over its measured output, which still holds
    # every key: lineitem's tasks must go on reading it as a broadcast, not
    # shuffle all of lineitem (at SF1: 3.8 M rows instead of 145 k). Tables
    # stored in order-key order would join file range by file range instead.
    config = DistributedConfig(
        tasks_per_stage=2,
        broadcast_threshold_bytes=16 * KiB,
        max_broadcast_bytes=16 * KiB,
        adaptive_shuffle_bytes=0,
        storage_partitioned_joins=False,
    )
    ctx = DistributedContext(runtime=runtime_for("local", 2), config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(tpch.query(4))
    (orders,) = _scans(df.stage_graph(), "orders")
    (lineitem,) = _scans(df.stage_graph(), "lineitem")
    assert (lineitem.stage_id, orders.stage_id) in _readers(df.stage_graph(), BROADCAST)

    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(tpch.query(4)).to_arrow_table(), ordered=True)
    final = df.last_run.final
    (lineitem,) = _scans(final, "lineitem")
    assert (lineitem.stage_id, orders.stage_id) in _readers(final, BROADCAST), final.render()
    assert df.last_run.stats[lineitem.stage_id].rows < df.last_run.stats[orders.stage_id].rows * 4


def test_runtime_filter_keys_come_from_the_smallest_stage_upstream(runtime_for, tpch_dir, oracle):
    # TPC-H Q10: lineitem joins customer x filtered orders on the order key.
    # That side (customer's wide columns) is too large to filter lineitem
    # with, but its order keys pass unchanged from the filtered orders stage,
    # a few KiB: lineitem's tasks read that stage as a broadcast, in the
    # static plan and in the plan made again once orders' stage ran (when
    # orders and lineitem do not join file range by file range).
    config = DistributedConfig(
        tasks_per_stage=2,
        broadcast_threshold_bytes=16 * KiB,
        max_broadcast_bytes=16 * KiB,
        runtime_filter_bytes=512 * KiB,
        adaptive_shuffle_bytes=0,
        storage_partitioned_joins=False,
    )
    ctx = DistributedContext(runtime=runtime_for("local", 2), config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(tpch.query(10))
    (orders,) = _scans(df.stage_graph(), "orders")
    (lineitem,) = _scans(df.stage_graph(), "lineitem")
    assert lineitem.inputs and all(i.stage_id == orders.stage_id for i in lineitem.inputs)

    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(tpch.query(10)).to_arrow_table(), ordered=True)
    final = df.last_run.final
    (lineitem,) = _scans(final, "lineitem")
    assert (lineitem.stage_id, orders.stage_id) in _readers(final, BROADCAST), final.render()
    orders_rows = sum(df.last_run.stats[orders.stage_id].partition_rows)
    assert sum(df.last_run.stats[lineitem.stage_id].partition_rows) < orders_rows * 4


def test_planning_again_keeps_every_stage_that_ran(runtime_for, tpch_dir, oracle):
    # TPC-H Q11 reads supplier alone (its subquery) and joined with nation
    # (its main branch), in stages of one task. Planned again once they ran,
    # the main branch must still read its supplier x nation stage, not cut
    # itself anew over the subquery's supplier stage and scan partsupp again.
    config = DistributedConfig(
        bytes_per_task=2**20, adaptive_shuffle_bytes=0, replicate_scan_bytes=0
    )
    ctx = DistributedContext(runtime=runtime_for("local", 2), config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(tpch.query(11))
    got = df.to_arrow_table()
    assert_same_result(got, oracle.sql(tpch.query(11)).to_arrow_table(), ordered=True)
    final = df.last_run.final
    assert len(df.last_run.graphs) > 1  # planned again
    assert set(df.last_run.stats) <= {s.stage_id for s in final.stages}, final.render()
    assert len(_scans(final, "partsupp")) == 2
