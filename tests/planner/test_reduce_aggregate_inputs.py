"""An aggregate's input filtered by a selective join side (:mod:`distfusion.planner.reduce_aggregate_inputs`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import textwrap

import pytest

from distfusion.planner.reduce_aggregate_inputs import reduce_aggregate_inputs
from distfusion.stages import StageGraph
from tests.planner.helpers import (
    LARGE,
    SMALL,
    D,
    F,
    G,
    apply_pass,
    apply_reduction,
    check_well_formed,
    make_contexts,
    run,
)


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


def test_the_pass_filters_the_aggregate_input_by_the_selective_side(runtimes):
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50)}, **SMALL)
    sql = (
        "SELECT d.c, a.s FROM d JOIN (SELECT k, sum(x) AS s FROM f GROUP BY k) a ON a.k = d.k "
        "WHERE d.c = 'c3'"
    )
    _, after = apply_reduction(contexts, sql, reduce_aggregate_inputs)
    assert after == textwrap.dedent(
        """\
        Projection: d.c, sum(f.x) AS s
          Inner Join: d.k = f.k
            Filter: d.c = Utf8("c3")
              TableScan: d
            Projection: f.k, sum(f.x)
              Aggregate: groupBy=[[f.k]], aggr=[[sum(f.x)]]
                LeftSemi Join: f.k = d.k
                  TableScan: f
                  Filter: d.c = Utf8("c3")
                    TableScan: d"""
    )
    # Turned off (runtime_filter_bytes=0): the plan stays as DataFusion made it.
    before, unchanged = apply_pass(
        contexts,
        sql,
        lambda plan, oracle: reduce_aggregate_inputs(plan, oracle, contexts[0].sources, 0),
    )
    assert unchanged == before


def test_a_copy_over_the_bound_applies_while_broadcasting_it_pays(runtimes):
    """The copied scan grows with the data.

    TPC-H Q17 at SF30: ``part``'s 0.1% is estimated at 12 MiB (the selectivity
    is floored at 5%); without the copy the query aggregated all of lineitem,
    6x slower. Over ``runtime_filter_bytes`` the copy is made while broadcasting it pays
    (``PlannerConfig.broadcast_pays``), up to ten times the bound.
    """
    sql = (
        "SELECT d.c, a.s FROM d JOIN (SELECT k, sum(x) AS s FROM f GROUP BY k) a ON a.k = d.k "
        "WHERE d.c = 'c3'"
    )
    tables = {"f": (F, 500), "d": (D, 50), "g": (G, 500)}

    def copied(runtime_filter_bytes: int, max_broadcast_bytes: int) -> bool:
        contexts = make_contexts(
            runtimes[4],
            tables,
            runtime_filter_bytes=runtime_filter_bytes,
            broadcast_threshold_bytes=0,
            max_broadcast_bytes=max_broadcast_bytes,
        )
        g = run(contexts, sql)
        check_well_formed(g)
        return "LeftSemi Join: f" in "".join(s.plan_text for s in g.stages)

    # d's filtered scan is estimated between 160 and 320 bytes.
    assert copied(320, 0)  # within the bound: always
    assert not copied(80, 0)  # over it, and broadcasting never pays
    assert copied(80, 1_000_000)
    assert not copied(10, 1_000_000)  # over ten times the bound


def test_the_copy_filters_the_table_with_the_key_below_the_aggregates_joins(runtimes):
    # TPC-H Q2's shape: the aggregate reads f joined with a filtered g; the
    # copy of d's 10% goes down to f's scan, before f's rows meet g (which
    # would keep most of them), not above that join.
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50), "g": (G, 500)}, **SMALL)
    sql = (
        "SELECT d.c, a.s FROM d JOIN (SELECT f.k, sum(f.x) AS s FROM f JOIN g ON f.x = g.y "
        "WHERE g.y > 100 GROUP BY f.k) a ON a.k = d.k WHERE d.c = 'c3'"
    )
    _, after = apply_reduction(contexts, sql, reduce_aggregate_inputs)
    lines = after.splitlines()
    (semi,) = [i for i, line in enumerate(lines) if "LeftSemi Join: f.k = d.k" in line]
    below = lines[semi + 1 :]
    assert "Join" not in below[0] and ("f.x" in below[0] or "TableScan: f" in below[0]), after
    assert lines.index(next(line for line in lines if "Inner Join: f.x = g.y" in line)) < semi, (
        after
    )
