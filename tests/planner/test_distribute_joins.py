"""Join distribution (:mod:`distfusion.planner.distribute_joins`): broadcast, co-partitioned, shuffle both sides, one task.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from distfusion import LocalRuntime
from distfusion.planner.config import RuntimeProfile
from distfusion.stages import BROADCAST, COALESCE, SHUFFLE
from tests.planner.helpers import (
    LARGE,
    D,
    check_well_formed,
    edges,
    kinds,
    make_contexts,
    producer_of,
    run,
    stage_with,
)

JOINS = {
    "inner": "SELECT t.k, t.v, u.w FROM t JOIN u ON t.k = u.k",
    "left": "SELECT t.k, t.v, u.w FROM t LEFT JOIN u ON t.k = u.k",
    "right": "SELECT t.k, t.v, u.w FROM t RIGHT JOIN u ON t.k = u.k",
    "full": "SELECT t.k, t.v, u.k AS uk, u.w FROM t FULL JOIN u ON t.k = u.k",
    "semi-exists": "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k)",
    "semi-in": "SELECT * FROM t WHERE k IN (SELECT k FROM u)",
    "anti-not-exists": "SELECT * FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.k)",
    "two-keys": "SELECT t.k, t.s, u.w FROM t JOIN u ON t.k = u.k AND t.s = u.w",
    "key-and-filter": "SELECT t.k, u.w FROM t JOIN u ON t.k = u.k AND t.v > 3",
}


@pytest.mark.parametrize("name", list(JOINS))
def test_join_small_side_is_broadcast(small, name):
    g = run(small, JOINS[name])
    check_well_formed(g)
    if name == "full":  # a full join cannot broadcast either side
        assert kinds(g).count(SHUFFLE) == 2 and BROADCAST not in kinds(g)
        return
    (bcast,) = [e for e in edges(g) if e[1] == BROADCAST]
    join_stage = g.stage(bcast[2])
    assert join_stage.num_tasks == 4, "the probe side keeps its tasks"
    assert g.stage(bcast[0]).output.readers == 4
    assert SHUFFLE not in kinds(g)


@pytest.mark.parametrize("name", list(JOINS))
def test_join_large_sides_are_both_shuffled(large, name):
    g = run(large, JOINS[name])
    check_well_formed(g)
    assert BROADCAST not in kinds(g)
    (join_stage,) = [
        s for s in g.stages if len([i for i in s.inputs if i.boundary == SHUFFLE]) == 2
    ]
    left, right = producer_of(g, join_stage.stage_id, SHUFFLE)
    assert join_stage.num_tasks == 4
    assert left.output.num_partitions == right.output.num_partitions == 4
    assert left.output.key_columns and len(left.output.key_columns) == len(right.output.key_columns)


def test_broadcast_side_is_the_small_one(runtimes):
    # 4 rows against 400: whichever side is written first, the 4-row side is copied.
    big = pa.table({"k": pa.array(range(400), pa.int64()), "x": pa.array(range(400), pa.int64())})
    tiny = pa.table({"k": pa.array([3, 5, 7, 1000], pa.int64()), "y": ["a", "b", "c", "d"]})
    contexts = make_contexts(
        runtimes[4], {"big": (big, 100), "tiny": (tiny, 1)}, broadcast_threshold_bytes=1024
    )
    for sql in (
        "SELECT big.x, tiny.y FROM big JOIN tiny ON big.k = tiny.k",
        "SELECT big.x, tiny.y FROM tiny JOIN big ON big.k = tiny.k",
    ):
        g = run(contexts, sql)
        (bcast,) = [
            g.stage(i.stage_id) for s in g.stages for i in s.inputs if i.boundary == BROADCAST
        ]
        assert [scan.source.name for scan in bcast.scans] == ["tiny"]


@pytest.mark.parametrize("contexts", ["small", "large"])
def test_non_equi_join(request, contexts):
    c = request.getfixturevalue(contexts)
    g = run(c, "SELECT t.k, t.v, u.k AS uk FROM t JOIN u ON t.k < u.k")
    check_well_formed(g)
    # No keys to shuffle by: one side is broadcast to the other's tasks.
    assert kinds(g) == [BROADCAST, COALESCE]
    g = run(c, "SELECT t.k, u.k AS uk FROM t LEFT JOIN u ON t.k < u.k AND t.v > 4")
    assert BROADCAST in kinds(g)


def test_full_non_equi_join_runs_in_one_task(small):
    g = run(small, "SELECT t.k, u.k AS uk FROM t FULL JOIN u ON t.k < u.k")
    check_well_formed(g)
    # Neither side may be broadcast: both are gathered into the head.
    assert edges(g) == [(1, COALESCE, 3), (2, COALESCE, 3)]
    assert "Full Join" in g.head.plan_text


def test_cross_join(small):
    g = run(small, "SELECT t.k, u.w FROM t CROSS JOIN u")
    check_well_formed(g)
    assert BROADCAST in kinds(g)


@pytest.mark.parametrize("contexts", ["small", "large"])
def test_null_join_keys_never_match(request, contexts):
    ctx, _ = c = request.getfixturevalue(contexts)
    run(c, "SELECT t.k, u.k AS uk FROM t JOIN u ON t.k = u.k")
    got = ctx.sql("SELECT t.k, u.k AS uk FROM t JOIN u ON t.k = u.k").to_arrow_table()
    assert got.num_rows > 0 and got.column("k").null_count == 0 and got.column("uk").null_count == 0


@pytest.mark.parametrize("contexts", ["small", "large"])
def test_null_join_keys_survive_outer_joins(request, contexts):
    ctx, _ = c = request.getfixturevalue(contexts)
    sql = "SELECT t.k, t.v, u.k AS uk, u.w FROM t FULL JOIN u ON t.k = u.k"
    run(c, sql)
    rows = ctx.sql(sql).to_arrow_table().to_pylist()
    # The two NULL-key rows of t and the two of u each survive once, unmatched.
    assert sum(1 for r in rows if r["k"] is None and r["v"] is not None and r["uk"] is None) == 2
    assert sorted(
        r["w"] for r in rows if r["uk"] is None and r["w"] is not None and r["k"] is None
    ) == ["c", "y"]
    run(c, "SELECT t.k, t.v, u.w FROM t LEFT JOIN u ON t.k = u.k")
    run(c, "SELECT u.k, u.w, t.v FROM t RIGHT JOIN u ON t.k = u.k")


@pytest.mark.parametrize("contexts", ["small", "large"])
def test_null_safe_equi_join_matches_nulls(request, contexts):
    # IS NOT DISTINCT FROM is an equi-join key where NULL = NULL: shuffled NULLs
    # must land in the same partition on both sides.
    ctx, _ = c = request.getfixturevalue(contexts)
    sql = "SELECT t.k, t.v, u.w FROM t JOIN u ON t.k IS NOT DISTINCT FROM u.k"
    run(c, sql)
    got = ctx.sql(sql).to_arrow_table()
    assert got.filter(pa.compute.is_null(got.column("k"))).num_rows == 4  # 2 x 2 NULL keys


def _int_keys(n: int, typ: pa.DataType, mod: int, offset: int) -> pa.Array:
    return pa.array([(i * 7919) % mod - offset for i in range(n)], typ)


@pytest.mark.parametrize(
    ("left_type", "right_type"),
    [
        (pa.int32(), pa.int64()),
        (pa.int8(), pa.int64()),
        (pa.int64(), pa.int16()),
        (pa.uint8(), pa.int32()),
    ],
    ids=["int32-int64", "int8-int64", "int64-int16", "uint8-int32"],
)
def test_join_keys_of_different_integer_types(runtimes, left_type, right_type):
    # Both sides shuffled into 4 partitions: equal keys of different widths must
    # hash alike, else matches are lost.
    offset = 0 if pa.types.is_unsigned_integer(left_type) else 60
    a = pa.table(
        {"k": _int_keys(300, left_type, 120, offset), "x": pa.array(range(300), pa.int64())}
    )
    b = pa.table({"k": pa.array(range(-70, 130), right_type), "y": [f"n{i}" for i in range(200)]})
    contexts = make_contexts(runtimes[4], {"a": (a, 40), "b": (b, 25)}, **LARGE)
    for sql in (
        "SELECT a.k, a.x, b.y FROM a JOIN b ON a.k = b.k",
        "SELECT a.x, b.y FROM b LEFT JOIN a ON a.k = b.k",
        "SELECT a.k, count(*) AS n FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) GROUP BY a.k",
    ):
        g = run(contexts, sql)
        check_well_formed(g)
        assert BROADCAST not in kinds(g) and kinds(g).count(SHUFFLE) >= 2
    got = contexts[0].sql("SELECT a.k, a.x, b.y FROM a JOIN b ON a.k = b.k").to_arrow_table()
    assert got.num_rows == 300  # every key of a (in -60..119) appears once in b (-70..129)


@pytest.mark.parametrize("contexts", ["small", "large"])
def test_string_join_keys(request, contexts):
    c = request.getfixturevalue(contexts)
    g = run(c, "SELECT t.s, t.v, u.w FROM t JOIN u ON t.s = u.w")
    check_well_formed(g)
    run(c, "SELECT t.s, u.w FROM t FULL JOIN u ON t.s = u.w")
    run(c, "SELECT s, count(*) AS n FROM t WHERE s IN (SELECT w FROM u) GROUP BY s")


def test_select_star_join_with_same_column_names(small):
    run(small, "SELECT * FROM t JOIN u ON t.k = u.k")


def test_join_then_grouped_aggregate(large):
    g = run(
        large, "SELECT u.w, sum(t.v) AS sv, count(*) AS n FROM t JOIN u ON t.k = u.k GROUP BY u.w"
    )
    check_well_formed(g)
    assert kinds(g).count(SHUFFLE) == 3  # both join sides, then the aggregate keys


def test_aggregate_on_the_join_key_reuses_the_join_partitioning(large):
    # Rows are already in the task of their join key: the aggregate runs in the
    # join's stage, no third shuffle (Spark's EnsureRequirements).
    for sql in (
        "SELECT t.k, sum(t.v) AS sv, count(u.w) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.k",
        "SELECT t.k, t.s, count(*) AS n FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.s, t.k",
        "SELECT k, count(DISTINCT s) AS n FROM t WHERE k IN (SELECT k FROM u) GROUP BY k",
    ):
        g = run(large, sql)
        check_well_formed(g)
        assert kinds(g).count(SHUFFLE) == 2, g.render()
    # A key the join did not partition by still shuffles.
    g = run(large, "SELECT t.s, count(*) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.s")
    assert kinds(g).count(SHUFFLE) == 3


def test_join_on_a_partitioned_side_shuffles_only_the_other(runtimes):
    # a is aggregated by k (shuffled by k into 4 tasks); joining it on k with b
    # and then with c shuffles b and c into a's partitions, never a again.
    a = pa.table({"k": pa.array([i % 50 for i in range(400)], pa.int64()), "x": range(400)})
    b = pa.table({"k": pa.array(range(-10, 60), pa.int32()), "y": range(70)})
    c = pa.table({"k": pa.array(range(0, 100, 3), pa.int64()), "z": range(34)})
    contexts = make_contexts(runtimes[4], {"a": (a, 50), "b": (b, 10), "c": (c, 5)}, **LARGE)
    sql = (
        "SELECT g.k, g.sx, b.y FROM (SELECT k, sum(x) AS sx FROM a GROUP BY k) g "
        "JOIN b ON g.k = b.k WHERE NOT EXISTS (SELECT 1 FROM c WHERE c.k = g.k AND c.z > 3)"
    )
    g = run(contexts, sql)
    check_well_formed(g)
    join_stage = stage_with(g, "LeftAnti Join")
    assert "Inner Join" in join_stage.plan_text and "Aggregate" in join_stage.plan_text
    shuffled = producer_of(g, join_stage.stage_id, SHUFFLE)
    assert len(shuffled) == 3  # a's partial aggregate, b, c: each shuffled once
    assert kinds(g).count(SHUFFLE) == 3 and BROADCAST not in kinds(g)
    # A computed key is not known to be partitioned: both sides shuffle again.
    g = run(
        contexts,
        "SELECT g.k, b.y FROM (SELECT k, sum(x) AS sx FROM a GROUP BY k) g JOIN b ON g.k + 1 = b.k",
    )
    assert kinds(g).count(SHUFFLE) == 3


class _WaveRuntime(LocalRuntime):
    """Two local workers whose stages may get more tasks than workers, in waves.

    As Spark's Flight data plane declares (``wave_bytes_per_task``, no task cap
    at the workers), at the byte sizes of these small tables.
    """

    def __init__(self, wave_bytes: int) -> None:
        super().__init__(workers=2)
        self.wave_bytes = wave_bytes

    def profile(self) -> RuntimeProfile:
        return dataclasses.replace(
            super().profile(),
            bytes_per_task=4096,
            wave_bytes_per_task=self.wave_bytes,
            max_tasks=16,
            in_place_bytes=0,
        )


FACT = pa.table({"k": pa.array([i % 200 for i in range(40_000)], pa.int64()), "x": range(40_000)})


@pytest.mark.parametrize(("wave_bytes", "tasks"), [(40_000, 2), (100_000, 8)])
def test_a_probe_reading_a_large_broadcast_runs_one_wave(wave_bytes, tasks):
    # The fact side wants several waves of tasks (16 at 40 kB a task, 8 at
    # 100 kB). Each of its tasks would build the dimension's hash table again:
    # at 1/16 of a wave task's bytes or more, it runs one task per worker
    # instead; below, it keeps its waves.
    runtime = _WaveRuntime(wave_bytes)
    try:
        tables = {"f": (FACT, 2500), "d": (D, 50)}
        contexts = make_contexts(runtime, tables, tasks=None, replicate_scan_bytes=0)
        g = run(contexts, "SELECT d.c, sum(f.x) AS s FROM f JOIN d ON f.k = d.k GROUP BY d.c")
        check_well_formed(g)
        (bcast,) = [e for e in edges(g) if e[1] == BROADCAST]
        assert g.stage(bcast[2]).num_tasks == tasks, g.render()
        assert g.stage(bcast[0]).output.readers == tasks
    finally:
        runtime.close()
