"""Exchange reuse (:mod:`distfusion.planner.reuse_exchanges`): a computation planned twice is one stage.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest

from tests.planner.helpers import (
    LARGE,
    SMALL,
    F,
    check_well_formed,
    make_contexts,
    run,
)


@pytest.mark.parametrize("config", [SMALL, LARGE], ids=["broadcast", "shuffle"])
def test_identical_subtrees_are_one_stage(runtimes, config):
    # Spark's ReuseExchange: the same aggregate twice is computed once, read twice.
    sub = "(SELECT k, sum(x) AS s FROM f GROUP BY k)"
    sql = f"SELECT a.k, a.s, b.s AS t FROM {sub} a JOIN {sub} b ON a.k = b.k + 1"
    g = run(make_contexts(runtimes[4], {"f": (F, 500)}, **config), sql)
    check_well_formed(g)
    assert sum(any(c.source.name == "f" for c in s.scans) for s in g.stages) == 1, g.render()
