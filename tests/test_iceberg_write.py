"""Writes into Iceberg tables (issue 39): ``DistributedDataFrame.write_iceberg``.

Tables live in pyiceberg SQL catalogs (SQLite) on local disk and on the local
S3 server. Every write is read back through pyiceberg and compared with the
rows written; an append or a full overwrite is exactly one new snapshot. A
task that fails leaves the table at its snapshot with no new file below its
location.
"""

from __future__ import annotations

import datetime
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from datafusion import SessionContext
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
)
from pyiceberg.types import (
    DateType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

import distfusion
from distfusion import DistributedConfig, DistributedContext, TaskError
from distfusion.table_write import TableWriteError
from tests.iceberg_tables import local_catalog, s3_catalog

RUNTIMES = {"local": 3, "flight": 3, "spark": 2}
# Flight workers run only the UDFs they were started with (tests.udf_funcs): the
# failing UDF of these tests is the local and Spark runtimes' (a context's UDFs travel).
UDF_RUNTIMES = ["local", "spark"]
ROWS = 500
COLUMNS = ["id", "p", "d", "ts", "x"]

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "p", StringType(), required=False),
    NestedField(3, "d", DateType(), required=False),
    NestedField(4, "ts", TimestamptzType(), required=False),
    NestedField(5, "x", DoubleType(), required=False),
)
SPECS = {
    "unpartitioned": PartitionSpec(),
    "identity": PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p")),
    "month_day_truncate": PartitionSpec(
        PartitionField(3, 1000, MonthTransform(), "d_month"),
        PartitionField(4, 1001, DayTransform(), "ts_day"),
        PartitionField(1, 1002, TruncateTransform(100), "id_trunc"),
    ),
}


def _source() -> pa.Table:
    ids = list(range(ROWS))
    start = datetime.datetime(2023, 12, 30, 22, 0, tzinfo=datetime.UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([f"k {i % 3}" if i % 11 else None for i in ids]),
            "d": pa.array(
                [datetime.date(2024, 1, 1) + datetime.timedelta(days=i // 7) for i in ids]
            ),
            "ts": pa.array(
                [start + datetime.timedelta(hours=i) for i in ids], pa.timestamp("us", "UTC")
            ),
            "x": pa.array([i * 0.25 if i % 7 else None for i in ids]),
        }
    )


def _fail_at(values: pa.Array) -> pa.Array:
    if pc.any(pc.equal(values, ROWS - 1)).as_py():
        raise RuntimeError("boom in one task")
    return values


FAIL = distfusion.udf(_fail_at, [pa.int64()], pa.int64(), "immutable", name="fail_at_last")


def _context(runtime) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=3))
    ctx.register_table("src", _source(), max_rows_per_unit=100)
    ctx.register_udf(FAIL)
    return ctx


@pytest.fixture(params=list(RUNTIMES))
def ctx(request, runtime_for) -> DistributedContext:
    return _context(runtime_for(request.param, RUNTIMES[request.param]))


@pytest.fixture(params=UDF_RUNTIMES)
def udf_ctx(request, runtime_for) -> DistributedContext:
    return _context(runtime_for(request.param, RUNTIMES[request.param]))


@pytest.fixture
def local_ctx():
    from distfusion import LocalRuntime

    ctx = _context(LocalRuntime(workers=3))
    yield ctx
    ctx.close()


@pytest.fixture
def catalog(tmp_path):
    c = local_catalog("w", tmp_path)
    c.create_namespace("db")
    return c


def _expected(where: str = "true") -> list[dict]:
    c = SessionContext()
    c.from_arrow(_source(), "src")
    return c.sql(f"SELECT {', '.join(COLUMNS)} FROM src WHERE {where} ORDER BY id").to_pylist()


def _read(table) -> list[dict]:
    table.refresh()
    return table.scan().to_arrow().select(COLUMNS).sort_by("id").to_pylist()


def _files(root: str) -> list[str]:
    root = root.removeprefix("file://")
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return sorted(f for f in out if "/metadata/" not in "/" + f)


def _select(where: str = "true") -> str:
    return f"SELECT {', '.join(COLUMNS)} FROM src WHERE {where}"


