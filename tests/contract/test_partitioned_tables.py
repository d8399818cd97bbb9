"""Directory-partitioned Parquet tables (Hive style) give single-node DataFusion's answers.

The table is written as Spark's ``partitionBy`` writes it
(``root/dt=.../region=.../part-0.parquet``) and registered on both sides with
the same ``table_partition_cols``; a filter on partition columns leaves only
the matching directories' files in the leaf stages (planning-time pruning).
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from tests.compare import assert_same_result, is_ordered

COLS = [("dt", pa.date32()), ("region", pa.string())]
DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
REGIONS = ["EU", "US", "ASIA%2FPAC"]  # Spark escapes "/" in a value as %2F


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("partitioned") / "events"
    for d, day in enumerate(DAYS):
        for r, region in enumerate(REGIONS):
            part = root / f"dt={day}" / f"region={region}"
            part.mkdir(parents=True)
            n = 40 + 7 * d + r
            pq.write_table(
                pa.table(
                    {
                        "id": pa.array(range(n), pa.int64()),
                        "amount": pa.array([(i * 13 + d) % 50 for i in range(n)], pa.int64()),
                        "tag": [None if i % 9 == 0 else f"t{i % 4}" for i in range(n)],
                    }
                ),
                part / "part-0.parquet",
            )
    return root


@pytest.fixture
def contexts(runtime, workers, table_dir):
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_parquet("events", table_dir, table_partition_cols=COLS)
    oracle = SessionContext()
    oracle.register_parquet("events", str(table_dir), table_partition_cols=COLS)
    return ctx, oracle


QUERIES = {
    "no-filter": "SELECT dt, region, count(*) AS n, sum(amount) AS s FROM events GROUP BY dt, region",
    "day-range": (
        "SELECT region, count(*) AS n, sum(amount) AS s FROM events "
        "WHERE dt >= DATE '2024-01-02' GROUP BY region ORDER BY region"
    ),
    "partition-and-data-filter": (
        "SELECT dt, tag, count(*) AS n FROM events WHERE region = 'EU' AND amount > 10 "
        "GROUP BY dt, tag ORDER BY dt, tag NULLS FIRST"
    ),
    "escaped-value": "SELECT count(*) AS n FROM events WHERE region = 'ASIA/PAC'",
    "or-across-columns": (
        "SELECT count(*) AS n FROM events WHERE dt = DATE '2024-01-01' OR region = 'US'"
    ),
    "nothing-matches": "SELECT count(*) AS n, sum(amount) AS s FROM events WHERE region = 'XX'",
    "self-join-different-partitions": (
        "SELECT a.dt, count(*) AS n FROM events a JOIN events b ON a.id = b.id AND a.dt = b.dt "
        "WHERE a.region = 'EU' AND b.region = 'US' AND a.dt < DATE '2024-01-03' "
        "GROUP BY a.dt ORDER BY a.dt"
    ),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_partitioned_table_gives_datafusions_answer(contexts, name):
    ctx, oracle = contexts
    sql = QUERIES[name]
    assert_same_result(
        ctx.sql(sql).to_arrow_table(), oracle.sql(sql).to_arrow_table(), is_ordered(sql)
    )


def _scans(df) -> dict[str, list[int]]:
    """Work units read per scanned table name (a pruned read under its own name)."""
    return {
        s.source.name: [len(u) for u in s.task_units]
        for stage in df.stage_graph().stages
        for s in stage.scans
    }


def test_partition_filters_read_only_the_matching_directories(contexts):
    ctx, _ = contexts
    df = ctx.sql("SELECT count(*) FROM events WHERE dt = DATE '2024-01-02' AND region <> 'US'")
    ((name, per_task),) = _scans(df).items()
    assert name.startswith("events__pruned_") and sum(per_task) == 2  # 2 of 9 files
    paths = {
        u.path for stage in df.stage_graph().stages for s in stage.scans for u in s.source.units
    }
    assert all("dt=2024-01-02" in p and "region=US" not in p for p in paths)
    assert "2 of 9 work units" in df.explain()
    # Reading the two sides of a self join keeps different files for each.
    df = ctx.sql(QUERIES["self-join-different-partitions"])
    assert sorted(sum(v) for v in _scans(df).values()) == [2, 2]
    # A filter on data columns only prunes nothing.
    df = ctx.sql("SELECT count(*) FROM events WHERE amount > 10")
    assert _scans(df) == {"events": _scans(df)["events"]} and sum(_scans(df)["events"]) == 9


def test_a_file_outside_the_partition_directories_is_a_clear_error(runtime, table_dir, tmp_path):
    (tmp_path / "dt=2024-01-01").mkdir()
    pq.write_table(pa.table({"id": [1]}), tmp_path / "dt=2024-01-01" / "a.parquet")
    pq.write_table(pa.table({"id": [2]}), tmp_path / "stray.parquet")
    ctx = DistributedContext(runtime=runtime)
    with pytest.raises(PlanningError, match="stray.parquet is not below a dt=<value> directory"):
        ctx.register_parquet("t", tmp_path, table_partition_cols=[("dt", pa.date32())])
    assert "t" not in ctx.table_names()


def test_partition_values_are_typed_and_unescaped(contexts):
    ctx, oracle = contexts
    sql = "SELECT DISTINCT dt, region FROM events WHERE region = 'ASIA/PAC' ORDER BY dt"
    got = ctx.sql(sql).to_arrow_table()
    assert got.to_pylist() == [
        {"dt": datetime.date(2024, 1, d), "region": "ASIA/PAC"} for d in (1, 2, 3)
    ]
    expected = oracle.sql(sql).to_arrow_table().schema
    assert [f.type for f in got.schema] == [f.type for f in expected]


def test_create_external_table_partitioned_by_is_a_partitioned_source(runtime, workers, table_dir):
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    oracle = SessionContext()
    ddl = (
        "CREATE EXTERNAL TABLE ev (id BIGINT, amount BIGINT, tag VARCHAR, dt DATE, region VARCHAR) "
        f"STORED AS PARQUET PARTITIONED BY (dt, region) LOCATION '{table_dir}/'"
    )
    sql = "SELECT region, sum(amount) AS s FROM ev WHERE dt = DATE '2024-01-03' GROUP BY region"
    df = ctx.sql(f"{ddl}; {sql}")
    oracle.sql(ddl)
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), is_ordered(sql))
    assert ctx.sources["ev"].options["partition_cols"] == ["dt", "region"]
    assert "3 of 9 work units" in df.explain()  # one day's three regions
