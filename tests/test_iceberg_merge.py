"""MERGE INTO an Iceberg table (issue 39): copy-on-write, one snapshot.

Tables live in pyiceberg SQL catalogs (SQLite) on local disk, written as
real Parquet by pyiceberg. Every merge is compared with an oracle on the same
rows: pyiceberg's own ``Table.upsert`` (matched -> update every column, not
matched -> insert) on a twin table, and for the other clause forms
(``DELETE``, conditions, ``INSERT`` with a column list, ``UPDATE SET`` of
some columns) single-node DataFusion over the rows before the merge, with a
formulation of its own (joins and a union, not the merge's CASE). A merge is
one new snapshot; the data files no source key can match keep their paths;
a merge that fails (a target row matched twice, a failing task, a concurrent
commit) leaves the table at its snapshot and no new file behind.
"""

from __future__ import annotations

import datetime
import os
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

import distfusion
from distfusion import DistributedConfig, DistributedContext, LocalRuntime, TaskError
from distfusion.table_write import TableWriteError
from tests.iceberg_tables import commit_position_deletes, local_catalog

COLUMNS = ["id", "p", "x"]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "p", StringType(), required=False),
    NestedField(3, "x", DoubleType(), required=False),
)
SPECS = {
    "unpartitioned": PartitionSpec(),
    "identity": PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p")),
    "truncate": PartitionSpec(PartitionField(1, 1000, TruncateTransform(20), "id_trunc")),
}
# pyiceberg computes truncate (and bucket) partitions with pyiceberg-core, not installed
# here: those tables are written by distfusion, and compared with the DataFusion oracle
PYICEBERG_WRITES = ["unpartitioned", "identity"]
ARROW = pa.schema([("id", pa.int64()), ("p", pa.string()), ("x", pa.float64())])
APPENDS = 6  # one append (a data file per partition) per block of 10 ids: 0..9, 10..19, ...

# the source of the merges: matched ids (2, 3, 4, 5, 31), new ones (700, 701, 702)
CHANGES = pa.table(
    {
        "id": pa.array([2, 3, 4, 5, 31, 700, 701, 702], pa.int64()),
        "p": ["k 2", "k 0", "k 1", None, "k 2", "k 1", "k 2", "k 0"],
        "x": pa.array([200.0, 300.0, None, 500.0, 310.0, 7000.0, 7010.0, 7020.0]),
        "op": ["u", "d", "u", "d", None, "i", "skip", "i"],
    }
)


def _rows(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": ids,
            "p": [f"k {i % 3}" if i % 7 else None for i in ids],
            "x": [i * 0.5 if i % 5 else None for i in ids],
        },
        ARROW,
    )


@pytest.fixture
def catalog(tmp_path):
    c = local_catalog("m", tmp_path)
    c.create_namespace("db")
    return c


@pytest.fixture
def ctx():
    ctx = DistributedContext(
        runtime=LocalRuntime(workers=2), config=DistributedConfig(tasks_per_stage=2)
    )
    ctx.register_table("changes", CHANGES)
    yield ctx
    ctx.close()


@pytest.fixture(params=["local", "flight"])
def any_ctx(request, runtime_for):
    # Flight workers are other processes: they rebuild the merge's target table (its class)

    ctx = DistributedContext(
        runtime=runtime_for(request.param, 2), config=DistributedConfig(tasks_per_stage=2)
    )
    ctx.register_table("changes", CHANGES)
    return ctx


def _table(catalog, name: str, layout: str = "unpartitioned", ctx=None):
    """Six appends of ten rows (ids 0..59); by pyiceberg, or by ``ctx``'s ``write_iceberg``."""
    t = catalog.create_table(f"db.{name}", schema=SCHEMA, partition_spec=SPECS[layout])
    for k in range(APPENDS):
        if ctx is None:
            t.append(_rows(10 * k, 10))
        else:
            ctx.register_table(f"block{k}", _rows(10 * k, 10))
            ctx.sql(f"SELECT * FROM block{k}").write_iceberg(t)
    return t


def _read(table) -> list[dict]:
    table.refresh()
    return table.scan().to_arrow().select(COLUMNS).sort_by("id").to_pylist()


def _data_files(table) -> set[str]:
    table.refresh()
    return {t.file.file_path for t in table.scan().plan_files()}


def _files_on_disk(table) -> list[str]:
    root = table.location().removeprefix("file://")
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def _oracle(before: list[dict], source: pa.Table, sql: str) -> list[dict]:
    """``sql`` over ``t`` (the rows before) and ``s`` (the source), single-node DataFusion."""
    c = SessionContext()
    c.from_arrow(pa.Table.from_pylist(before, ARROW), "t")
    c.from_arrow(source, "s")
    return c.sql(f"SELECT * FROM ({sql}) AS o ORDER BY id").to_pylist()


