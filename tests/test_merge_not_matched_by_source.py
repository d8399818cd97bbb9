"""``MERGE ... WHEN NOT MATCHED BY SOURCE [AND c] THEN UPDATE SET ... | DELETE`` (issue 39).

Spark 3.4's and Delta's clause: it applies to the target rows no source row
matches, which may be in any file, so such a merge reads and rewrites every
file (no pruning by the source's keys). The tables here have six files (one
per append) and the source's keys touch one of them: every other file's rows
must still change. Oracles: deltalake's own ``DeltaTable.merge(...)
.when_not_matched_by_source_update/delete`` for Delta, single-node DataFusion
over the same rows for Iceberg.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext
from deltalake import DeltaTable, write_deltalake
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from distfusion import DistributedConfig, DistributedContext
from tests.iceberg_tables import local_catalog

RUNTIMES = {"local": 2, "flight": 2, "spark": 2}
ARROW = pa.schema([("id", pa.int64()), ("p", pa.string()), ("x", pa.float64())])
APPENDS = 6
LAYOUTS = ["unpartitioned", "partitioned"]
# the source: ids 21..25 (in the third append's files) and new ones
SOURCE = pa.table(
    {
        "id": pa.array([21, 22, 23, 700, 701], pa.int64()),
        "p": ["k 0", "k 1", "k 2", "k 1", "k 0"],
        "x": [-21.0, -22.0, -23.0, 700.0, 701.0],
        "op": ["u", "d", "u", "i", "i"],
    }
)
CLAUSES = """
    WHEN MATCHED AND s.op = 'd' THEN DELETE
    WHEN MATCHED THEN UPDATE SET x = s.x
    WHEN NOT MATCHED THEN INSERT (id, p, x) VALUES (s.id, s.p, s.x)
    WHEN NOT MATCHED BY SOURCE AND t.id % 4 = 0 THEN DELETE
    WHEN NOT MATCHED BY SOURCE AND t.x IS NULL THEN UPDATE SET x = -1
    WHEN NOT MATCHED BY SOURCE THEN UPDATE SET p = 'gone', x = t.x * 10"""
ORACLE = """
    SELECT t.id, t.p, s.x FROM t JOIN s ON t.id = s.id WHERE (s.op = 'd') IS NOT TRUE
    UNION ALL SELECT s.id, s.p, s.x FROM s LEFT ANTI JOIN t ON t.id = s.id
    UNION ALL SELECT t.id,
        CASE WHEN t.x IS NULL THEN t.p ELSE 'gone' END,
        CASE WHEN t.x IS NULL THEN -1.0 ELSE t.x * 10 END
      FROM t LEFT ANTI JOIN s ON t.id = s.id WHERE (t.id % 4 = 0) IS NOT TRUE"""


def _rows(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": ids,
            "p": [f"k {i % 3}" for i in ids],
            "x": [i * 0.5 if i % 5 else None for i in ids],
        },
        ARROW,
    )


@pytest.fixture(params=list(RUNTIMES))
def ctx(request, runtime_for):
    ctx = DistributedContext(
        runtime=runtime_for(request.param, RUNTIMES[request.param]),
        config=DistributedConfig(tasks_per_stage=2),
    )
    ctx.register_table("changes", SOURCE)
    return ctx


def _oracle(before: list[dict], sql: str = ORACLE) -> list[dict]:
    c = SessionContext()
    c.from_arrow(pa.Table.from_pylist(before, ARROW), "t")
    c.from_arrow(SOURCE, "s")
    return c.sql(f"SELECT * FROM ({sql}) AS o ORDER BY id").to_pylist()


# --- Delta ------------------------------------------------------------------------


def _delta(path: str, layout: str) -> str:
    for k in range(APPENDS):
        parts = ["p"] if layout == "partitioned" else None
        write_deltalake(path, _rows(10 * k, 10), partition_by=parts, mode="append")
    return path


def _delta_rows(path: str) -> list[dict]:
    t = pa.table(DeltaTable(path).to_pyarrow_table()).select(ARROW.names)
    return t.cast(ARROW).sort_by("id").to_pylist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_delta_merge_equals_deltalakes_merge(ctx, tmp_path, layout):
    ours, theirs = (_delta(str(tmp_path / n), layout) for n in ("ours", "theirs"))
    (
        DeltaTable(theirs)
        .merge(SOURCE, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete("s.op = 'd'")
        .when_matched_update({"x": "s.x"})
        .when_not_matched_insert({"id": "s.id", "p": "s.p", "x": "s.x"})
        .when_not_matched_by_source_delete("t.id % 4 = 0")
        .when_not_matched_by_source_update({"x": "-1"}, "t.x IS NULL")
        .when_not_matched_by_source_update({"p": "'gone'", "x": "t.x * 10"})
        .execute()
    )
    expected = _delta_rows(theirs)
    assert expected == _oracle(_delta_rows(ours))  # the two oracles agree
    ctx.register_delta("t", ours)
    got = ctx.sql("MERGE INTO t USING changes AS s ON t.id = s.id" + CLAUSES).to_pylist()
    assert _delta_rows(ours) == expected
    assert got == [{"count": len(expected)}]
    assert DeltaTable(ours).version() == APPENDS  # one commit


def test_delta_delete_what_the_source_lacks(ctx, tmp_path):
    path = _delta(str(tmp_path / "t"), "unpartitioned")
    ctx.register_delta("t", path)
    ctx.sql(
        "MERGE INTO t USING changes AS s ON t.id = s.id WHEN NOT MATCHED BY SOURCE THEN DELETE"
    ).collect()
    assert [r["id"] for r in _delta_rows(path)] == [21, 22, 23]


# --- Iceberg ----------------------------------------------------------------------


def _iceberg(tmp_path, layout: str):
    catalog = local_catalog("bs", tmp_path)
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "p", StringType(), required=False),
        NestedField(3, "x", DoubleType(), required=False),
    )
    spec = (
        PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"))
        if layout == "partitioned"
        else PartitionSpec()
    )
    t = catalog.create_table("db.t", schema=schema, partition_spec=spec)
    for k in range(APPENDS):
        t.append(_rows(10 * k, 10))
    return t


def _iceberg_rows(t) -> list[dict]:
    t.refresh()
    return t.scan().to_arrow().cast(ARROW).sort_by("id").to_pylist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_iceberg_merge_equals_a_datafusion_oracle(ctx, tmp_path, layout):
    t = _iceberg(tmp_path, layout)
    expected = _oracle(_iceberg_rows(t))
    files = {task.file.file_path for task in t.scan().plan_files()}
    ctx.register_iceberg("t", t)
    got = ctx.sql("MERGE INTO t USING changes AS s ON t.id = s.id" + CLAUSES).to_pylist()
    assert _iceberg_rows(t) == expected
    assert got == [{"count": len(expected)}]
    assert len(t.snapshots()) == APPENDS + 1
    assert int(t.current_snapshot().summary["deleted-data-files"]) == len(files)  # every file


def test_iceberg_delete_what_the_source_lacks(ctx, tmp_path):
    t = _iceberg(tmp_path, "partitioned")
    ctx.register_iceberg("t", t)
    ctx.sql(
        """MERGE INTO t USING changes AS s ON t.id = s.id
        WHEN NOT MATCHED BY SOURCE AND t.p <> 'k 0' THEN DELETE"""
    ).collect()
    expected = [r for r in _rows(0, 60).to_pylist() if r["p"] == "k 0" or r["id"] in (21, 22, 23)]
    assert _iceberg_rows(t) == expected
