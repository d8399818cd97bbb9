"""Join hints (:mod:`distfusion.planner.join_hints`, :mod:`distfusion.spark_sql.hints`).

Spark SQL's ``/*+ BROADCAST(t) */``, ``MERGE`` and ``SHUFFLE_HASH`` on real
DataFusion plans (``DistributedConfig(sql_dialect="spark")``, the in-process
runtime, no Spark): each hinted join is distributed as hinted where without the
hint it would not be, and answers as without the hint. Spark itself answers the
same hinted queries in tests/runtime/test_spark_sql_hints.py.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest
import sqlglot

from distfusion import DistributedConfig, DistributedContext
from distfusion.planner.join_hints import JoinHint, join_hint
from distfusion.spark_sql import parse
from distfusion.stages import BROADCAST, SHUFFLE
from tests.compare import assert_same_result
from tests.planner.helpers import LARGE, SMALL, TABLES, check_well_formed, edges

JOIN = "SELECT {hint} t.k, t.v, u.w FROM t JOIN u ON t.k = u.k"


def _context(runtimes, **config) -> DistributedContext:
    ctx = DistributedContext(
        runtime=runtimes[4],
        config=DistributedConfig(tasks_per_stage=4, sql_dialect="spark", **config),
    )
    for name, (table, rows_per_unit) in TABLES.items():
        ctx.register_table(name, table, max_rows_per_unit=rows_per_unit)
    return ctx


@pytest.fixture
def small(runtimes):
    """Spark SQL over t, u, e on 4 workers; every side the join type allows is broadcast."""
    return _context(runtimes, **SMALL)


@pytest.fixture
def large(runtimes):
    """As ``small``, but no equi-join side is broadcast unless hinted."""
    return _context(runtimes, **LARGE)


def _run(ctx: DistributedContext, hinted: str, plain: str, ran: bool = False):
    """``hinted``'s stage graph (``ran``: as it ran, after adaptive execution).

    Its answer must be ``plain``'s (the same query without the hint).
    """
    df = ctx.sql(hinted)
    static = df.stage_graph()
    check_well_formed(static)
    got = df.to_arrow_table()
    assert_same_result(got, ctx.sql(plain).to_arrow_table(), ordered=False)
    return df.last_run.final if ran else static


def _scans(graph, table: str) -> int:
    (stage,) = [s for s in graph.stages if any(sc.source.name == table for sc in s.scans)]
    return stage.stage_id


def _broadcast_of(graph, table: str) -> bool:
    """Whether the stage scanning ``table`` is read as a broadcast."""
    producer = _scans(graph, table)
    return any(p == producer and b == BROADCAST for p, b, _ in edges(graph))


def _both_shuffled(graph) -> bool:
    return any(sum(i.boundary == SHUFFLE for i in s.inputs) == 2 for s in graph.stages)


@pytest.mark.parametrize(
    "hint", ["MERGE(u)", "SHUFFLE_MERGE(t)", "MERGEJOIN(u)", "SHUFFLE_HASH(t)"]
)
def test_shuffle_hint_shuffles_a_join_the_size_rule_broadcasts(small, hint):
    plain = small.sql(JOIN.format(hint="")).stage_graph()
    assert _broadcast_of(plain, "u") and not _both_shuffled(plain)
    g = _run(small, JOIN.format(hint=f"/*+ {hint} */"), JOIN.format(hint=""), ran=True)
    assert _both_shuffled(g) and BROADCAST not in {b for _, b, _ in edges(g)}


def test_adaptive_execution_keeps_a_hinted_shuffle(runtimes):
    # Shuffles run before their consumers are planned; u's side, estimated non-empty,
    # is measured empty, and planning again reads it as a broadcast; with MERGE(u)
    # both sides stay shuffled (Spark's AQE keeps a hinted join's strategy too).
    ctx = _context(runtimes, adaptive_shuffle_bytes=0, **LARGE)
    q = "SELECT {hint} t.k, t.v, u.w FROM t JOIN u ON t.k = u.k WHERE u.w = 'none'"
    plain = _run(ctx, q.format(hint=""), q.format(hint=""), ran=True)
    assert not _both_shuffled(plain), "the adaptive broadcast this test is about"
    g = _run(ctx, q.format(hint="/*+ MERGE(u) */"), q.format(hint=""), ran=True)
    assert _both_shuffled(g) and BROADCAST not in {b for _, b, _ in edges(g)}


@pytest.mark.parametrize("hint", ["BROADCAST(t)", "BROADCASTJOIN(t)", "MAPJOIN(t)", "broadcast(T)"])
def test_broadcast_hint_broadcasts_a_join_the_size_rule_shuffles(large, hint):
    assert _both_shuffled(large.sql(JOIN.format(hint="")).stage_graph())
    g = _run(large, JOIN.format(hint=f"/*+ {hint} */"), JOIN.format(hint=""), ran=True)
    assert _broadcast_of(g, "t") and not _both_shuffled(g)


def test_broadcast_of_the_preserved_side_of_an_outer_join_is_ignored(large):
    # Spark cannot build a LEFT JOIN's left side either: the hint changes nothing.
    q = "SELECT {hint} t.k, u.w FROM t LEFT JOIN u ON t.k = u.k"
    g = _run(large, q.format(hint="/*+ BROADCAST(t) */"), q.format(hint=""))
    assert _both_shuffled(g)
    g = _run(large, q.format(hint="/*+ BROADCAST(u) */"), q.format(hint=""))
    assert _broadcast_of(g, "u") and not _both_shuffled(g)


def test_broadcast_outranks_merge_on_the_other_side(large, small):
    g = _run(large, JOIN.format(hint="/*+ MERGE(t), BROADCAST(u) */"), JOIN.format(hint=""))
    assert _broadcast_of(g, "u") and not _both_shuffled(g)
    # An unfollowable BROADCAST falls through to MERGE, as in Spark's JoinSelection.
    q = "SELECT {hint} t.k, u.w FROM t LEFT JOIN u ON t.k = u.k"
    g = _run(small, q.format(hint="/*+ BROADCAST(t), MERGE(u) */"), q.format(hint=""))
    assert _both_shuffled(g)


def test_a_hint_names_the_alias_not_the_table_of_an_aliased_relation(large):
    q = "SELECT {hint} a.k, b.w FROM t AS a JOIN u AS b ON a.k = b.k"
    g = _run(large, q.format(hint="/*+ BROADCAST(u) */"), q.format(hint=""))
    assert _both_shuffled(g), "u is aliased b: BROADCAST(u) names nothing (Spark's rule)"
    g = _run(large, q.format(hint="/*+ BROADCAST(b) */"), q.format(hint=""))
    assert _broadcast_of(g, "u")


def test_a_hint_reaches_the_join_above_a_derived_table_and_its_block(large):
    q = (
        "SELECT {outer} t.k, x.c FROM t JOIN "
        "(SELECT {inner} k, count(*) AS c FROM u GROUP BY k) x ON t.k = x.k"
    )
    plain = q.format(outer="", inner="")
    assert _both_shuffled(large.sql(plain).stage_graph())
    for outer, inner in (("/*+ BROADCAST(x) */", ""), ("", "/*+ BROADCAST */")):
        g = _run(large, q.format(outer=outer, inner=inner), plain)
        assert not _both_shuffled(g) and BROADCAST in {b for _, b, _ in edges(g)}


def test_a_hint_stops_at_the_first_join_above_its_relation(large):
    # BROADCAST(u) hints t JOIN u; the join of that with v (u again) has no hinted side.
    q = "SELECT {hint} t.k, u.w, v.w AS vw FROM t JOIN u ON t.k = u.k JOIN u AS v ON t.k = v.k"
    g = _run(large, q.format(hint="/*+ BROADCAST(u) */"), q.format(hint=""))
    u_stage, v_stage = sorted(
        s.stage_id for s in g.stages if any(sc.source.name == "u" for sc in s.scans)
    )
    assert (u_stage, BROADCAST) in {(p, b) for p, b, _ in edges(g)}
    assert (v_stage, SHUFFLE) in {(p, b) for p, b, _ in edges(g)}, "the join with v is shuffled"


@pytest.mark.parametrize(
    "hint",
    ["REPARTITION(3)", "REPARTITION(3, k)", "COALESCE(2)", "REBALANCE", "REPARTITION_BY_RANGE(k)"],
)
def test_partitioning_and_unknown_hints_are_accepted_and_change_no_join(large, hint):
    for h in (hint, "NO_SUCH_HINT(t)", "BROADCAST(nothing)"):
        g = _run(large, JOIN.format(hint=f"/*+ {h} */"), JOIN.format(hint=""))
        assert _both_shuffled(g)


def test_the_hint_rides_the_substrait_join_as_an_ignorable_optimization(large):
    df = large.sql(JOIN.format(hint="/*+ BROADCAST(u) */"))
    assert "__distfusion_hint_broadcast" in df.df.optimized_logical_plan().display_indent()
    from substrait.proto import Plan

    from distfusion.substrait_plan.walk import relations

    plan = Plan()
    plan.ParseFromString(df._substrait())
    (join,) = [r for r in relations(plan.relations[0].root.input) if r.HasField("join")]
    assert join_hint(join) == JoinHint(None, "broadcast")


# -- which relations a hint names (sqlglot's tree only: Spark's resolution rules)


def _hinted(query: str) -> dict[str, str]:
    """Relation alias -> the strategy its marker carries, after :func:`parse`."""
    found = {}
    for sub in parse(query).find_all(sqlglot.exp.Subquery):
        inner = sub.this.args.get("from_") if isinstance(sub.this, sqlglot.exp.Select) else None
        alias = inner.this.alias if inner is not None else ""
        if alias.startswith("__distfusion_hint_"):
            found[sub.alias] = alias.removeprefix("__distfusion_hint_")
    return found


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT /*+ BROADCAST(u) */ * FROM t JOIN u ON t.k = u.k", {"u": "broadcast"}),
        ("SELECT /*+ BROADCAST(db.u) */ * FROM t JOIN db.u ON t.k = u.k", {"u": "broadcast"}),
        ("SELECT /*+ BROADCAST(u) */ * FROM t JOIN db.u ON t.k = u.k", {"u": "broadcast"}),
        ("SELECT /*+ BROADCAST(other.u) */ * FROM t JOIN db.u ON t.k = u.k", {}),
        (
            "SELECT /*+ BROADCAST(u, t) */ * FROM t JOIN u ON t.k = u.k",
            {"u": "broadcast", "t": "broadcast"},
        ),
        # the first written of two strategies for one relation wins (Spark: "hint overridden")
        ("SELECT /*+ MERGE(u), BROADCAST(u) */ * FROM t JOIN u ON t.k = u.k", {"u": "merge"}),
        ("SELECT /*+ SHUFFLE_REPLICATE_NL(u) */ * FROM t, u", {"u": "shuffle_replicate_nl"}),
        # another block's relations are not this block's
        ("SELECT /*+ BROADCAST(u) */ * FROM t JOIN (SELECT * FROM u) x ON t.k = x.k", {}),
        ("SELECT /*+ BROADCAST(u) */ * FROM t JOIN (u JOIN e ON u.k = e.k) ON t.k = u.k", {}),
        # a predicate subquery without a join of its own: nothing to hint
        ("SELECT * FROM t WHERE k IN (SELECT /*+ BROADCAST(u) */ k FROM u)", {}),
        (
            "WITH c AS (SELECT /*+ BROADCAST */ * FROM u) SELECT * FROM t JOIN c ON t.k = c.k",
            {"c": "broadcast"},
        ),
        ("SELECT /*+ REPARTITION(4), COALESCE(1) */ * FROM t JOIN u ON t.k = u.k", {}),
    ],
)
def test_hints_name_relations_as_spark_resolves_them(query, expected):
    assert _hinted(query) == expected
    assert "/*+" not in parse(query).sql(dialect="spark")