@pytest.mark.parametrize("layout", PYICEBERG_WRITES)
def test_merge_set_star_insert_star_equals_pyicebergs_upsert(any_ctx, catalog, layout):
    ctx = any_ctx
    ours, theirs = _table(catalog, "ours", layout), _table(catalog, "theirs", layout)
    source = CHANGES.select(COLUMNS)
    theirs.upsert(source, join_cols=["id"])
    ctx.register_iceberg("t", ours)
    snapshots = len(ours.snapshots())
    got = ctx.sql(
        """MERGE INTO t USING (SELECT id, p, x FROM changes) AS s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    expected = _read(theirs)
    assert _read(ours) == expected
    assert got == [{"count": len(expected)}]
    assert len(ours.snapshots()) == snapshots + 1
    assert ours.current_snapshot().summary.operation.value == "overwrite"
    # the table is registered again at its new snapshot
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": len(expected)}]


CLAUSES = """
    WHEN MATCHED AND s.op = 'd' THEN DELETE
    WHEN MATCHED THEN UPDATE SET x = s.x + 1, p = s.p
    WHEN NOT MATCHED AND s.op = 'i' THEN INSERT (id, x) VALUES (s.id, s.x * 2)"""
ORACLE = """
    SELECT t.id, s.p, s.x + 1 AS x FROM t JOIN s ON t.id = s.id WHERE (s.op = 'd') IS NOT TRUE
    UNION ALL SELECT t.* FROM t LEFT ANTI JOIN s ON t.id = s.id
    UNION ALL SELECT s.id, CAST(NULL AS VARCHAR) AS p, s.x * 2 AS x
      FROM s LEFT ANTI JOIN t ON t.id = s.id WHERE s.op = 'i'"""


@pytest.mark.parametrize("layout", ["unpartitioned", "identity"])
@pytest.mark.parametrize("named", ["registered", "catalog", "catalog_no_alias"])
def test_merge_clauses_equal_a_datafusion_oracle(ctx, catalog, layout, named):
    t = _table(catalog, "t", layout)
    before = _read(t)
    expected = _oracle(before, CHANGES, ORACLE)
    snapshots = len(t.snapshots())
    if named == "registered":
        ctx.register_iceberg("t", t)
        head = "MERGE INTO t AS tgt USING changes AS s ON tgt.id = s.id"
    elif named == "catalog":
        ctx.register_catalog("lake", catalog)
        head = "MERGE INTO lake.db.t AS tgt USING changes AS s ON tgt.id = s.id"
    else:
        ctx.register_catalog("lake", catalog)
        head = "MERGE INTO lake.db.t USING changes AS s ON lake.db.t.id = s.id"
    got = ctx.sql(head + CLAUSES).to_pylist()
    assert _read(t) == expected
    assert got == [{"count": len(expected)}]
    assert len(t.snapshots()) == snapshots + 1
    name = "t" if named == "registered" else "lake.db.t"
    assert ctx.sql(f"SELECT count(*) AS n FROM {name}").to_pylist() == [{"n": len(expected)}]


UPSERT = "SELECT * FROM s UNION ALL SELECT t.* FROM t LEFT ANTI JOIN s ON t.id = s.id"


@pytest.mark.parametrize("layout", list(SPECS))
def test_merge_rewrites_only_the_files_the_source_keys_can_match(ctx, catalog, layout):
    # ids 0..59 in six appends of ten (a file per append and partition); the source's ids
    # 21..25 can only be in the third append's files: the others keep their paths
    t = _table(catalog, "t", layout, None if layout in PYICEBERG_WRITES else ctx)
    source = pa.table(
        {"id": pa.array([21, 23, 25], pa.int64()), "p": ["k 0", None, "k 1"], "x": [-1, -2, -3]},
        ARROW,
    )
    expected = _oracle(_read(t), source, UPSERT)
    before = _data_files(t)
    third = {f for f in before if 20 <= _min_id(f) <= 29}
    assert 1 <= len(third) < len(before)
    ctx.register_table("upd", source)
    ctx.register_iceberg("t", t)
    got = ctx.sql(
        """MERGE INTO t USING upd AS s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    assert _read(t) == expected
    assert got == [{"count": APPENDS * 10}]
    after = _data_files(t)
    assert before - after == third  # replaced; every other file is still there
    assert int(t.current_snapshot().summary["deleted-data-files"]) == len(third)
    assert len(t.snapshots()) == APPENDS + 1


def _min_id(path: str) -> int:
    return pc.min(pq.read_table(path.removeprefix("file://"), columns=["id"])["id"]).as_py()


def test_merge_with_keys_no_file_holds_only_appends_and_keeps_every_file(ctx, catalog):
    t = _table(catalog, "t")
    before_files, before = _data_files(t), _read(t)
    ctx.register_iceberg("t", t)
    got = ctx.sql(
        """MERGE INTO t USING (SELECT * FROM changes WHERE id >= 700) AS s ON t.id = s.id
        WHEN MATCHED THEN DELETE
        WHEN NOT MATCHED THEN INSERT (id, p, x) VALUES (s.id, s.p, s.x)"""
    ).to_pylist()
    new = CHANGES.filter(pc.greater_equal(CHANGES["id"], 700)).select(COLUMNS).to_pylist()
    assert _read(t) == before + new
    assert got == [{"count": len(before) + 3}]
    assert before_files <= _data_files(t)


def test_merge_into_a_table_without_a_snapshot_inserts(ctx, catalog):
    t = catalog.create_table("db.empty", schema=SCHEMA, partition_spec=SPECS["identity"])
    ctx.register_iceberg("t", t)
    got = ctx.sql(
        """MERGE INTO t USING changes AS s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET x = 0 WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    assert got == [{"count": CHANGES.num_rows}]
    assert _read(t) == CHANGES.select(COLUMNS).sort_by("id").to_pylist()
    assert len(t.snapshots()) == 1


def test_a_file_with_position_deletes_is_rewritten_without_its_deleted_rows(ctx, catalog):
    t = catalog.create_table("db.t", schema=SCHEMA)
    t.append(_rows(0, 10))
    t.append(_rows(10, 10))
    first = next(f.file.file_path for f in t.scan(row_filter="id < 10").plan_files())
    commit_position_deletes(t, first, [0, 9], Record())
    before = _read(t)
    assert [r["id"] for r in before][:2] == [1, 2] and len(before) == 18
    ctx.register_iceberg("t", t)
    source = pa.table({"id": pa.array([15], pa.int64()), "p": ["z"], "x": [1.5]}, ARROW)
    ctx.register_table("one", source)
    got = ctx.sql(
        "MERGE INTO t USING one AS s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"
    ).to_pylist()
    expected = [r if r["id"] != 15 else source.to_pylist()[0] for r in before]
    assert _read(t) == expected and got == [{"count": 18}]
    assert first not in _data_files(t)  # rewritten (deletes applied), not left to its deletes


def test_a_target_row_matched_twice_leaves_the_table_unchanged(ctx, catalog):
    t = _table(catalog, "t", "identity")
    before, files, snapshot = _read(t), _files_on_disk(t), t.current_snapshot().snapshot_id
    ctx.register_iceberg("t", t)
    ctx.register_table("twice", pa.table({"id": pa.array([41, 41], pa.int64())}))
    with pytest.raises(distfusion.PlanningError, match="matched by more than one source row"):
        ctx.sql("MERGE INTO t USING twice ON t.id = twice.id WHEN MATCHED THEN DELETE")
    assert _files_on_disk(t) == files and _read(t) == before
    assert t.current_snapshot().snapshot_id == snapshot
    # the whole table is registered again, not the files the merge read
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": len(before)}]
    with pytest.raises(
        distfusion.PlanningError, match="NOT MATCHED BY SOURCE cannot UPDATE SET \\*"
    ):
        ctx.sql(
            "MERGE INTO t USING twice ON t.id = twice.id WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *"
        )


def _boom(values: pa.Array) -> pa.Array:
    if pc.any(pc.equal(values, 500.0)).as_py():
        raise RuntimeError("boom in one task")
    return values


BOOM = distfusion.udf(_boom, [pa.float64()], pa.float64(), "immutable", name="boom_at_500")


def test_a_failing_task_writes_nothing(ctx, catalog):
    t = _table(catalog, "t")
    before, files, snapshot = _read(t), _files_on_disk(t), t.current_snapshot().snapshot_id
    ctx.register_udf(BOOM)
    ctx.register_iceberg("t", t)
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql(
            """MERGE INTO t USING changes AS s ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET x = boom_at_500(s.x) WHEN NOT MATCHED THEN INSERT *"""
        )
    assert _files_on_disk(t) == files and _read(t) == before
    assert t.current_snapshot().snapshot_id == snapshot


def test_a_commit_landing_during_the_merge_makes_it_fail(ctx, catalog):
    t = _table(catalog, "t")
    other = catalog.load_table("db.t")
    once = threading.Lock()

    def _append_once(values: pa.Array) -> pa.Array:
        if once.acquire(blocking=False):  # another writer commits while the merge runs
            other.append(_rows(1000, 3))
        return values

    ctx.register_udf(
        distfusion.udf(_append_once, [pa.float64()], pa.float64(), "volatile", name="race")
    )
    ctx.register_iceberg("t", t)
    # pyiceberg retries on the new head, and its validation (serializable isolation) refuses
    with pytest.raises(TableWriteError, match="db.t failed.*Added data files"):
        ctx.sql(
            """MERGE INTO t USING changes AS s ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET x = race(s.x) WHEN NOT MATCHED THEN INSERT *"""
        )
    # the other writer's rows are there, the merge's are not, and it left no file
    assert _read(t) == sorted(
        _rows(0, 10 * APPENDS).to_pylist() + _rows(1000, 3).to_pylist(), key=lambda r: r["id"]
    )
    assert len(t.snapshots()) == APPENDS + 1
    on_disk = {p for p in _files_on_disk(t) if "/data/" in p}
    assert on_disk == {p.removeprefix("file://") for p in _data_files(t)}


def test_merge_into_a_table_with_a_required_key_equals_upsert(ctx, catalog):
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "p", StringType(), required=False),
        NestedField(3, "x", DoubleType(), required=False),
        identifier_field_ids=[1],
    )
    arrow = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), ARROW.field("p"), ARROW.field("x")]
    )
    ours, theirs = (catalog.create_table(f"db.{n}", schema=schema) for n in ("ours", "theirs"))
    for t in (ours, theirs):
        t.append(_rows(0, 10).cast(arrow))
    source = pa.table({"id": [2, 40], "p": ["z", "y"], "x": [2.5, 4.5]}, arrow)
    theirs.upsert(source)
    ctx.register_table("keyed", source)
    ctx.register_iceberg("t", ours)
    ctx.sql(
        """MERGE INTO t USING keyed AS s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
    ).collect()
    assert _read(ours) == _read(theirs)


def test_timestamp_keys_prune_a_day_partitioned_table(ctx, catalog):
    schema = Schema(
        NestedField(1, "ts", TimestamptzType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
    )
    spec = PartitionSpec(PartitionField(1, 1000, DayTransform(), "ts_day"))
    t = catalog.create_table("db.days", schema=schema, partition_spec=spec)
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    arrow = pa.schema([("ts", pa.timestamp("us", "UTC")), ("x", pa.float64())])
    for k in range(4):  # a day per append (pyiceberg's day transform needs pyiceberg-core)
        hours = [start + datetime.timedelta(days=k, hours=h) for h in range(3)]
        ctx.register_table(
            f"day{k}", pa.table({"ts": hours, "x": [k * 10.0 + h for h in range(3)]}, arrow)
        )
        ctx.sql(f"SELECT * FROM day{k}").write_iceberg(t)
    at = [start + datetime.timedelta(days=2, hours=h) for h in (1, 5)]
    source = pa.table({"ts": at, "x": [-1.0, -2.0]}, arrow)
    c = SessionContext()
    c.from_arrow(t.scan().to_arrow().cast(arrow), "t")
    c.from_arrow(source, "s")
    expected = c.sql(
        "SELECT * FROM s UNION ALL SELECT t.* FROM t LEFT ANTI JOIN s ON t.ts = s.ts ORDER BY ts"
    ).to_pylist()
    before = _data_files(t)
    ctx.register_table("at", source)
    ctx.register_iceberg("t", t)
    got = ctx.sql(
        """MERGE INTO t USING at AS s ON t.ts = s.ts
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    assert got == [{"count": 13}]
    t.refresh()
    assert t.scan().to_arrow().cast(arrow).sort_by("ts").to_pylist() == expected
    assert len(before - _data_files(t)) == 1  # the third day's file only


def test_a_source_that_reads_the_target_reads_all_of_it(ctx, catalog):
    # the keys 100..104 match no file; the source's rows come from the files of ids 0..4
    t = _table(catalog, "t")
    before = _read(t)
    ctx.register_iceberg("t", t)
    got = ctx.sql(
        """MERGE INTO t USING (SELECT id + 100 AS id, p, x FROM t WHERE id < 5) AS s
        ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    copies = [{**r, "id": r["id"] + 100} for r in before if r["id"] < 5]
    assert _read(t) == before + copies and got == [{"count": len(before) + 5}]
