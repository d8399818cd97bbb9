"""Iceberg tables for tests, written with pyiceberg 0.12 (SQL catalog on SQLite).

:func:`build_events` writes one table with a history that exercises what a
reader must get right, one snapshot per step:

1. ``append`` rows of regions ``eu`` (ids 1-6) and ``us`` (partitioned by identity on
   ``region``: a data file per region);
2. ``append`` rows of ``eu`` and ``ap``;
3. ``overwrite`` of region ``us`` (its files replaced);
4. ``delete`` of ``id = 2`` (pyiceberg rewrites the file: copy-on-write);
5. schema changes (no snapshot): ``v`` renamed ``value``, ``note`` and a
   struct ``info`` (with a list inside) added, ``id`` promoted from ``int``
   to ``long``; then an ``append`` in the new schema (one ``value`` is NaN);
6. a **position delete file** deleting the first and last rows of the
   largest ``eu`` data file (ids 1 and 6; merge-on-read), committed with
   :func:`commit_position_deletes`;
7. a data file **without the partition column** (``region`` comes from the
   partition value ``sa``, as files of migrated tables), with
   :func:`append_data_file`.

pyiceberg 0.12 writes no merge-on-read deletes (its ``delete`` rewrites data
files) and has no writer for delete manifests, so :func:`commit_position_deletes`
writes the delete file itself (Parquet, columns ``file_path`` and ``pos`` with
the spec's reserved field ids 2147483546 and 2147483545) and commits it with
pyiceberg's own snapshot producer: ``table.transaction()``,
``update_snapshot().fast_append()``, ``append_data_file(DataFile(content=
POSITION_DELETES))``, with the producer's manifest writer swapped for
:class:`DeleteManifestWriter` (pyiceberg's ``ManifestWriterV2`` writing a
manifest of content ``deletes``, as the spec requires for delete files).
The least internal way found: pyiceberg's public classes, one overridden
method (``new_manifest_writer`` on the producer instance). The snapshot's
operation says ``append`` (the producer's); readers do not look at it.
"""

from __future__ import annotations

import datetime
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

POS_FIELD_ID = "2147483545"
FILE_PATH_FIELD_ID = "2147483546"


class DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing a manifest of delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def s3_catalog(name: str, db_path, endpoint: str, bucket: str = "iceberg") -> SqlCatalog:
    """A SQL catalog on SQLite whose warehouse is ``s3://bucket/<name>`` on the local S3 server."""
    return SqlCatalog(
        name,
        uri=f"sqlite:///{db_path}",
        warehouse=f"s3://{bucket}/{name}",
        **{
            "s3.endpoint": endpoint,
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.region": "us-east-1",
        },
    )


def local_catalog(name: str, directory) -> SqlCatalog:
    """A SQL catalog on SQLite with a warehouse on local disk (``file://``)."""
    return SqlCatalog(
        name, uri=f"sqlite:///{directory}/catalog.db", warehouse=f"file://{directory}/warehouse"
    )


def write_parquet(table, path: str, data: pa.Table) -> int:
    """Write ``data`` to ``path`` through the table's FileIO; its size in bytes."""
    with table.io.new_output(path).create(overwrite=True) as f:
        pq.write_table(data, f)
    return len(table.io.new_input(path))


def commit_position_deletes(table, data_file_path: str, positions: list[int], partition: Record):
    """Delete the rows at ``positions`` of data file ``data_file_path`` (merge-on-read).

    See the module docs. Returns the delete file's path.
    """
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": FILE_PATH_FIELD_ID}),
            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": POS_FIELD_ID}),
        ]
    )
    rows = pa.table({"file_path": [data_file_path] * len(positions), "pos": positions}, schema)
    path = f"{table.location()}/data/deletes-{uuid.uuid4()}.parquet"
    size = write_parquet(table, path, rows)
    spec = table.spec()
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=len(positions),
        file_size_in_bytes=size,
    )
    delete_file.spec_id = spec.spec_id
    _commit(table, delete_file, DeleteManifestWriter)
    return path


def commit_equality_deletes(table, column_id: int, values: list, partition: Record) -> str:
    """An equality delete file on field ``column_id`` (distfusion refuses to read it); its path."""
    field_ = table.schema().find_field(column_id)
    data = pa.table({field_.name: values})
    data = data.cast(
        pa.schema(
            [
                pa.field(
                    field_.name, data.schema[0].type, True, {b"PARQUET:field_id": str(column_id)}
                )
            ]
        )
    )
    path = f"{table.location()}/data/eq-deletes-{uuid.uuid4()}.parquet"
    size = write_parquet(table, path, data)
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=len(values),
        file_size_in_bytes=size,
        equality_ids=[column_id],
    )
    delete_file.spec_id = table.spec().spec_id
    _commit(table, delete_file, DeleteManifestWriter)
    return path


