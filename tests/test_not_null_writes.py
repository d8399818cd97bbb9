"""Writes into NOT NULL (required) columns of Delta and Iceberg tables (issue 39).

Spark's rule (``storeAssignmentPolicy=ANSI``, Delta's NOT NULL constraint): a
query whose column is typed nullable may write into a NOT NULL column; the
values are checked while the tasks write, and one NULL fails the statement,
which commits nothing and leaves no file (:func:`distfusion.table_write.files.run_job`).
Each test compares the table afterwards with what it was before: rows, version
or snapshot, and the files below its location.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from distfusion import DistributedConfig, DistributedContext
from distfusion.table_write import TableWriteError
from tests.iceberg_tables import local_catalog

RUNTIMES = {"local": 2, "flight": 2, "spark": 2}
TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("p", pa.string(), nullable=False),
        pa.field("x", pa.float64()),
    ]
)
NULLABLE = pa.schema([f.with_nullable(True) for f in TABLE])
ICEBERG = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "p", StringType(), required=True),
    NestedField(3, "x", DoubleType(), required=False),
    identifier_field_ids=[1],
)
LAYOUTS = ["unpartitioned", "partitioned"]


def _rows(first: int, n: int, schema: pa.Schema = TABLE) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": ids,
            "p": [f"k {i % 3}" for i in ids],
            "x": [i * 0.5 if i % 4 else None for i in ids],
        },
        schema,
    )


def _with_null(column: str) -> pa.Table:
    """Nullable-typed rows 100..109, one of them NULL in ``column``."""
    rows = _rows(100, 10, NULLABLE).to_pylist()
    rows[7][column] = None
    return pa.Table.from_pylist(rows, NULLABLE)


@pytest.fixture(params=list(RUNTIMES))
def ctx(request, runtime_for):
    ctx = DistributedContext(
        runtime=runtime_for(request.param, RUNTIMES[request.param]),
        config=DistributedConfig(tasks_per_stage=2),
    )
    ctx.register_table("good", _rows(100, 10, NULLABLE), max_rows_per_unit=4)
    ctx.register_table("null_id", _with_null("id"), max_rows_per_unit=4)
    ctx.register_table("null_p", _with_null("p"), max_rows_per_unit=4)
    return ctx


def _files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


# --- Delta ------------------------------------------------------------------------


def _delta(tmp_path, layout: str) -> str:
    path = str(tmp_path / "t")
    parts = ["p"] if layout == "partitioned" else None
    write_deltalake(path, _rows(0, 20), partition_by=parts)
    assert not DeltaTable(path).schema().to_arrow().field("id").nullable
    return path


def _delta_rows(path: str) -> list[dict]:
    return (
        pa.table(DeltaTable(path).to_pyarrow_table()).select(TABLE.names).sort_by("id").to_pylist()
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_delta_insert_of_nullable_typed_values_without_null(ctx, tmp_path, layout):
    path = _delta(tmp_path, layout)
    ctx.register_delta("t", path)
    ctx.sql("INSERT INTO t SELECT id, p, x FROM good").collect()
    dt = DeltaTable(path)
    assert dt.version() == 1
    assert _delta_rows(path) == _rows(0, 20).to_pylist() + _rows(100, 10).to_pylist()
    assert not dt.schema().to_arrow().field("id").nullable  # the table's schema is kept


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("column", ["id", "p"])
def test_delta_insert_of_a_null_fails_and_writes_nothing(ctx, tmp_path, layout, column):
    path = _delta(tmp_path, layout)
    before, files = _delta_rows(path), _files(path)
    ctx.register_delta("t", path)
    with pytest.raises(TableWriteError, match=f"NOT NULL column '{column}' of the table .*t"):
        ctx.sql(f"INSERT INTO t SELECT id, p, x FROM null_{column}").collect()
    assert DeltaTable(path).version() == 0
    assert _delta_rows(path) == before and _files(path) == files


@pytest.mark.parametrize("layout", LAYOUTS)
def test_delta_merge_without_null_equals_delta_rs(ctx, tmp_path, layout):
    ours, theirs = _delta(tmp_path / "a", layout), _delta(tmp_path / "b", layout)
    source = _rows(15, 10, NULLABLE)
    (
        DeltaTable(theirs)
        .merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    ctx.register_table("upserts", source)
    ctx.register_delta("t", ours)
    ctx.sql(
        """MERGE INTO t USING upserts AS s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
    ).collect()
    assert _delta_rows(ours) == _delta_rows(theirs)
    assert DeltaTable(ours).version() == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_delta_merge_writing_a_null_fails_and_writes_nothing(ctx, tmp_path, layout):
    path = _delta(tmp_path, layout)
    before, files = _delta_rows(path), _files(path)
    ctx.register_delta("t", path)
    with pytest.raises(TableWriteError, match="NOT NULL column 'p'"):
        ctx.sql(
            """MERGE INTO t USING good AS s ON t.id = s.id - 95
            WHEN MATCHED AND t.id = 12 THEN UPDATE SET p = NULL
            WHEN MATCHED THEN UPDATE SET x = s.x"""
        ).collect()
    assert DeltaTable(path).version() == 0
    assert _delta_rows(path) == before and _files(path) == files


# --- Iceberg ----------------------------------------------------------------------


def _iceberg(tmp_path, layout: str):
    catalog = local_catalog("nn", tmp_path)
    catalog.create_namespace("db")
    spec = (
        PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"))
        if layout == "partitioned"
        else PartitionSpec()
    )
    t = catalog.create_table("db.t", schema=ICEBERG, partition_spec=spec)
    t.append(_rows(0, 20))
    return t


def _iceberg_rows(t) -> list[dict]:
    t.refresh()
    return t.scan().to_arrow().cast(TABLE).sort_by("id").to_pylist()


def _state(t) -> tuple:
    t.refresh()
    return t.metadata.current_snapshot_id, _iceberg_rows(t), _files(t.location()[len("file://") :])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_iceberg_insert_of_nullable_typed_values_without_null(ctx, tmp_path, layout):
    t = _iceberg(tmp_path, layout)
    ctx.register_iceberg("t", t)
    ctx.sql("INSERT INTO t SELECT id, p, x FROM good").collect()
    assert _iceberg_rows(t) == _rows(0, 20).to_pylist() + _rows(100, 10).to_pylist()
    assert len(t.snapshots()) == 2


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("column", ["id", "p"])
def test_iceberg_insert_of_a_null_fails_and_writes_nothing(ctx, tmp_path, layout, column):
    t = _iceberg(tmp_path, layout)
    before = _state(t)
    ctx.register_iceberg("t", t)
    with pytest.raises(TableWriteError, match=f"NOT NULL column '{column}' of the table db.t"):
        ctx.sql(f"INSERT INTO t SELECT id, p, x FROM null_{column}").collect()
    assert _state(t) == before


@pytest.mark.parametrize("layout", LAYOUTS)
def test_iceberg_merge_writing_a_null_fails_and_writes_nothing(ctx, tmp_path, layout):
    t = _iceberg(tmp_path, layout)
    before = _state(t)
    ctx.register_iceberg("t", t)
    with pytest.raises(TableWriteError, match="NOT NULL column 'p' of the table db.t"):
        ctx.sql(
            """MERGE INTO t USING good AS s ON t.id = s.id - 95
            WHEN MATCHED AND t.id = 12 THEN UPDATE SET p = NULL
            WHEN MATCHED THEN UPDATE SET x = s.x"""
        ).collect()
    assert _state(t) == before
