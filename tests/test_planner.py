"""Planner unit tests: small hand-made tables, SQL in, stage plan shape and result out.

Each test registers pyarrow tables split into several work units (so a leaf stage
really has several tasks) and checks one or both of:

- the SHAPE of the :class:`~distfusion.stages.StageGraph`: which network
  boundaries appear between which stages, and the task counts, as the rules table
  of ``distfusion.planner.inject_network_boundaries`` says. Where the shape is
  what a test is about, the query is only planned and its ``explain()`` text is
  compared with an inline snapshot (:func:`assert_explain`);
- the RESULT, run on the in-process runtime, equals single-node DataFusion over
  the same tables (the oracle).

No Spark, no sockets: LocalRuntime only.
"""

from __future__ import annotations

import decimal
import textwrap

import pyarrow as pa
import pytest
from datafusion import SessionContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.planner.estimate import DefaultTaskEstimator
from distfusion.stages import BROADCAST, COALESCE, RESULT, SHUFFLE, StageGraph
from tests.compare import assert_same_result

# Broadcast every join side the join type allows (all test tables are tiny) ...
SMALL = {}
# ... or never broadcast an equi-join side: shuffle both sides by the keys.
LARGE = {"broadcast_threshold_bytes": 0, "max_broadcast_bytes": 0}

# t: 12 rows in 4 work units of 3; NULL keys, NULL strings, floats and decimals.
T = pa.table(
    {
        "k": pa.array([1, 2, 3, None, 2, 1, 5, 6, None, 3, 7, 1], pa.int64()),
        "v": pa.array([1.5, 2.0, 3.25, 4.0, 5.0, 6.5, 7.0, 8.0, 9.0, None, 11.0, 12.0]),
        "s": pa.array(["a", "b", "c", "d", "a", "b", "c", None, "a", "e", "f", "b"]),
        "d": pa.array(
            [
                decimal.Decimal(x)
                for x in "1.10 2.20 3.33 4.00 5.55 6.01 7.77 8.80 9.99 0.01 1.00 2.50".split()
            ],
            pa.decimal128(10, 2),
        ),
    }
)
# u: 8 rows in 4 work units of 2; an int32 key (DataFusion casts it to int64 to join t).
U = pa.table(
    {
        "k": pa.array([1, 2, None, 7, 2, 9, None, 3], pa.int32()),
        "w": pa.array(["a", "b", "c", "d", "b", "x", "y", None]),
    }
)
# e: no rows at all.
E = pa.table({"k": pa.array([], pa.int64()), "x": pa.array([], pa.float64())})

TABLES = {"t": (T, 3), "u": (U, 2), "e": (E, 1)}


@pytest.fixture(scope="module")
def runtimes():
    """One LocalRuntime per worker count 1..4, closed at the end of the module."""
    rts = {n: LocalRuntime(workers=n) for n in range(1, 5)}
    yield rts
    for rt in rts.values():
        rt.close()


def make_contexts(
    runtime: LocalRuntime, tables: dict, tasks: int | None = 4, **config
) -> tuple[DistributedContext, SessionContext]:
    """A DistributedContext and an identical single-node SessionContext (the oracle).

    ``tables`` maps name -> (pyarrow table, rows per work unit).
    """
    ctx = DistributedContext(
        runtime=runtime, config=DistributedConfig(tasks_per_stage=tasks, **config)
    )
    oracle = SessionContext()
    for name, (table, rows_per_unit) in tables.items():
        ctx.register_table(name, table, max_rows_per_unit=rows_per_unit)
        batches = table.to_batches(max_chunksize=rows_per_unit) or [
            pa.RecordBatch.from_pylist([], schema=table.schema)
        ]
        oracle.register_record_batches(name, [batches])
    return ctx, oracle


@pytest.fixture
def small(runtimes):
    """Contexts over t, u, e on 4 workers, 4 tasks per stage, small sides broadcast."""
    return make_contexts(runtimes[4], TABLES, **SMALL)


@pytest.fixture
def large(runtimes):
    """As ``small``, but no equi-join side is ever broadcast."""
    return make_contexts(runtimes[4], TABLES, **LARGE)


def run(contexts, sql: str, ordered: bool = False) -> StageGraph:
    """Run ``sql`` distributed, assert it equals the oracle, return the stage graph."""
    ctx, oracle = contexts
    df = ctx.sql(sql)
    got = df.to_arrow_table()
    expected = oracle.sql(sql).to_arrow_table()
    assert_same_result(got, expected, ordered)
    return df.stage_graph()


def edges(graph: StageGraph) -> list[tuple[int, str, int]]:
    """Every network boundary as (producer stage id, boundary, consumer stage id)."""
    return sorted((i.stage_id, i.boundary, s.stage_id) for s in graph.stages for i in s.inputs)


def kinds(graph: StageGraph) -> list[str]:
    """Boundary kinds in the graph, sorted (with repeats)."""
    return sorted(b for _, b, _ in edges(graph))


