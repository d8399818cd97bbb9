"""Planner tests: the small tables and the checks every tests/planner/ module shares.

One test module per planner module (``test_<module>.py``).

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
from datafusion import SessionContext
from datafusion.substrait import Producer
from substrait.proto import Plan

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.stages import BROADCAST, COALESCE, RESULT, SHUFFLE, StageGraph
from distfusion.substrait_plan.decode import consume_plan
from distfusion.substrait_plan.rewrite import SchemaOracle
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


# f: a fact table of 4000 rows over 200 keys; d: its dimension, 20 rows per c value.
F = pa.table({"k": pa.array([i % 200 for i in range(4000)], pa.int64()), "x": range(4000)})


D = pa.table({"k": pa.array(range(200), pa.int64()), "c": [f"c{i % 10}" for i in range(200)]})


G = pa.table({"k": pa.array([i % 300 for i in range(3000)], pa.int64()), "y": range(3000)})


def fact_and_dimension(runtimes, **config):
    """Contexts over f and d on 4 workers, equi-join sides never broadcast."""
    return make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50)}, **LARGE, **config)


def substrait_of(ctx: SessionContext, sql: str):
    """DataFusion's Substrait plan of ``sql``'s optimized logical plan, and that logical plan.

    What ``coordinator/execution.py`` hands the planner, before any pass ran.
    """
    logical = ctx.sql(sql).optimized_logical_plan()
    plan = Plan()
    plan.ParseFromString(Producer.to_substrait_plan(logical, ctx).encode())
    return plan, logical


def consumed(ctx: SessionContext, plan: Plan) -> str:
    """``plan`` consumed again by DataFusion: its logical plan's text (an inline snapshot's).

    Raises:
        Exception: DataFusion's error when its consumer rejects the plan.
    """
    return str(consume_plan(ctx, plan.SerializeToString()).display_indent()).strip()


def apply_pass(contexts, sql: str, rewrite) -> tuple[str, str]:
    """``sql``'s plan before and after ``rewrite(plan, oracle)``, as consumed plan texts.

    The rewritten plan must answer as DataFusion does from ``sql`` (compared
    with :func:`~tests.compare.assert_same_result`).
    """
    ctx, _ = contexts
    session = ctx.ctx
    plan, _ = substrait_of(session, sql)
    before = consumed(session, plan)
    oracle = SchemaOracle(plan, {n: s.schema for n, s in ctx.sources.items()})
    rewrite(plan, oracle)
    after = consumed(session, plan)
    lp = consume_plan(session, plan.SerializeToString())
    got = session.create_dataframe_from_logical_plan(lp).to_arrow_table()
    assert_same_result(got, session.sql(sql).to_arrow_table(), ordered=False)
    return before, after


def apply_reduction(contexts, sql: str, rule) -> tuple[str, str]:
    """:func:`apply_pass` of a reduction pass ``rule(plan, oracle, sources, bound)``.

    ``sources`` and ``bound`` (``runtime_filter_bytes``) are the distributed
    context's, as the planner passes them.
    """
    ctx, _ = contexts
    bound = ctx.config.runtime_filter_bytes
    return apply_pass(contexts, sql, lambda plan, oracle: rule(plan, oracle, ctx.sources, bound))
