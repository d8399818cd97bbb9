"""Storage-partitioned joins (:mod:`distfusion.planner.storage_partitioned_joins`).

Two tables stored in key order, as Parquet files cut at different keys: ``f``
(the larger, 6 files) and ``d`` (4 files whose ranges straddle ``f``'s cuts),
with NULL keys, keys repeated across one side's file boundary and a file of
only NULL keys. Every join type runs on the in-process runtime and is compared
with single-node DataFusion over the same files; the plan must join file range
by file range exactly where the module says it may.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distfusion import DistributedConfig, DistributedContext
from distfusion.planner import storage_partitioned_joins
from distfusion.planner.storage_partitioned_joins import group_units
from distfusion.work_unit_feed.unit import WorkUnit
from tests.compare import assert_same_result

# f: keys 0..59 in 6 files; key 19 in two adjacent files (one cluster); NULLs in one file.
F_FILES = [
    list(range(0, 10)),
    list(range(10, 20)),
    [19, 19, 20, 21, 22, 23, 24, 25, None, None],
    list(range(26, 40)),
    list(range(40, 50)),
    list(range(50, 60)),
]
# d: keys cut elsewhere, so files straddle f's groups; one file of only NULLs; keys past f's.
D_FILES = [
    [1, 3, 5, 7, 9, 11, 13],
    [15, 19, 21, 27, 33],
    [None, None, None],
    [38, 41, 47, 55, 61, 70],
]

JOINS = {
    "inner": "SELECT f.k, f.v, d.w FROM f JOIN d ON f.k = d.k",
    "semi, f kept": "SELECT k, v FROM f WHERE EXISTS (SELECT 1 FROM d WHERE d.k = f.k)",
    "semi, d kept": "SELECT k, w FROM d WHERE k IN (SELECT k FROM f)",
    "anti, f kept": "SELECT k, v FROM f WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.k = f.k)",
    "anti, d kept": "SELECT k, w FROM d WHERE NOT EXISTS (SELECT 1 FROM f WHERE f.k = d.k)",
    "left, f kept": "SELECT f.k, f.v, d.w FROM f LEFT JOIN d ON f.k = d.k",
    "left, d kept": "SELECT d.k, d.w, f.v FROM d LEFT JOIN f ON f.k = d.k",
    "right": "SELECT f.k, f.v, d.w FROM f RIGHT JOIN d ON f.k = d.k",
    "full": "SELECT f.k, f.v, d.w FROM f FULL JOIN d ON f.k = d.k",
    "filtered, aggregated": (
        "SELECT count(*) AS n, sum(f.v) AS v FROM f JOIN d ON f.k = d.k WHERE f.v > 5 AND d.w < 60"
    ),
}
# Where a join may not run file range by file range: a full outer join keeps
# the unmatched rows of both sides, so neither may have its files read twice.
NOT_ALIGNED = {"full"}


def _write(root, name: str, files: list[list], column: str) -> None:
    (root / name).mkdir()
    for i, keys in enumerate(files):
        k = pa.array(keys, pa.int64())
        other = pa.array([float(x) if x is not None else 0.5 for x in keys])
        pq.write_table(pa.table({"k": k, column: other}), root / name / f"part-{i}.parquet")


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("spj")
    _write(root, "f", F_FILES, "v")
    _write(root, "d", D_FILES, "w")
    return root


@pytest.fixture(scope="module")
def oracle(tables):
    ctx = SessionContext()
    for name in ("f", "d"):
        ctx.register_parquet(name, str(tables / name))
    return ctx


def _context(runtime, tables, tasks: int = 2, **settings) -> DistributedContext:
    config = DistributedConfig(tasks_per_stage=tasks, in_place_bytes=0, **settings)
    ctx = DistributedContext(runtime=runtime, config=config)
    for name in ("f", "d"):
        ctx.register_parquet(name, str(tables / name))
    return ctx


@pytest.mark.parametrize("name", list(JOINS))
def test_every_join_type_equals_datafusion_and_aligns_where_it_may(runtimes, tables, oracle, name):
    ctx = _context(runtimes[4], tables)
    df = ctx.sql(JOINS[name])
    explain = df.explain()
    aligned = "files by k range" in explain
    assert aligned == (name not in NOT_ALIGNED), explain
    if aligned:
        # One stage reads both tables: no exchange between them.
        (stage,) = [s for s in df.stage_graph().stages if len(s.scans) == 2]
        assert stage.num_tasks >= 2 and not stage.inputs, explain
    expected = oracle.sql(JOINS[name]).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, ordered=False)


def test_the_larger_side_is_read_once_and_straddling_files_twice(runtimes, tables):
    ctx = _context(runtimes[4], tables)
    graph = ctx.sql(JOINS["inner"]).stage_graph()
    (stage,) = [s for s in graph.stages if len(s.scans) == 2]
    by_table = {s.source.options["table"]: s for s in stage.scans}
    f_units = [u.path for units in by_table["f"].task_units for u in units]
    assert sorted(f_units) == sorted({u.path for u in ctx.sources["f"].units})  # each once
    d_reads = [u.path.rsplit("/", 1)[-1] for units in by_table["d"].task_units for u in units]
    assert "part-2.parquet" not in d_reads  # only NULL keys: matches nothing
    assert len(d_reads) > len(set(d_reads))  # a straddling file is read by two tasks


def test_the_setting_turns_the_rule_off(runtimes, tables, oracle):
    ctx = _context(runtimes[4], tables, storage_partitioned_joins=False)
    df = ctx.sql(JOINS["inner"])
    assert "files by k range" not in df.explain()
    expected = oracle.sql(JOINS["inner"]).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, ordered=False)


def test_straddling_files_adding_over_a_quarter_are_not_aligned(runtimes, tables):
    # In 4 key ranges, every file of d with keys straddles two of f's: d read 1.7 times.
    ctx = _context(runtimes[4], tables, tasks=4)
    assert "range" not in ctx.sql(JOINS["inner"]).explain()


def test_files_whose_ranges_all_overlap_are_not_aligned(runtimes, tmp_path):
    # Keys spread over every file (not stored in key order): one cluster, no groups.
    _write(tmp_path, "f", [list(range(i, 60, 6)) for i in range(6)], "v")
    _write(tmp_path, "d", D_FILES, "w")
    ctx = _context(runtimes[4], tmp_path)
    assert "range" not in ctx.sql(JOINS["inner"]).explain()


def _unit(name: str, size: int = 100, rows: int = 10) -> WorkUnit:
    return WorkUnit(path=name, size_bytes=size, num_rows=rows)


def test_group_units_keeps_overlapping_files_together():
    units = [
        (_unit("a"), (0, 9, 0)),
        (_unit("b"), (9, 19, 0)),  # shares key 9 with a
        (_unit("c"), (20, 29, 0)),
        (_unit("d"), (30, 39, 0)),
        (_unit("n"), (None, None, 10)),  # only NULLs
    ]
    groups = group_units(units, 2)
    assert [[u.path for u in g] for g, _, _ in groups] == [["a", "b", "n"], ["c", "d"]]
    assert [(lo, hi) for _, lo, hi in groups] == [(0, 19), (20, 39)]


def test_group_units_gives_up_without_ranges_or_with_one_cluster():
    assert group_units([(_unit("a"), (0, 9, 0)), (_unit("b"), (None, None, None))], 2) is None
    assert group_units([(_unit("a"), (0, 9, 0)), (_unit("b"), (5, 19, 0))], 2) is None
    assert group_units([(_unit("a"), (0, 9, 0)), (_unit("b"), (10, 19, 0))], 1) is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    f_keys=st.lists(st.integers(0, 40), min_size=8, max_size=40),
    d_keys=st.lists(st.one_of(st.none(), st.integers(0, 40)), min_size=6, max_size=30),
    f_cuts=st.lists(st.integers(1, 39), min_size=1, max_size=5),
    d_cuts=st.lists(st.integers(1, 29), min_size=1, max_size=4),
    name=st.sampled_from(sorted(set(JOINS) - NOT_ALIGNED)),
)
def test_any_cut_of_key_ordered_files_gives_datafusions_answer(
    runtimes, tmp_path_factory, f_keys, d_keys, f_cuts, d_cuts, name
):
    """Files of sorted keys cut anywhere (equal keys may straddle a cut), any join type."""
    root = tmp_path_factory.mktemp("cuts")

    def files(keys: list, cuts: list[int]) -> list[list]:
        ordered = sorted(keys, key=lambda k: (k is None, k if k is not None else 0))
        bounds = sorted({min(c, len(ordered)) for c in cuts} | {0, len(ordered)})
        return [ordered[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    _write(root, "f", files(f_keys, f_cuts), "v")
    _write(root, "d", files(d_keys, d_cuts), "w")
    oracle = SessionContext()
    for table in ("f", "d"):
        oracle.register_parquet(table, str(root / table))
    ctx = _context(runtimes[4], root, tasks=4)
    expected = oracle.sql(JOINS[name]).to_arrow_table()
    with pytest.MonkeyPatch.context() as mp:  # align whatever the straddling files cost
        mp.setattr(storage_partitioned_joins, "MAX_SPANNING_SHARE", float("inf"))
        got = ctx.sql(JOINS[name]).to_arrow_table()
    assert_same_result(got, expected, ordered=False)