def check_well_formed(graph: StageGraph) -> None:
    """Invariants every graph keeps, whatever the query."""
    head = graph.head
    assert head.num_tasks == 1 and head.output.kind == RESULT
    ids = [s.stage_id for s in graph.stages]
    reads: dict[int, int] = {}  # producer -> reads of each of its partitions
    for s in graph.stages:
        assert s.num_tasks >= 1
        for inp in s.inputs:
            producer = graph.stage(inp.stage_id)
            assert ids.index(producer.stage_id) < ids.index(s.stage_id), "producers come first"
            # A runtime filter reads a shuffle or coalesce output as a broadcast.
            assert producer.output.kind == inp.boundary or inp.boundary == BROADCAST
            if inp.boundary == SHUFFLE:
                assert producer.output.num_partitions == s.num_tasks
            elif inp.boundary == COALESCE:
                assert s.num_tasks == 1
            elif inp.boundary == BROADCAST:
                assert inp.partitions == producer.output.num_partitions
            n = s.num_tasks if inp.boundary == BROADCAST else 1
            reads[inp.stage_id] = reads.get(inp.stage_id, 0) + n
        for scan in s.scans:
            assert len(scan.task_units) == s.num_tasks
            if getattr(scan, "replicated", False):
                # A small table every task reads in full (a broadcast without a stage).
                assert all(tuple(units) == tuple(scan.source.units) for units in scan.task_units)
                continue
            # Every work unit of the table is read by exactly one task.
            units = [u for per_task in scan.task_units for u in per_task]
            assert sorted(map(id, units)) == sorted(map(id, scan.source.units))
        tables = [i.table for i in s.inputs]
        assert len(set(tables)) == len(tables), "one table name per input"
    for sid, n in reads.items():
        assert graph.stage(sid).output.readers == n, f"stage {sid} is read {n} times"


def assert_explain(contexts, sql: str, expected: str) -> StageGraph:
    """Plan ``sql`` without running it; its ``explain()`` must be ``expected``.

    ``expected`` is an inline snapshot (as datafusion-distributed's insta
    inline snapshots), dedented and stripped. On a mismatch the message holds
    the text now planned: review it and paste it into the test.
    """
    ctx, _ = contexts
    df = ctx.sql(sql)
    check_well_formed(df.stage_graph())
    got = df.explain()
    assert got == textwrap.dedent(expected).strip(), f"explain() is now:\n{got}"
    return df.stage_graph()


def producer_of(graph: StageGraph, stage_id: int, boundary: str):
    """The producer stages feeding ``stage_id`` through ``boundary``."""
    return [graph.stage(i.stage_id) for i in graph.stage(stage_id).inputs if i.boundary == boundary]


def stage_with(graph: StageGraph, text: str):
    """The single stage whose fragment text contains ``text``."""
    found = [s for s in graph.stages if text in s.plan_text]
    assert len(found) == 1, f"{len(found)} stages contain {text!r}:\n{graph.render()}"
    return found[0]


# ---------------------------------------------------------------------- scans


def test_leaf_stage_splits_work_units_across_tasks(small):
    # Filter and projection pipeline into the leaf; its output is gathered by the head.
    assert_explain(
        small,
        "SELECT k, v FROM t WHERE v > 2",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Filter: t.v > Float64(2)
                Projection: t.k, t.v
                  TableScan: t
        """,
    )


def test_tasks_capped_by_workers_and_work_units(runtimes):
    ctx, oracle = make_contexts(runtimes[2], TABLES, tasks=4)
    g = run((ctx, oracle), "SELECT count(*) FROM t")
    assert g.stages[0].num_tasks == 2  # 2 workers
    ctx, oracle = make_contexts(runtimes[4], {"t": (T, 6)}, tasks=4)
    g = run((ctx, oracle), "SELECT count(*) FROM t")
    assert g.stages[0].num_tasks == 2  # 2 work units


def test_wave_sizing_fills_the_slots_then_grows_tasks_in_whole_waves():
    mib = 2**20
    est = DefaultTaskEstimator(256 * mib, wave_bytes_per_task=2048 * mib)
    # Up to the slot count: one task per bytes_per_task, as without waves.
    assert est.shuffle_tasks(100 * mib, 4) == 1
    assert est.shuffle_tasks(1000 * mib, 4) == 4
    # More than the slots would need: 2 GiB tasks, at least one wave, whole waves.
    assert est.shuffle_tasks(1100 * mib, 4) == 4
    assert est.shuffle_tasks(9000 * mib, 2) == 6  # ceil(9000 / 2048) = 5 -> 3 waves of 2
    assert est.leaf_tasks(9000 * mib, 5, 2) == 5  # never more tasks than work units
    assert DefaultTaskEstimator(256 * mib).shuffle_tasks(9000 * mib, 2) == 36
    with pytest.raises(ValueError, match="wave_bytes_per_task"):
        DefaultTaskEstimator(wave_bytes_per_task=0)
    # A stage fed by a shuffle may be sized smaller than a leaf stage.
    split = DefaultTaskEstimator(256 * mib, shuffle_bytes_per_task=64 * mib)
    assert (split.leaf_tasks(200 * mib, 8, 4), split.shuffle_tasks(200 * mib, 4)) == (1, 4)


def test_a_users_bytes_per_task_turns_the_runtimes_sizes_off():
    class SparkLike:
        bytes_per_task = 256 * 2**20
        wave_bytes_per_task = 2048 * 2**20
        shuffle_bytes_per_task = 64 * 2**20

    runtimes = DistributedConfig().task_estimator(SparkLike())
    assert (runtimes.wave_bytes_per_task, runtimes.shuffle_bytes_per_task) == (2**31, 2**26)
    user = DistributedConfig(bytes_per_task=2**20).task_estimator(SparkLike())
    assert (user.bytes_per_task, user.wave_bytes_per_task, user.shuffle_bytes_per_task) == (
        2**20,
        None,
        None,
    )


# ---------------------------------------------------------------- aggregates


def test_grouped_aggregate_partial_below_shuffle_final_above(small):
    # Partial aggregate in the producing stage, shuffle by the key, final above.
    assert_explain(
        small,
        "SELECT k, sum(v) AS sv, count(*) AS n, min(s) AS lo, max(s) AS hi FROM t GROUP BY k",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, sum(__stage_1.c1) AS c1, sum(__stage_1.c2) AS c2, min(__stage_1.c3) AS c3, max(__stage_1.c4) AS c4
              Projection: __stage_1.c0, CAST(sum(__stage_1.c1) AS Float64), CAST(sum(__stage_1.c2) AS Int64), CAST(min(__stage_1.c3) AS Utf8), CAST(max(__stage_1.c4) AS Utf8)
                Aggregate: groupBy=[[__stage_1.c0]], aggr=[[sum(__stage_1.c1), sum(__stage_1.c2), min(__stage_1.c3), max(__stage_1.c4)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[t.k AS c0]], aggr=[[sum(t.v) AS c1, count(Int64(1)) AS c2, min(t.s) AS c3, max(t.s) AS c4]]
              Projection: t.k, t.v, t.s
                TableScan: t
        """,
    )


