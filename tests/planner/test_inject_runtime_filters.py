"""Semi-join reduction (:mod:`distfusion.planner.inject_runtime_filters`): a selective side filters the other before its exchange.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from distfusion.planner.estimate import key_share
from distfusion.stages import BROADCAST, StageGraph
from tests.planner.helpers import (
    LARGE,
    D,
    F,
    check_well_formed,
    fact_and_dimension,
    make_contexts,
    run,
)


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


# d with four wide text columns: its key (k, 8 bytes) is a small share of a row.
WIDE_D = pa.table(
    {
        "k": pa.array(range(200), pa.int64()),
        "c": [f"c{i % 10}" for i in range(200)],
        **{f"s{j}": [f"long text {i} {j}" * 3 for i in range(200)] for j in range(4)},
    }
)


def test_the_filters_size_is_its_keys_not_the_whole_side(runtimes):
    """The threshold bounds the keys the filter holds (issue 27: TPC-H Q4 at SF10).

    The filtered side's rows are ~11 times its keys' bytes: at 1,000 bytes its
    rows exceed ``runtime_filter_bytes`` (no filter before) while its keys do not.
    """
    sql = (
        "SELECT d.c, d.s0, d.s1, d.s2, d.s3, sum(f.x) AS sx FROM f JOIN d ON f.k = d.k "
        "WHERE d.c = 'c3' GROUP BY 1, 2, 3, 4, 5"
    )
    tables = {"f": (F, 500), "d": (WIDE_D, 50)}
    keys_fit = make_contexts(
        runtimes[4], tables, runtime_filter_bytes=1000, adaptive=False, **LARGE
    )
    g = run(keys_fit, sql)
    check_well_formed(g)
    assert len(runtime_filters(g)) == 1, g.render()
    too_small = make_contexts(
        runtimes[4], tables, runtime_filter_bytes=200, adaptive=False, **LARGE
    )
    assert runtime_filters(run(too_small, sql)) == []


def test_key_share_counts_fixed_widths_and_guesses_variable_ones():
    assert key_share([pa.int64()], [pa.int64(), pa.int32(), pa.string()]) == 8 / 28
    assert key_share([pa.int32(), pa.date32()], [pa.int32(), pa.date32()]) == 1.0
    assert key_share([pa.bool_()], [pa.bool_(), pa.int64()]) == 1 / 9
    assert key_share([], []) == 1.0


def test_keys_over_the_bound_still_filter_while_broadcasting_their_side_pays(runtimes):
    """A selective side's keys outgrow ``runtime_filter_bytes`` at scale.

    TPC-H Q4 at SF30 has 13 MiB of order keys; without the filter lineitem is
    shuffled whole, 3x slower. Over the bound, the filter applies while copying the side to the other side's
    tasks pays (``PlannerConfig.broadcast_pays``), never for a side over ten times it.
    """
    sql = (
        "SELECT d.k, d.c FROM d WHERE d.c = 'c3' "
        "AND EXISTS (SELECT 1 FROM f WHERE f.k = d.k AND f.x > 100)"
    )

    def filters(runtime_filter_bytes: int, max_broadcast_bytes: int) -> list:
        contexts = make_contexts(
            runtimes[4],
            {"f": (F, 500), "d": (D, 50)},
            runtime_filter_bytes=runtime_filter_bytes,
            adaptive=False,
            broadcast_threshold_bytes=0,
            max_broadcast_bytes=max_broadcast_bytes,
        )
        g = run(contexts, sql)
        check_well_formed(g)
        return runtime_filters(g)

    assert filters(40, 0) == []  # keys over the bound, and broadcasting never pays
    assert len(filters(40, 100_000)) == 1
    assert filters(20, 100_000) == []  # the side is over ten times the bound
