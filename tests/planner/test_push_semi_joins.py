"""Semi and anti joins pushed below inner joins (:mod:`distfusion.planner.push_semi_joins`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import textwrap

import pytest

from distfusion.planner.push_semi_joins import push_semi_joins
from distfusion.stages import StageGraph
from tests.planner.helpers import (
    LARGE,
    SMALL,
    D,
    F,
    G,
    apply_pass,
    check_well_formed,
    make_contexts,
    run,
)


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


def test_the_pass_moves_the_semi_join_below_the_inner_join(runtimes):
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50), "g": (G, 500)}, **SMALL)
    sql = f"SELECT d.c, sum(f.x) AS sx FROM d JOIN f ON f.k = d.k WHERE {IN_HAVING} GROUP BY d.c"
    before, after = apply_pass(contexts, sql, push_semi_joins)
    assert before == textwrap.dedent(
        """\
        Projection: d.c, sum(f.x) AS sx
          Aggregate: groupBy=[[d.c]], aggr=[[sum(f.x)]]
            Projection: d.c, f.x
              LeftSemi Join: d.k = g.k
                Projection: d.k, d.c, f.x
                  Inner Join: d.k = f.k
                    TableScan: d
                    TableScan: f
                Projection: g.k
                  Filter: sum(g.y) > Int64(15000)
                    Aggregate: groupBy=[[g.k]], aggr=[[sum(g.y)]]
                      TableScan: g"""
    )
    assert after == textwrap.dedent(
        """\
        Projection: d.c, sum(f.x) AS sx
          Aggregate: groupBy=[[d.c]], aggr=[[sum(f.x)]]
            Projection: d.c, f.x
              Projection: d.k, d.c, f.x
                Inner Join: d.k = f.k
                  LeftSemi Join: d.k = g.k
                    TableScan: d
                    Projection: g.k
                      Filter: sum(g.y) > Int64(15000)
                        Aggregate: groupBy=[[g.k]], aggr=[[sum(g.y)]]
                          TableScan: g
                  TableScan: f"""
    )