def test_global_aggregate_partial_per_task_then_coalesce(small):
    # Partial per task, coalesced into the head, final there.
    assert_explain(
        small,
        "SELECT count(*) AS n, sum(v) AS sv, min(k) AS lo, max(s) AS hi, avg(v) AS av FROM t",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: sum(__stage_1.c0) AS c0, sum(__stage_1.c1) AS c1, min(__stage_1.c2) AS c2, max(__stage_1.c3) AS c3, sum(__stage_1.c4) / sum(__stage_1.c5) AS c4
              Projection: CAST(sum(__stage_1.c0) AS Int64), CAST(sum(__stage_1.c1) AS Float64), CAST(min(__stage_1.c2) AS Int64), CAST(max(__stage_1.c3) AS Utf8), CAST(CAST(sum(__stage_1.c4) AS Float64) / CAST(sum(__stage_1.c5) AS Float64) AS Float64)
                Aggregate: groupBy=[[]], aggr=[[sum(__stage_1.c0), sum(__stage_1.c1), min(__stage_1.c2), max(__stage_1.c3), sum(__stage_1.c4), sum(__stage_1.c5)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[]], aggr=[[count(Int64(1)) AS c0, sum(t.v) AS c1, min(t.k) AS c2, max(t.s) AS c3, sum(t.v) AS sum(t.v)__temp__0 AS c4, count(t.v) AS c5]]
              Projection: t.k, t.v, t.s
                TableScan: t
        """,
    )


def test_non_decomposable_aggregate_shuffles_raw_rows(small):
    # median does not decompose: raw rows shuffled by the key, aggregated once.
    assert_explain(
        small,
        "SELECT k, median(v) AS m FROM t GROUP BY k",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, median(__stage_1.c1) AS c1
              Aggregate: groupBy=[[__stage_1.c0]], aggr=[[median(__stage_1.c1)]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_distinct_shuffles_by_the_distinct_columns(small):
    # DISTINCT is a grouping without aggregates: shuffled by the column.
    assert_explain(
        small,
        "SELECT DISTINCT s FROM t",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0
              Aggregate: groupBy=[[__stage_1.c0]], aggr=[[]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[t.s AS c0]], aggr=[[]]
              Projection: t.s
                TableScan: t
        """,
    )


def test_distinct_over_several_columns(small):
    run(small, "SELECT DISTINCT k, s FROM t")


def test_count_distinct_global(small):
    g = run(small, "SELECT count(DISTINCT s) AS ds, count(DISTINCT k) AS dk, count(*) AS n FROM t")
    check_well_formed(g)
    assert g.stages[0].num_tasks == 4


def test_count_distinct_grouped(small):
    g = run(small, "SELECT k, count(DISTINCT s) AS ds FROM t GROUP BY k")
    check_well_formed(g)
    assert SHUFFLE in kinds(g)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT s, sum(d) AS sd, avg(d) AS ad, min(d) AS lo, max(d) AS hi FROM t GROUP BY s",
        "SELECT sum(d) AS sd, avg(d) AS ad FROM t",
        "SELECT s, sum(v) AS sv, avg(v) AS av, count(v) AS cv FROM t GROUP BY s",
        "SELECT avg(v) AS av, avg(k) AS ak, stddev(v) AS sd, var_samp(v) AS vs FROM t",
        "SELECT k, avg(d) AS ad, avg(v) AS av FROM t GROUP BY k",
        "SELECT bool_and(v > 2) AS ba, bool_or(v > 10) AS bo FROM t",
    ],
    ids=[
        "decimal-grouped",
        "decimal-global",
        "float-grouped",
        "float-global-stats",
        "avg-grouped",
        "bool",
    ],
)
def test_decimal_and_float_aggregates(small, sql):
    g = run(small, sql)
    check_well_formed(g)


def test_decimal_avg_keeps_type(small):
    ctx, oracle = small
    sql = "SELECT s, avg(d) AS ad FROM t GROUP BY s"
    got = ctx.sql(sql).to_arrow_table()
    assert got.schema == oracle.sql(sql).to_arrow_table().schema
    assert pa.types.is_decimal(got.schema.field("ad").type)


# --------------------------------------------------------------------- joins


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


def test_not_in_without_nulls(small, large):
    sql = "SELECT * FROM t WHERE k IS NOT NULL AND k NOT IN (SELECT k FROM u WHERE k IS NOT NULL)"
    run(small, sql)
    run(large, sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u)",
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u WHERE k IS NOT NULL)",
        "SELECT * FROM t WHERE k NOT IN (SELECT k FROM u WHERE k > 1000)",
    ],
    ids=["null-in-subquery", "null-outer-key", "empty-subquery"],
)
def test_not_in_with_nulls(small, sql):
    run(small, sql)


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


# ---------------------------------------------------------------------- semi-join reduction

# f: a fact table of 4000 rows over 200 keys; d: its dimension, 20 rows per c value.
F = pa.table({"k": pa.array([i % 200 for i in range(4000)], pa.int64()), "x": range(4000)})
D = pa.table({"k": pa.array(range(200), pa.int64()), "c": [f"c{i % 10}" for i in range(200)]})