@pytest.mark.parametrize("layout", list(SPECS))
def test_append_then_overwrite_each_one_snapshot(ctx, catalog, layout):
    t = catalog.create_table(f"db.t_{layout}", schema=SCHEMA, partition_spec=SPECS[layout])
    c1 = ctx.sql(_select("id < 200")).write_iceberg(t)
    assert c1.rows == 200 and len(t.snapshots()) == 1
    assert _read(t) == _expected("id < 200")
    c2 = ctx.sql(_select("id >= 200")).write_iceberg(t)
    assert len(t.snapshots()) == 2 and t.current_snapshot().snapshot_id == c2.version
    assert _read(t) == _expected()
    summary = t.current_snapshot().summary
    assert summary["added-records"] == str(ROWS - 200)
    assert summary["added-data-files"] == str(len(c2.files_added))
    c3 = ctx.sql(_select("id % 2 = 0")).write_iceberg(t, mode="overwrite")
    assert len(t.snapshots()) == 3
    assert t.current_snapshot().summary.operation.value == "overwrite"
    assert len(c3.files_removed) == len(c1.files_added) + len(c2.files_added)
    assert _read(t) == _expected("id % 2 = 0")
    # every file's partition record matches its rows: a filtered scan prunes and still agrees
    if layout != "unpartitioned":
        ice, sql = PRUNING[layout]
        t.refresh()
        got = t.scan(row_filter=ice).to_arrow().select(COLUMNS).sort_by("id")
        assert got.to_pylist() == _expected(f"id % 2 = 0 AND {sql}")
        assert 0 < len(t.scan(row_filter=ice).plan_files()) < len(t.scan().plan_files())


PRUNING = {
    "identity": ("p = 'k 1'", "p = 'k 1'"),
    "month_day_truncate": ("d >= '2024-02-01'", "d >= DATE '2024-02-01'"),
}


def test_data_files_carry_field_ids_and_metrics(local_ctx, catalog):
    import pyarrow.parquet as pq

    t = catalog.create_table("db.m", schema=SCHEMA, partition_spec=SPECS["identity"])
    local_ctx.sql(_select()).write_iceberg(t)
    tasks = t.scan().plan_files()
    assert sum(f.file.record_count for f in tasks) == ROWS
    for task in tasks:
        f = task.file
        assert f.file_path.startswith(t.location() + "/data/p=")
        assert set(f.value_counts) == {1, 2, 3, 4, 5} and f.null_value_counts[5] >= 0
        assert f.lower_bounds and f.upper_bounds and f.column_sizes
        schema = pq.read_schema(f.file_path.removeprefix("file://"))
        assert [fl.metadata[b"PARQUET:field_id"] for fl in schema] == [b"1", b"2", b"3", b"4", b"5"]
    assert {t.file.partition[0] for t in tasks} == {"k 0", "k 1", "k 2", None}


def test_overwrite_filter_replaces_the_rows_it_selects(local_ctx, catalog):
    t = catalog.create_table("db.f", schema=SCHEMA, partition_spec=SPECS["identity"])
    local_ctx.sql(_select()).write_iceberg(t)
    local_ctx.sql(
        "SELECT id + 1000 AS id, p, d, ts, x FROM src WHERE p = 'k 1' AND id < 50"
    ).write_iceberg(t, mode="overwrite", overwrite_filter="p = 'k 1'")
    expected = [r for r in _expected() if r["p"] != "k 1"] + [
        {**r, "id": r["id"] + 1000} for r in _expected("p = 'k 1' AND id < 50")
    ]
    assert _read(t) == sorted(expected, key=lambda r: r["id"])
    # pyiceberg's own overwrite semantics: a delete and an append, in one commit
    assert [s.summary.operation.value for s in t.snapshots()] == ["append", "delete", "append"]


def test_a_result_that_does_not_fit_is_refused_before_any_task(local_ctx, catalog):
    t = catalog.create_table("db.s", schema=SCHEMA)
    local_ctx.sql(_select("id < 5")).write_iceberg(t)
    before = _files(t.location())
    with pytest.raises(
        ValueError, match=r"\['y'\] of the result are not in the Iceberg table db.s"
    ):
        local_ctx.sql("SELECT id, p, d, ts, x, 1 AS y FROM src").write_iceberg(t)
    with pytest.raises(ValueError, match=r"column\(s\) \['id'\] have other types"):
        local_ctx.sql("SELECT CAST(id AS VARCHAR) AS id, p, d, ts, x FROM src").write_iceberg(t)
    with pytest.raises(ValueError, match="overwrite_filter needs"):
        local_ctx.sql(_select()).write_iceberg(t, overwrite_filter="id > 3")
    bucketed = catalog.create_table(
        "db.b",
        schema=SCHEMA,
        partition_spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "b")),
    )
    with pytest.raises(ValueError, match="not this one yet"):
        local_ctx.sql(_select()).write_iceberg(bucketed)
    assert _files(t.location()) == before and len(t.snapshots()) == 1
    # A missing optional column is written as NULL; narrower integers are widened.
    local_ctx.sql("SELECT CAST(id AS INT) AS id, p FROM src WHERE id = 7").write_iceberg(t)
    assert _read(t)[-1] == {"id": 7, "p": "k 1", "d": None, "ts": None, "x": None}