def append_data_file(table, data: pa.Table, partition: Record) -> str:
    """Append ``data`` (columns with field ids) as one data file of ``partition``; its path."""
    path = f"{table.location()}/data/added-{uuid.uuid4()}.parquet"
    size = write_parquet(table, path, data)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=data.num_rows,
        file_size_in_bytes=size,
    )
    data_file.spec_id = table.spec().spec_id
    _commit(table, data_file, None)
    return path


def _commit(table, data_file: DataFile, writer) -> None:
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            if writer is not None:
                append.new_manifest_writer = lambda spec: writer(
                    spec,
                    append.schema(),
                    append.new_manifest_output(),
                    append.snapshot_id,
                    "deflate",
                )
            append.append_data_file(data_file)


@dataclass
class Events:
    """The table of :func:`build_events` and its snapshots by step."""

    table: object
    snapshots: dict[str, int] = field(default_factory=dict)
    times_ms: dict[str, int] = field(default_factory=dict)
    deleted_file: str = ""


def _rows(ids: list[int], region: str) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "region": pa.array([region] * len(ids), pa.string()),
            "v": pa.array([i * 1.5 for i in ids], pa.float64()),
        }
    )


def build_events(catalog, name: str = "db.events") -> Events:
    """Write the table of the module docs in ``catalog``; its snapshots by step name."""
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    if catalog.table_exists(name):
        catalog.drop_table(name)
    schema = Schema(
        NestedField(1, "id", IntegerType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "v", DoubleType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
    )
    t = catalog.create_table(name, schema=schema, partition_spec=spec)
    out = Events(t)

    def mark(step: str) -> None:
        t.refresh()
        snap = t.current_snapshot()
        out.snapshots[step] = snap.snapshot_id
        out.times_ms[step] = snap.timestamp_ms
        time.sleep(0.01)  # distinct commit times for as_of

    t.append(pa.concat_tables([_rows([1, 2, 3, 4, 5, 6], "eu"), _rows([101, 102, 103], "us")]))
    mark("append1")
    t.append(pa.concat_tables([_rows([7, 8], "eu"), _rows([9, 10, 11], "ap")]))
    mark("append2")
    t.overwrite(_rows([40, 50], "us"), overwrite_filter="region = 'us'")
    mark("overwrite")
    t.delete("id = 2")
    mark("delete")
    with t.update_schema() as u:
        u.rename_column("v", "value")
        u.add_column("note", StringType())
        u.update_column("id", LongType())
        u.add_column(
            "info",
            StructType(
                NestedField(100, "source", StringType(), required=False),
                NestedField(101, "tags", ListType(102, StringType(), element_required=False)),
            ),
        )
    info = pa.struct([pa.field("source", pa.string()), pa.field("tags", pa.list_(pa.string()))])
    t.append(
        pa.table(
            {
                "id": pa.array([12, 13, 14, 15, 16], pa.int64()),
                "region": ["eu", "eu", "ap", "us", "us"],
                "value": [12.5, 13.5, 14.5, 15.5, float("nan")],
                "note": ["a", None, "c", "d", "nan"],
                "info": pa.array(
                    [
                        {"source": "web", "tags": ["x", "y"]},
                        None,
                        {"source": None, "tags": []},
                        {"source": "app", "tags": None},
                        {"source": "web", "tags": ["z"]},
                    ],
                    info,
                ),
            }
        )
    )
    mark("evolved")
    eu_files = sorted(
        (task.file for task in t.scan(row_filter="region = 'eu'").plan_files()),
        key=lambda f: -f.record_count,
    )
    target = eu_files[0]  # the largest eu file (ids 1, 3, 4, 5, 6): its middle rows stay
    out.deleted_file = target.file_path
    commit_position_deletes(t, target.file_path, [0, target.record_count - 1], Record("eu"))
    mark("position_delete")
    no_region = pa.table(
        {
            "id": pa.array([20, 21], pa.int64()),
            "value": pa.array([20.5, None], pa.float64()),
        }
    ).cast(
        pa.schema(
            [
                pa.field("id", pa.int64(), True, {b"PARQUET:field_id": b"1"}),
                pa.field("value", pa.float64(), True, {b"PARQUET:field_id": b"3"}),
            ]
        )
    )
    append_data_file(t, no_region, Record("sa"))
    mark("no_partition_column")
    return out


def small_table(catalog, name: str, parts: int = 3, rows_per_part: int = 5):
    """A table of ``parts`` appends (one data file each) of ``rows_per_part`` rows: id, region."""
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    if catalog.table_exists(name):
        catalog.drop_table(name)
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
    )
    t = catalog.create_table(name, schema=schema, partition_spec=spec)
    for p in range(parts):
        ids = list(range(p * rows_per_part, (p + 1) * rows_per_part))
        t.append(pa.table({"id": pa.array(ids, pa.int64()), "region": [f"r{p}"] * len(ids)}))
    return t


def timestamp(ms: int) -> datetime.datetime:
    """``ms`` since the epoch as an aware datetime."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