def fact_and_dimension(runtimes, **config):
    """Contexts over f and d on 4 workers, equi-join sides never broadcast."""
    return make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50)}, **LARGE, **config)


def runtime_filters(graph: StageGraph) -> list[tuple[int, int]]:
    """(producer, consumer) of every broadcast read of a non-broadcast stage output."""
    return [
        (i.stage_id, s.stage_id)
        for s in graph.stages
        for i in s.inputs
        if i.boundary == BROADCAST and graph.stage(i.stage_id).output.kind != BROADCAST
    ]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT d.c, sum(f.x) AS sx FROM f JOIN d ON f.k = d.k WHERE d.c = 'c3' GROUP BY d.c",
        "SELECT count(*) AS n FROM f WHERE f.k IN (SELECT k FROM d WHERE c = 'c3')",
        "SELECT k, c FROM d WHERE c = 'c3' AND NOT EXISTS (SELECT 1 FROM f WHERE f.k = d.k "
        "AND f.x > 3990)",
        "SELECT d.k, count(f.x) AS n FROM (SELECT * FROM d WHERE c = 'c3') d "
        "LEFT JOIN f ON f.k = d.k GROUP BY d.k",
        "SELECT d.k, f.x FROM f RIGHT JOIN (SELECT * FROM d WHERE c = 'c3') d ON f.k = d.k",
    ],
)
def test_selective_side_filters_the_other_side_before_its_shuffle(runtimes, sql):
    # The filtered dimension's stage is read twice: shuffled (or gathered) into
    # the join, and as a broadcast by f's leaf stage, which keeps only rows with
    # its keys before they leave the task.
    g = run(fact_and_dimension(runtimes), sql)
    check_well_formed(g)
    ((producer, consumer),) = runtime_filters(g)
    assert "c3" in g.stage(producer).plan_text
    assert "LeftSemi Join" in g.stage(consumer).plan_text
    assert "f" in [scan.source.name for scan in g.stage(consumer).scans]
    # Turned off: the same result, no runtime filter.
    assert runtime_filters(run(fact_and_dimension(runtimes, runtime_filter_bytes=0), sql)) == []


@pytest.mark.parametrize(
    "sql",
    [
        # d is not filtered: no row of f would be dropped.
        "SELECT d.c, sum(f.x) AS sx FROM f JOIN d ON f.k = d.k GROUP BY d.c",
        # A full join keeps f's rows without a match.
        "SELECT d.k, f.x FROM f FULL JOIN (SELECT * FROM d WHERE c = 'c3') d ON f.k = d.k",
        # f's rows are the preserved side.
        "SELECT f.k, d.c FROM f LEFT JOIN (SELECT * FROM d WHERE c = 'c3') d ON f.k = d.k",
        # NULL keys match: a reduction by "=" would drop them.
        "SELECT f.x, d.c FROM f JOIN d ON f.k IS NOT DISTINCT FROM d.k WHERE d.c = 'c3'",
    ],
)
def test_no_runtime_filter_where_it_could_drop_rows_or_saves_nothing(runtimes, sql):
    g = run(fact_and_dimension(runtimes), sql)
    check_well_formed(g)
    assert runtime_filters(g) == [], g.render()


def test_runtime_filter_through_a_partitioned_join(runtimes):
    # The semi join's output is partitioned by f.k and holds only d's keys; the
    # anti join shuffles g into those partitions, filtered by d's keys as well.
    gt = pa.table({"k": pa.array([i % 300 for i in range(3000)], pa.int64()), "y": range(3000)})
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50), "g": (gt, 500)}, **LARGE)
    sql = (
        "SELECT d.k, d.c FROM d WHERE d.c = 'c3' "
        "AND EXISTS (SELECT 1 FROM f WHERE f.k = d.k AND f.x > 100) "
        "AND NOT EXISTS (SELECT 1 FROM g WHERE g.k = d.k AND g.y > 2900)"
    )
    g = run(contexts, sql)
    check_well_formed(g)
    filters = runtime_filters(g)
    assert len(filters) == 2 and len({p for p, _ in filters}) == 1, g.render()
    consumers = [g.stage(c) for _, c in filters]
    assert sorted(scan.source.name for s in consumers for scan in s.scans) == ["f", "g"]


def semi_join_over_inner_join(graph: StageGraph) -> bool:
    """Whether the (one) semi or anti join reads an inner join's output.

    That is, the inner join is below it in its stage, or in a stage it reads from.
    """
    for stage in graph.stages:
        lines = stage.plan_text.splitlines()
        depth = [len(line) - len(line.lstrip()) for line in lines]
        for i, line in enumerate(lines):
            if "LeftSemi Join" in line or "LeftAnti Join" in line:
                below = any(
                    "Inner Join" in lines[j] and depth[j] > depth[i]
                    for j in range(i + 1, len(lines))
                )
                upstream, todo = set(), [stage]
                while todo:
                    for inp in todo.pop().inputs:
                        upstream.add(inp.stage_id)
                        todo.append(graph.stage(inp.stage_id))
                return below or any("Inner Join" in graph.stage(u).plan_text for u in upstream)
    raise AssertionError(f"no semi or anti join in\n{graph.render()}")


G = pa.table({"k": pa.array([i % 300 for i in range(3000)], pa.int64()), "y": range(3000)})
IN_HAVING = "d.k IN (SELECT k FROM g GROUP BY k HAVING sum(y) > 15000)"


