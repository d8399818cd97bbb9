"""Filtered dimensions joined first (:mod:`distfusion.planner.push_dimension_joins`).

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import textwrap

import pytest

from distfusion.planner.push_dimension_joins import push_dimension_joins
from distfusion.stages import StageGraph
from tests.planner.helpers import (
    LARGE,
    SMALL,
    D,
    F,
    G,
    apply_reduction,
    check_well_formed,
    make_contexts,
    run,
)


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


def test_the_pass_joins_the_filtered_dimension_first(runtimes):
    contexts = make_contexts(runtimes[4], {"f": (F, 500), "d": (D, 50), "g": (G, 500)}, **SMALL)
    sql = (
        "SELECT d.c, count(*) AS n FROM f JOIN g ON f.x = g.y JOIN d ON f.k = d.k "
        "WHERE d.c = 'c3' GROUP BY d.c"
    )
    before, after = apply_reduction(contexts, sql, push_dimension_joins)
    assert before == textwrap.dedent(
        """\
        Projection: d.c, count(Int64(1)) AS n
          Aggregate: groupBy=[[d.c]], aggr=[[count(Int64(1))]]
            Projection: d.c
              Inner Join: f.k = d.k
                Projection: f.k
                  Inner Join: f.x = g.y
                    TableScan: f
                    TableScan: g projection=[y]
                Filter: d.c = Utf8("c3")
                  TableScan: d"""
    )
    assert after == textwrap.dedent(
        """\
        Projection: d.c, count(Int64(1)) AS n
          Aggregate: groupBy=[[d.c]], aggr=[[count(Int64(1))]]
            Projection: d.c
              Projection: f.k, d.k, d.c
                Projection: f.k, f.x, g.y, d.k, d.c
                  Inner Join: f.x = g.y
                    Inner Join: f.k = d.k
                      TableScan: f
                      Filter: d.c = Utf8("c3")
                        TableScan: d
                    TableScan: g projection=[y]"""
    )
