"""Partition pruning (:mod:`distfusion.planner.prune_partitions`).

A Hive-partitioned Parquet directory (``dt=a/``, ``dt=b/``, ``dt=c/``, two files
each): a read whose filter reads the partition column alone keeps only the
files whose directory passes, as a table of its own; every filter still runs
in the tasks, so results equal single-node DataFusion's over the same files.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext
from distfusion.stages import StageGraph
from tests.compare import assert_same_result
from tests.planner.helpers import check_well_formed

KEYS = {"a": [1, 2], "b": [3, 4], "c": [5, 6]}


@pytest.fixture(scope="module")
def hive_dir(tmp_path_factory):
    """dt=a|b|c/part-0|1.parquet, column k: 10 * key + file number."""
    root = tmp_path_factory.mktemp("hive")
    for dt, keys in KEYS.items():
        (root / f"dt={dt}").mkdir()
        for i in range(2):
            k = pa.array([x * 10 + i for x in keys], pa.int64())
            pq.write_table(pa.table({"k": k}), root / f"dt={dt}" / f"part-{i}.parquet")
    return root


@pytest.fixture
def contexts(runtimes, hive_dir):
    ctx = DistributedContext(runtime=runtimes[2], config=DistributedConfig(tasks_per_stage=2))
    ctx.register_parquet("t", str(hive_dir), table_partition_cols=[("dt", pa.string())])
    oracle = SessionContext()
    oracle.register_parquet("t", str(hive_dir), table_partition_cols=[("dt", pa.string())])
    return ctx, oracle


def scans(graph: StageGraph) -> list[tuple[str, int, str | None]]:
    """(table name before its digest, units, how pruned) of every source scan, by stage."""
    return [
        (
            sc.source.name.split("__pruned_")[0]
            + ("__pruned" if "__pruned_" in sc.source.name else ""),
            len(sc.source.units),
            sc.source.options.get("pruned"),
        )
        for s in graph.stages
        for sc in s.scans
    ]


def planned(contexts, sql: str) -> StageGraph:
    ctx, oracle = contexts
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    graph = df.stage_graph()
    check_well_formed(graph)
    return graph


def test_an_equality_on_the_partition_column_keeps_its_directory(contexts):
    g = planned(contexts, "SELECT k, dt FROM t WHERE dt = 'b' AND k > 0")
    assert scans(g) == [("t__pruned", 2, "partitions pruned")]
    (scan,) = g.stages[0].scans
    assert all("/dt=b/" in u.path for u in scan.source.units)
    assert scan.source.options["table"] == "t" and scan.source.options["all_units"] == 6
    assert "2 of 6 work units as t__pruned_" in g.render()


def test_in_list_on_the_partition_column(contexts):
    g = planned(contexts, "SELECT count(*) AS n FROM t WHERE dt IN ('a', 'c')")
    assert scans(g) == [("t__pruned", 4, "partitions pruned")]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k FROM t WHERE k > 30",  # no partition column
        "SELECT k FROM t WHERE dt = 'b' OR k = 50",  # a conjunct that reads another column too
        "SELECT k FROM t WHERE dt >= 'a'",  # every directory passes
    ],
)
def test_no_pruning_without_a_partition_only_conjunct_that_drops_a_file(contexts, sql):
    assert scans(planned(contexts, sql)) == [("t", 6, None)]


def test_two_reads_with_different_filters_keep_different_files(contexts):
    g = planned(contexts, "SELECT k FROM t WHERE dt = 'a' UNION ALL SELECT k FROM t WHERE dt = 'c'")
    names = [sc.source.name for s in g.stages for sc in s.scans]
    assert len(names) == 2 and len(set(names)) == 2
    assert scans(g) == [("t__pruned", 2, "partitions pruned")] * 2