@pytest.mark.parametrize("config", [SMALL, LARGE], ids=["broadcast", "shuffle"])
@pytest.mark.parametrize(
    ("sql", "pushed"),
    [
        # The IN filters d's rows; f is unfiltered, so the join cannot drop d rows first.
        (
            f"SELECT d.c, sum(f.x) AS sx FROM d JOIN f ON f.k = d.k WHERE {IN_HAVING} GROUP BY d.c",
            True,
        ),
        # Pushed into the right side of the join (the anti join's columns are f's).
        (
            "SELECT d.c, f.x FROM d JOIN f ON f.k = d.k "
            "WHERE NOT EXISTS (SELECT 1 FROM g WHERE g.k = f.k AND g.y > 2000)",
            True,
        ),
        # f is filtered: the join may drop most d rows before the semi join sees them.
        (
            f"SELECT d.c, sum(f.x) AS sx FROM d JOIN f ON f.k = d.k WHERE f.x > 10 AND {IN_HAVING} "
            "GROUP BY d.c",
            False,
        ),
        # A computed key is not a column of either side.
        (
            "SELECT d.c, f.x FROM d JOIN f ON f.k = d.k "
            "WHERE d.k + f.x IN (SELECT k FROM g WHERE y > 2900)",
            False,
        ),
    ],
)
def test_semi_join_pushed_below_inner_join(runtimes, config, sql, pushed):
    # Spark's PushLeftSemiLeftAntiThroughJoin, when the other side is unfiltered.
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50), "g": (G, 500)}, **config)
    g = run(contexts, sql)
    check_well_formed(g)
    assert semi_join_over_inner_join(g) != pushed, g.render()


def reads_of(graph: StageGraph, table: str) -> int:
    """How many times stages read ``table``'s rows.

    As a replicated scan, or as an input from a stage that scans it.
    """
    scanning = {s.stage_id for s in graph.stages if any(c.source.name == table for c in s.scans)}
    replicated = sum(c.source.name == table and c.replicated for s in graph.stages for c in s.scans)
    return replicated + sum(i.stage_id in scanning for s in graph.stages for i in s.inputs)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT d.c, a.s FROM d JOIN (SELECT k, sum(x) AS s FROM f GROUP BY k) a ON a.k = d.k "
        "WHERE d.c = 'c3'",
        # TPC-H Q17's shape: the key reaches d through the join with f.
        "SELECT sum(f.x) AS s FROM f JOIN d ON f.k = d.k WHERE d.c = 'c3' "
        "AND f.x < (SELECT avg(x) FROM f f2 WHERE f2.k = d.k)",
        # TPC-H Q20's shape: the key reaches d through an IN.
        "SELECT g.k, g.y FROM g WHERE g.k IN (SELECT k FROM d WHERE c = 'c3') "
        "AND g.y > (SELECT sum(x) / 100 FROM f WHERE f.k = g.k)",
    ],
)
def test_selective_side_filters_an_aggregate_input(runtimes, sql):
    # d's filtered scan is copied below the aggregate over f as a semi join:
    # d's rows are read once more (from the same stage, when exchange reuse
    # finds the copy identical), and f's rows meet them before the aggregate.
    tables = {"f": (F, 500), "d": (D, 50), "g": (G, 500)}
    for config in (SMALL, LARGE):
        g = run(make_contexts(runtimes[4], tables, **config), sql)
        check_well_formed(g)
        assert "LeftSemi Join: f" in "".join(s.plan_text for s in g.stages), g.render()
    # Broadcast joins: no other runtime filter, so the one extra read is the copy.
    off = make_contexts(runtimes[4], tables, runtime_filter_bytes=0, **SMALL)
    on = make_contexts(runtimes[4], tables, **SMALL)
    assert reads_of(run(on, sql), "d") == reads_of(run(off, sql), "d") + 1


@pytest.mark.parametrize(
    "sql",
    [
        # d is not filtered.
        "SELECT d.c, a.s FROM d JOIN (SELECT k, sum(x) AS s FROM f GROUP BY k) a ON a.k = d.k",
        # Unmatched groups reach the output of a right join.
        "SELECT d.c, a.s FROM d RIGHT JOIN (SELECT k, sum(x) AS s FROM f GROUP BY k) a "
        "ON a.k = d.k AND d.c = 'c3'",
        # Joined on an aggregate value, not on the grouping key.
        "SELECT d.c, a.k FROM d JOIN (SELECT k, count(*) AS n FROM f GROUP BY k) a ON a.n = d.k "
        "WHERE d.c = 'c3'",
    ],
)
def test_no_aggregate_input_filter_where_it_could_drop_rows(runtimes, sql):
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50)}, **SMALL)
    g = run(contexts, sql)
    assert "LeftSemi Join: f" not in "".join(s.plan_text for s in g.stages), g.render()


@pytest.mark.parametrize("config", [SMALL, LARGE], ids=["broadcast", "shuffle"])
def test_identical_subtrees_are_one_stage(runtimes, config):
    # Spark's ReuseExchange: the same aggregate twice is computed once, read twice.
    sub = "(SELECT k, sum(x) AS s FROM f GROUP BY k)"
    sql = f"SELECT a.k, a.s, b.s AS t FROM {sub} a JOIN {sub} b ON a.k = b.k + 1"
    g = run(make_contexts(runtimes[4], {"f": (F, 500)}, **config), sql)
    check_well_formed(g)
    assert sum(any(c.source.name == "f" for c in s.scans) for s in g.stages) == 1, g.render()