def test_a_failing_task_leaves_the_table_and_its_location_untouched(udf_ctx, catalog):
    ctx = udf_ctx
    t = catalog.create_table("db.fail", schema=SCHEMA, partition_spec=SPECS["month_day_truncate"])
    ctx.sql(_select("id < 100")).write_iceberg(t)
    before, snapshot = _files(t.location()), t.current_snapshot().snapshot_id
    for mode in ("append", "overwrite"):
        with pytest.raises(TaskError, match="boom in one task"):
            ctx.sql("SELECT fail_at_last(id) AS id, p, d, ts, x FROM src").write_iceberg(
                t, mode=mode
            )
        assert _files(t.location()) == before
        t.refresh()
        assert t.current_snapshot().snapshot_id == snapshot and len(t.snapshots()) == 1
    assert _read(t) == _expected("id < 100")


def test_a_blind_append_racing_another_commit_lands_and_an_overwrite_conflicts(local_ctx, catalog):
    t = catalog.create_table("db.race", schema=SCHEMA)
    local_ctx.sql(_select("id < 10")).write_iceberg(t)
    stale = catalog.load_table("db.race")
    local_ctx.sql(_select("id >= 10 AND id < 20")).write_iceberg(t)  # the other writer wins
    local_ctx.sql(_select("id >= 20 AND id < 30")).write_iceberg(stale)  # retried on the new one
    assert _read(t) == _expected("id < 30") and len(t.snapshots()) == 3
    stale = catalog.load_table("db.race")
    local_ctx.sql(_select("id >= 30 AND id < 40")).write_iceberg(t)
    before = _files(t.location())
    with pytest.raises(TableWriteError, match="db.race"):
        local_ctx.sql(_select("id < 5")).write_iceberg(stale, mode="overwrite")
    assert _files(t.location()) == before
    assert _read(t) == _expected("id < 40")


def test_write_to_s3(local_ctx, s3_server, s3_store, tmp_path):
    from distfusion.io import object_store

    s3_server.create_bucket("iceberg-w")
    object_store.register("s3://", s3_store("iceberg-w"), "iceberg-w")
    try:
        catalog = s3_catalog("w3", tmp_path / "c.db", s3_server.endpoint, bucket="iceberg-w")
        catalog.create_namespace("db")
        t = catalog.create_table("db.t", schema=SCHEMA, partition_spec=SPECS["identity"])
        local_ctx.sql(_select()).write_iceberg(t)
        assert _read(t) == _expected()
        local_ctx.sql(_select("id < 50")).write_iceberg(t, mode="overwrite")
        assert _read(t) == _expected("id < 50") and len(t.snapshots()) == 2
        before = s3_server.keys("iceberg-w", "w3/")
        with pytest.raises(TaskError, match="boom in one task"):
            local_ctx.sql("SELECT fail_at_last(id) AS id, p, d, ts, x FROM src").write_iceberg(t)
        assert s3_server.keys("iceberg-w", "w3/") == before
        assert not [k for k in before if "_temporary" in k]
        # distfusion's own reader agrees
        local_ctx.register_iceberg("back", t)
        assert local_ctx.sql("SELECT count(*) AS n FROM back").to_pylist() == [{"n": 50}]
    finally:
        object_store.deregister("s3://", "iceberg-w")


def test_sql_insert_into_and_overwrite_a_registered_table(ctx, catalog):
    t = catalog.create_table("db.sql", schema=SCHEMA, partition_spec=SPECS["identity"])
    ctx.register_iceberg("t", t)
    got = ctx.sql("INSERT INTO t SELECT CAST(id AS INT), p, d, ts, x FROM src WHERE id < 100")
    assert got.to_pylist() == [{"count": 100}] and len(t.snapshots()) == 1
    assert _read(t) == _expected("id < 100")
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 100}]
    ctx.sql("INSERT OVERWRITE t SELECT id, p, d, ts, x FROM src WHERE id >= 490")
    assert _read(t) == _expected("id >= 490")
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 10}]
    ctx.sql("INSERT INTO t (id) VALUES (7000)")
    assert _read(t)[-1] == {"id": 7000, "p": None, "d": None, "ts": None, "x": None}
    assert len(t.snapshots()) == 3