def joined_first(graph: StageGraph, first: str, then: str) -> bool:
    """Whether the rows meet table ``first``'s stage in a join below the join with ``then``'s."""
    stage_of = {c.source.name: s.stage_id for s in graph.stages for c in s.scans if s.stage_id != 0}
    first_read, then_read = f"__stage_{stage_of[first]}", f"__stage_{stage_of[then]}"
    (consumer,) = [s for s in graph.stages if any(i.table == then_read for i in s.inputs)]
    lines = consumer.plan_text.splitlines()
    depth = {i: len(line) - len(line.lstrip()) for i, line in enumerate(lines) if "Join:" in line}
    upper = [depth[i] for i in depth if then_read + "." in lines[i]]
    if any(first_read + "." in lines[i] and depth[i] > min(upper) for i in depth):
        return True
    upstream, todo = set(), [consumer]
    while todo:
        for inp in todo.pop().inputs:
            if inp.table != then_read:
                upstream.add(inp.stage_id)
                todo.append(graph.stage(inp.stage_id))
    return any(
        "Join:" in line and first_read + "." in line
        for u in upstream
        for line in graph.stage(u).plan_text.splitlines()
    )


@pytest.mark.parametrize("config", [SMALL, LARGE], ids=["broadcast", "shuffle"])
def test_filtered_dimension_joined_before_other_joins(runtimes, config):
    # FROM f JOIN g ... JOIN d: the selective d joins f before g does.
    sql = (
        "SELECT d.c, count(*) AS n FROM f JOIN g ON f.x = g.y JOIN d ON f.k = d.k "
        "WHERE d.c = 'c3' GROUP BY d.c"
    )
    tables = {"f": (F, 500), "d": (D, 50), "g": (G, 500)}
    g = run(make_contexts(runtimes[4], tables, **config), sql)
    check_well_formed(g)
    assert joined_first(g, "d", "g"), g.render()
    off = run(make_contexts(runtimes[4], tables, runtime_filter_bytes=0, **config), sql)
    assert not joined_first(off, "d", "g"), off.render()


# ---------------------------------------------------------------------- sorts


def test_sort_per_task_then_merge_on_coalesce(small):
    # Each task sorts its rows; the head merges them.
    assert_explain(
        small,
        "SELECT k, v, s FROM t ORDER BY v DESC NULLS LAST, k",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Sort: __stage_1.c1 DESC NULLS LAST, __stage_1.c0 ASC NULLS LAST
              TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1, t.s AS c2
              Sort: t.v DESC NULLS LAST, t.k ASC NULLS LAST
                Projection: t.k, t.v, t.s
                  TableScan: t
        """,
    )


def test_top_k_per_task_then_again_after_coalesce(small):
    # Each task keeps its top 3; the head takes the top 3 of those.
    assert_explain(
        small,
        "SELECT k, v FROM t ORDER BY v DESC NULLS LAST LIMIT 3",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Limit: skip=0, fetch=3
              Sort: __stage_1.c1 DESC NULLS LAST
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Limit: skip=0, fetch=3
                Sort: t.v DESC NULLS LAST
                  Projection: t.k, t.v
                    TableScan: t
        """,
    )


def test_top_k_with_offset(small):
    g = run(small, "SELECT k, v FROM t ORDER BY v LIMIT 2 OFFSET 3", ordered=True)
    # Each task keeps offset + count rows; the offset applies once, after the merge.
    assert "fetch=5" in g.stages[0].plan_text and "skip=3" in g.head.plan_text


def test_sort_after_aggregate(small):
    g = run(small, "SELECT s, sum(v) AS sv FROM t GROUP BY s ORDER BY sv DESC, s", ordered=True)
    check_well_formed(g)
    assert kinds(g) == [COALESCE, SHUFFLE]


def test_limit_without_order_by(small):
    ctx, _ = small
    df = ctx.sql("SELECT k, v, s FROM t LIMIT 5")
    g = df.stage_graph()
    check_well_formed(g)
    leaf, head = g.stages
    assert leaf.num_tasks == 4 and "Limit" in leaf.plan_text and "Limit" in head.plan_text
    got = df.to_arrow_table()
    # Which rows is unspecified; how many is not, and each is a row of t.
    assert got.num_rows == 5
    table_rows = T.select(["k", "v", "s"]).to_pylist()
    for row in got.to_pylist():
        assert row in table_rows
    assert ctx.sql("SELECT k FROM t LIMIT 100").to_arrow_table().num_rows == 12
    assert ctx.sql("SELECT k FROM t LIMIT 0").to_arrow_table().num_rows == 0


def test_limit_with_offset_without_order_by(small):
    ctx, _ = small
    got = ctx.sql("SELECT k, v FROM t LIMIT 4 OFFSET 10").to_arrow_table()
    assert got.num_rows == 2
    table_rows = T.select(["k", "v"]).to_pylist()
    assert all(r in table_rows for r in got.to_pylist())


# -------------------------------------------------------------------- windows


def test_window_with_partition_by_shuffles_by_its_keys(small):
    # Shuffled once, by the PARTITION BY key (k, column 0 of the producer).
    assert_explain(
        small,
        "SELECT k, v, sum(v) OVER (PARTITION BY k) AS sv FROM t",
        """
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (4 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, __stage_1.c1, sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING AS c2
              Projection: __stage_1.c0, __stage_1.c1, sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                WindowAggr: windowExpr=[[sum(__stage_1.c1) PARTITION BY [__stage_1.c0] ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING]]
                  TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: shuffle (hash ['c0']) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_ranking_windows_with_partition_and_order(small):
    g = run(
        small,
        "SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v) AS rn, "
        "rank() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM t",
    )
    check_well_formed(g)
    assert SHUFFLE in kinds(g)


def test_window_on_string_partition_key(small):
    g = run(
        small,
        "SELECT s, v, avg(v) OVER (PARTITION BY s) AS av, count(*) OVER (PARTITION BY s) AS n FROM t",
    )
    check_well_formed(g)


def test_window_without_partition_by_coalesces(small):
    # No PARTITION BY: every row in one task, no shuffle.
    assert_explain(
        small,
        "SELECT k, v, rank() OVER (ORDER BY v DESC) AS r, sum(v) OVER () AS total FROM t",
        """
        Stage 2 [head, 1 task]
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW AS c2, sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING AS c3
              Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW, sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                WindowAggr: windowExpr=[[sum(__stage_1.c1) ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING]]
                  Projection: __stage_1.c0, __stage_1.c1, rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
                    WindowAggr: windowExpr=[[rank() ORDER BY [__stage_1.c1 DESC NULLS FIRST] RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW]]
                      TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              TableScan: t
        """,
    )


def test_windows_with_different_partitions_coalesce(small):
    g = run(
        small,
        "SELECT k, s, sum(v) OVER (PARTITION BY k) AS a, sum(v) OVER (PARTITION BY s) AS b FROM t",
    )
    check_well_formed(g)


# --------------------------------------------------------------------- unions


def test_union_all_inputs_side_by_side_in_one_stage(small):
    # Each input shuffled round-robin into the union's stage.
    assert_explain(
        small,
        "SELECT k FROM t UNION ALL SELECT CAST(k AS BIGINT) FROM u",
        """
        Stage 4 [head, 1 task]
          <- coalesce from stage 3 (4 tasks) as __stage_3
            TableScan: __stage_3
        Stage 3 [4 tasks]  output: coalesce
          <- shuffle from stage 1 (4 tasks) as __stage_1
          <- shuffle from stage 2 (4 tasks) as __stage_2
            Union
              TableScan: __stage_1
              TableScan: __stage_2
        Stage 2 [leaf, 4 tasks]  output: shuffle (round-robin) -> 4 partitions
          <- scan u (4 work units, per task [1, 1, 1, 1])
            Projection: CAST(u.k AS Int64) AS c0
              Projection: u.k
                TableScan: u
        Stage 1 [leaf, 4 tasks]  output: shuffle (round-robin) -> 4 partitions
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0
              TableScan: t
        """,
    )


def test_union_distinct(small):
    g = run(small, "SELECT k FROM t UNION SELECT k FROM u")
    check_well_formed(g)
    # The distinct runs after the union, shuffled by the column.
    assert kinds(g).count(SHUFFLE) == 3


def test_union_all_of_three_with_aggregate(small):
    run(
        small,
        "SELECT s, count(*) AS n FROM (SELECT s FROM t UNION ALL SELECT w FROM u "
        "UNION ALL SELECT 'z') GROUP BY s",
    )


# --------------------------------------------------------------- empty inputs


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM e",
        "SELECT k, sum(x) AS sx FROM e GROUP BY k",
        "SELECT count(*) AS n, sum(x) AS sx, avg(x) AS ax, min(k) AS lo FROM e",
        "SELECT * FROM t WHERE v > 1000",
        "SELECT k, count(*) AS n, sum(v) AS sv FROM t WHERE v > 1000 GROUP BY k",
        "SELECT count(*) AS n, sum(v) AS sv, avg(d) AS ad, max(s) AS ms FROM t WHERE v > 1000",
        "SELECT count(DISTINCT s) AS n FROM t WHERE v > 1000",
        "SELECT t.k, t.v, e.x FROM t JOIN e ON t.k = e.k",
        "SELECT t.k, t.v, e.x FROM t LEFT JOIN e ON t.k = e.k",
        "SELECT t.k, e.x FROM e RIGHT JOIN t ON t.k = e.k",
        "SELECT t.k, e.x FROM t FULL JOIN e ON t.k = e.k",
        "SELECT * FROM t WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.k = t.k)",
        "SELECT * FROM t WHERE k IN (SELECT k FROM e)",
        "SELECT t.k, u.w FROM t JOIN u ON t.k = u.k WHERE t.v > 1000",
        "SELECT k, v FROM t WHERE v > 1000 ORDER BY v LIMIT 3",
        "SELECT k, sum(v) OVER (PARTITION BY k) AS sv FROM t WHERE v > 1000",
        "SELECT k FROM e UNION ALL SELECT k FROM t WHERE v > 1000",
    ],
)
@pytest.mark.parametrize("contexts", ["small", "large"])
def test_empty_inputs(request, contexts, sql):
    g = run(request.getfixturevalue(contexts), sql)
    check_well_formed(g)


def test_global_aggregate_over_empty_input_gives_one_row(small):
    ctx, _ = small
    got = ctx.sql("SELECT count(*) AS n, sum(v) AS sv FROM t WHERE v > 1000").to_pylist()
    assert got == [{"n": 0, "sv": None}]


def test_table_registered_with_no_rows_is_one_work_unit(small):
    ctx, _ = small
    (stage,) = ctx.sql("SELECT * FROM e").stage_graph().stages
    assert stage.num_tasks == 1 and len(stage.scans[0].source.units) == 1


# ------------------------------------------------------------------- subqueries


def test_scalar_subquery_and_correlated_filter(small):
    run(small, "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)")
    run(small, "SELECT k, v FROM t t1 WHERE v > (SELECT avg(v) FROM t t2 WHERE t2.k = t1.k)")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)",
        "SELECT k, v - (SELECT max(v) FROM t) AS d FROM t",
        "SELECT k, v FROM t WHERE v > (SELECT avg(t2.v) FROM t t2 WHERE t2.v < (SELECT max(t3.v) FROM t t3))",
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t) AND k < (SELECT max(k) FROM u)",
        "SELECT k FROM t WHERE v > (SELECT min(x) FROM e)",  # an empty subquery: NULL
    ],
)
def test_uncorrelated_scalar_subquery_is_a_stage_of_its_own(small, sql):
    # The outer scan keeps its four tasks; each reads the subquery's one row as
    # a broadcast (the subquery's own scan is distributed as any query's).
    g = run(small, sql)
    check_well_formed(g)
    readers = [s for s in g.stages if "(<subquery>)" in s.plan_text]
    assert max(s.num_tasks for s in readers) == 4, g.render()
    broadcasts = sum(i.boundary == BROADCAST for s in readers for i in s.inputs)
    assert broadcasts == sql.count("(SELECT"), g.render()


def test_uncorrelated_scalar_subquery_plan(small):
    # The subquery is a query of its own, gathered into one task; the outer
    # scan's four tasks read its one row as a broadcast.
    assert_explain(
        small,
        "SELECT k, v FROM t WHERE v > (SELECT avg(v) FROM t)",
        """
        Stage 4 [head, 1 task]
          <- coalesce from stage 3 (4 tasks) as __stage_3
            TableScan: __stage_3
        Stage 3 [4 tasks]  output: coalesce
          <- broadcast from stage 2 (1 tasks) as __stage_2
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Projection: t.k AS c0, t.v AS c1
              Filter: t.v > (<subquery>)
                Subquery:
                  TableScan: __stage_2
                Projection: t.k, t.v
                  TableScan: t
        Stage 2 [1 task]  output: broadcast -> 4 tasks
          <- coalesce from stage 1 (4 tasks) as __stage_1
            Projection: CAST(CAST(sum(__stage_1.c0) AS Float64) / CAST(sum(__stage_1.c1) AS Float64) AS Float64) AS c0
              Aggregate: groupBy=[[]], aggr=[[sum(__stage_1.c0), sum(__stage_1.c1)]]
                TableScan: __stage_1
        Stage 1 [leaf, 4 tasks]  output: coalesce
          <- scan t (4 work units, per task [1, 1, 1, 1])
            Aggregate: groupBy=[[]], aggr=[[sum(t.v) AS c0, count(t.v) AS c1]]
              Projection: t.v
                TableScan: t
        """,
    )


def test_cte_and_nested_aggregate(small):
    run(
        small,
        "WITH g AS (SELECT k, sum(v) AS sv FROM t GROUP BY k) "
        "SELECT g.k, g.sv, u.w FROM g LEFT JOIN u ON g.k = u.k",
    )


# ----------------------------------------------------------- task counts 1..4


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_fewer_workers(runtimes, workers):
    contexts = make_contexts(runtimes[workers], TABLES, tasks=None)
    for sql in (
        "SELECT k, sum(v) AS sv FROM t GROUP BY k",
        "SELECT t.k, u.w FROM t FULL JOIN u ON t.k = u.k",
        "SELECT k, v FROM t ORDER BY v LIMIT 4",
    ):
        g = run(contexts, sql, ordered="ORDER BY" in sql)
        check_well_formed(g)
        assert max(s.num_tasks for s in g.stages) <= workers


# ------------------------------------------------------------- property test

_keys = st.one_of(st.none(), st.integers(-3, 3))
_rows = st.lists(st.tuples(_keys, st.one_of(st.none(), st.integers(-100, 100))), max_size=30)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    left=_rows,
    right=_rows,
    workers=st.integers(1, 4),
    rows_per_unit=st.integers(1, 8),
    broadcast=st.booleans(),
    key_type=st.sampled_from([pa.int32(), pa.int64(), pa.int8()]),
)
def test_random_tables_match_single_node(
    runtimes, left, right, workers, rows_per_unit, broadcast, key_type
):
    a = pa.table(
        {
            "k": pa.array([r[0] for r in left], pa.int64()),
            "x": pa.array([r[1] for r in left], pa.int64()),
        }
    )
    b = pa.table(
        {
            "k": pa.array([r[0] for r in right], key_type),
            "y": pa.array([r[1] for r in right], pa.int64()),
        }
    )
    contexts = make_contexts(
        runtimes[workers],
        {"a": (a, rows_per_unit), "b": (b, rows_per_unit)},
        tasks=workers,
        **(SMALL if broadcast else LARGE),
    )
    for sql in (
        "SELECT k, count(*) AS n, count(x) AS nx, sum(x) AS sx, min(x) AS lo, max(x) AS hi, avg(x) AS ax "
        "FROM a GROUP BY k",
        "SELECT a.k, a.x, b.y FROM a JOIN b ON a.k = b.k",
        "SELECT a.k, a.x, b.k AS bk, b.y FROM a FULL JOIN b ON a.k = b.k",
        "SELECT b.k, count(*) AS n, sum(a.x) AS sx FROM a JOIN b ON a.k = b.k GROUP BY b.k",
    ):
        check_well_formed(run(contexts, sql))


# ----------------------------------------------------------- rendered snapshot


def test_explain_snapshot(runtimes):
    ctx, _ = make_contexts(runtimes[2], {"t": (T, 6)}, tasks=2)
    text = ctx.sql("SELECT k, count(*) AS n FROM t WHERE v > 2 GROUP BY k").explain()
    assert text == textwrap.dedent(
        """\
        Stage 3 [head, 1 task]
          <- coalesce from stage 2 (2 tasks) as __stage_2
            TableScan: __stage_2
        Stage 2 [2 tasks]  output: coalesce
          <- shuffle from stage 1 (2 tasks) as __stage_1
            Projection: __stage_1.c0, sum(__stage_1.c1) AS c1
              Projection: __stage_1.c0, CAST(sum(__stage_1.c1) AS Int64)
                Aggregate: groupBy=[[__stage_1.c0]], aggr=[[sum(__stage_1.c1)]]
                  TableScan: __stage_1
        Stage 1 [leaf, 2 tasks]  output: shuffle (hash ['c0']) -> 2 partitions
          <- scan t (2 work units, per task [1, 1])
            Aggregate: groupBy=[[t.k AS c0]], aggr=[[count(Int64(1)) AS c1]]
              Projection: t.k
                Filter: t.v > Float64(2)
                  Projection: t.k, t.v
                    TableScan: t"""
    )
