"""Writing a query's result into an Iceberg table: distributed files, one pyiceberg commit.

:func:`write_iceberg` is :meth:`DistributedDataFrame.write_iceberg
<distfusion.context.DistributedDataFrame.write_iceberg>`::

    check the result's columns against the table's schema (before any task)
    select the table's columns in its order, plus one hidden column per
        partition field: the transform's value, computed by the query
        (identity, year, month, day, hour, truncate as SQL expressions)
    tasks write Parquet files with the table's field ids, Hive-style
        directories of the hidden columns (dropped from the files)
        -> moved to <data root>/<partition path>/ (PartitionSpec.partition_to_path)
    one DataFile per file: partition record from its directory, value and
        null counts, column sizes, lower/upper bounds from its footer
        (pyiceberg's data_file_statistics_from_parquet_metadata, the metrics
        its own writes record, with the table's metrics properties)
    one pyiceberg transaction, one catalog commit

**Which commit, and why.** pyiceberg offers ``append``/``overwrite`` (they
write the files themselves, from Arrow data on this machine), ``add_files``
(refuses files with field ids, and reads every footer again through the
table's FileIO) and the snapshot producers of a transaction
(``Transaction.update_snapshot()``). The files here are written by the tasks,
with field ids, and their footers are already read; so the producers take
``DataFile`` entries: ``fast_append`` for ``mode="append"`` (one ``append``
snapshot), ``overwrite`` (delete every current data file, add the new ones:
one ``overwrite`` snapshot) for a full overwrite, and for a MERGE
(``replacing``: the data files it read) an ``overwrite`` deleting only those
(:mod:`distfusion.table_write.iceberg_merge`). With ``overwrite_filter``
the transaction first runs pyiceberg's own ``delete(overwrite_filter)`` (it
drops the files the filter covers and rewrites, copy-on-write, those it
covers in part), then fast-appends the new files: pyiceberg's own
``overwrite`` semantics, two snapshots committed atomically in one catalog
commit, as pyiceberg's ``overwrite`` makes them.

A blind append that loses a race (``CommitFailedException``) is committed
again on the refreshed table (the same files), up to
:data:`APPEND_RETRIES` times; any other conflict raises
:class:`~distfusion.table_write.files.TableWriteError` naming the table and
both snapshots. The bucket transform (Iceberg's murmur3 hash) is not
computed here yet: such a table is refused before any task runs.
"""

from __future__ import annotations

import decimal
import uuid
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from distfusion.io import object_store
from distfusion.io.iceberg.stores import ensure_store
from distfusion.io.write import WriteSpec, file_schema
from distfusion.table_write.delta import TableCommit
from distfusion.table_write.files import (
    HIVE_NULL,
    PlacedFile,
    TableWriteError,
    discard,
    place_files,
    run_job,
)

__all__ = ["APPEND_RETRIES", "write_iceberg"]

APPEND_RETRIES = 3
"""Times a blind append is committed again after a concurrent commit won."""

MODES = ("append", "overwrite")
HIDDEN = "__distfusion_partition_"


def write_iceberg(
    frame: Any,
    table: Any,
    mode: str = "append",
    overwrite_filter: Any = None,
    *,
    replacing: list | None = None,
) -> TableCommit:
    """Run ``frame``'s query and commit its rows into the pyiceberg ``table``.

    See :meth:`distfusion.context.DistributedDataFrame.write_iceberg`.
    ``replacing`` (with ``mode="overwrite"``, no ``overwrite_filter``): the
    ``DataFile`` entries of ``table``'s current snapshot the new files
    replace; only they are deleted, in one ``overwrite`` snapshot whose
    parent is that snapshot (a MERGE's copy-on-write,
    :mod:`distfusion.table_write.iceberg_merge`).
    """
    try:
        from pyiceberg.table import Table
    except ImportError as exc:  # pragma: no cover - pyiceberg is a dependency of iceberg reads
        msg = "writing Iceberg tables needs pyiceberg: pip install 'distfusion[iceberg]'"
        raise ImportError(msg) from exc
    if mode not in MODES:
        msg = f"mode must be one of {', '.join(MODES)}, got {mode!r}"
        raise ValueError(msg)
    if overwrite_filter is not None and mode != "overwrite":
        msg = "overwrite_filter needs mode='overwrite'"
        raise ValueError(msg)
    if replacing is not None and (mode != "overwrite" or overwrite_filter is not None):
        msg = "replacing needs mode='overwrite' and no overwrite_filter"
        raise ValueError(msg)
    if not isinstance(table, Table):
        msg = f"table must be a pyiceberg Table (from any catalog), got {type(table).__name__}"
        raise TypeError(msg)
    name = ".".join(table.name())
    write_schema, exprs, hidden = _checked(frame, table, name)
    data_root = _data_root(table)
    if object_store.is_url(data_root):  # the tasks write with the store of the table's bucket
        ensure_store(data_root, dict(table.io.properties))
        frame.context._stores_for(data_root)
    frame_out = frame.select_exprs(*exprs)
    root_path = data_root[len("file://") :] if data_root.startswith("file://") else data_root
    spec = WriteSpec(root_path, str(uuid.uuid4()), "parquet", write_schema, tuple(hidden))
    records: dict = {}
    rename = _renamer(table, hidden, records)
    placed = place_files(spec, run_job(frame_out, spec, name), rename)
    read_snapshot = table.metadata.current_snapshot_id
    try:
        data_files = [_data_file(table, data_root, p, hidden, records) for p in placed]
        removed = _commit(table, name, data_files, mode, overwrite_filter, read_snapshot, replacing)
    except BaseException:
        discard(spec, placed)
        raise
    snapshot = table.current_snapshot()
    return TableCommit(
        name,
        snapshot.snapshot_id if snapshot is not None else -1,
        [p.relpath for p in placed],
        removed,
        sum(p.rows for p in placed),
        sum(p.size for p in placed),
    )


def _data_root(table: Any) -> str:
    """Where new data files go: ``write.data.path``, else ``<location>/data``."""
    return table.location_provider().new_data_location("x").rsplit("/", 1)[0]


def _checked(frame: Any, table: Any, name: str) -> tuple[pa.Schema, list[str], list[str]]:
    """The files' schema (field ids), the select expressions, the hidden partition columns.

    Raises:
        ValueError: a column of the table missing from the result (and not
            nullable), one of the result not in the table, a type that does
            not fit (the message names the column); a partition transform
            not computed here (bucket, void, or truncate of another type than
            integers and strings).
    """
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, schema_to_pyarrow

    schema = table.schema()
    result = file_schema(frame.schema())
    names = [f.name for f in schema.fields]
    extra = [n for n in result.names if n not in names]
    if extra:
        msg = (
            f"column(s) {extra} of the result are not in the Iceberg table {name} "
            f"(columns {names}); evolve its schema first (table.update_schema())"
        )
        raise ValueError(msg)
    missing = [f.name for f in schema.fields if f.name not in result.names]
    required = [n for n in missing if schema.find_field(n).required]
    if required:
        msg = (
            f"required column(s) {required} of the Iceberg table {name} are missing from the result"
        )
        raise ValueError(msg)
    # a required column takes a nullable one: the tasks check its values (files.run_job)
    present = pa.schema(
        [
            result.field(n).with_nullable(not schema.find_field(n).required)
            for n in names
            if n in result.names
        ]
    )
    try:
        _check_pyarrow_schema_compatible(
            schema.select(*present.names), present, True, table.metadata.format_version
        )
    except ValueError as exc:
        bad = [
            n
            for n in present.names
            if not _fits(present.field(n).type, schema_to_pyarrow(schema.find_type(n)))
        ]
        msg = (
            f"the result does not fit the Iceberg table {name}: column(s) {bad or present.names} "
            f"have other types than the table's; cast them\n{exc}"
        )
        raise ValueError(msg) from None
    arrow = schema_to_pyarrow(schema, include_field_ids=True)
    exprs = [_ident(n) if n in result.names else f"NULL AS {_ident(n)}" for n in names]
    hidden = []
    types: list[pa.DataType] = []
    for i, field in enumerate(table.spec().fields):
        source = schema.find_field(field.source_id)
        expr, typ = _transform_sql(name, field, source, _ident(source.name))
        hidden.append(f"{HIDDEN}{i}")
        exprs.append(f'{expr} AS "{hidden[-1]}"')
        types.append(typ)
    fields = [*arrow, *[pa.field(h, t) for h, t in zip(hidden, types, strict=True)]]
    return file_schema(pa.schema(fields)), exprs, hidden


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _fits(ours: pa.DataType, theirs: pa.DataType) -> bool:
    ours, theirs = file_schema(pa.schema([("a", ours), ("b", theirs)])).types
    if ours == theirs:
        return True
    if pa.types.is_integer(ours) and pa.types.is_integer(theirs):
        return ours.bit_width <= theirs.bit_width
    return pa.types.is_floating(ours) and pa.types.is_floating(theirs)


def _transform_sql(name: str, field: Any, source: Any, c: str) -> tuple[str, pa.DataType]:
    """A partition field's value as a DataFusion SQL expression over column ``c``, and its type.

    Values are Iceberg's: years/months/days/hours since 1970-01-01 (UTC)
    for the time transforms, the source value for identity (dates as days,
    timestamps as microseconds since the epoch).

    Raises:
        ValueError: a transform not computed here.
    """
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )
    from pyiceberg.types import DateType, StringType, TimestampType, TimestamptzType

    t = field.transform
    stype = source.field_type
    is_date = isinstance(stype, DateType)
    is_ts = isinstance(stype, TimestampType | TimestamptzType)
    micros = f"CAST({c} AS BIGINT)"
    if isinstance(t, IdentityTransform):
        if is_date:
            return f"CAST({c} AS INT)", pa.int32()
        if is_ts:
            return micros, pa.int64()
        return c, _arrow_of(stype)
    if isinstance(t, YearTransform) and (is_date or is_ts):
        return f"CAST(date_part('year', {c}) AS INT) - 1970", pa.int32()
    if isinstance(t, MonthTransform) and (is_date or is_ts):
        year = f"CAST(date_part('year', {c}) AS INT)"
        return f"({year} - 1970) * 12 + CAST(date_part('month', {c}) AS INT) - 1", pa.int32()
    if isinstance(t, DayTransform) and is_date:
        return f"CAST({c} AS INT)", pa.int32()
    if isinstance(t, DayTransform | HourTransform) and is_ts:
        unit = 86_400_000_000 if isinstance(t, DayTransform) else 3_600_000_000
        floor = f"({micros} - (({micros} % {unit}) + {unit}) % {unit}) / {unit}"
        return f"CAST({floor} AS INT)", pa.int32()
    if isinstance(t, TruncateTransform):
        w = t.width
        if isinstance(stype, StringType):
            return f"left({c}, {w})", pa.string()
        arrow = _arrow_of(stype)
        if pa.types.is_integer(arrow):
            return f"{c} - (({c} % {w}) + {w}) % {w}", arrow
    msg = (
        f"the Iceberg table {name} is partitioned by {field.name} = {t}({source.name}); "
        "distfusion computes identity, year, month, day, hour and truncate (of integers "
        "and strings) partitions, not this one yet"
    )
    raise ValueError(msg)


def _arrow_of(iceberg_type: Any) -> pa.DataType:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return file_schema(pa.schema([("a", schema_to_pyarrow(iceberg_type))])).types[0]


def _partition_record(table: Any, relpath: str, hidden: list[str]) -> Any:
    """The partition record of a file below ``h0=v0/h1=v1/`` (values as Iceberg keeps them)."""
    from pyiceberg.typedef import Record

    texts: dict[str, str | None] = {}
    for segment in relpath.split("/")[:-1]:
        key, _, value = segment.partition("=")
        text = unquote(value)
        texts[key] = None if text == HIVE_NULL else text
    spec, schema = table.spec(), table.schema()
    values = []
    for h, field in zip(hidden, spec.fields, strict=True):
        given = texts[h]
        rtype = _arrow_of(field.transform.result_type(schema.find_type(field.source_id)))
        values.append(None if given is None else _parse(given, rtype))
    return Record(*values)


def _parse(text: str, arrow: pa.DataType) -> Any:
    if pa.types.is_date32(arrow) or pa.types.is_integer(arrow):
        return int(text)
    if pa.types.is_timestamp(arrow) or pa.types.is_time(arrow):
        return int(text)
    if pa.types.is_boolean(arrow):
        return text == "true"
    if pa.types.is_floating(arrow):
        return float(text)
    if pa.types.is_decimal(arrow):
        return decimal.Decimal(text)
    return text


def _renamer(table: Any, hidden: list[str], records: dict):
    """``h0=v0/.../part-....parquet`` -> ``<partition path>/part-....parquet`` (the table's).

    Each new path's partition record goes into ``records``.
    """
    if not hidden:
        return None
    spec, schema = table.spec(), table.schema()

    def rename(relpath: str) -> str:
        record = _partition_record(table, relpath, hidden)
        new = f"{spec.partition_to_path(record, schema)}/{relpath.rsplit('/', 1)[-1]}"
        records[new] = record
        return new

    return rename


def _data_file(
    table: Any, data_root: str, placed: PlacedFile, hidden: list[str], records: dict
) -> Any:
    """The ``DataFile`` of a placed file: its partition record and its footer's metrics.

    ``records``: partition record by placed path (:func:`_renamer`'s).
    """
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema, spec = table.schema(), table.spec()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=placed.metadata,
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    partition = records.get(placed.relpath) if hidden else Record()
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"{data_root}/{placed.relpath}",
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=placed.size,
        sort_order_id=None,
        spec_id=spec.spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def _commit(
    table: Any,
    name: str,
    data_files: list,
    mode: str,
    overwrite_filter: Any,
    read: int | None,
    replacing: list | None = None,
) -> list[str]:
    """Commit ``data_files`` in one transaction; the data files it removed.

    ``replacing``: the data files an overwrite deletes (default: every current one).

    Raises:
        TableWriteError: the catalog refused the commit (a concurrent commit
            that is not a blind append's race): names the table and both snapshots.
    """
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    props = {"engine": "distfusion"}
    for attempt in range(APPEND_RETRIES + 1):
        removed: list[str] = []
        try:
            with table.transaction() as tx:
                if mode == "append":
                    with tx.update_snapshot(snapshot_properties=props).fast_append() as fa:
                        for f in data_files:
                            fa.append_data_file(f)
                elif overwrite_filter is None:
                    if replacing is not None:
                        current = replacing
                    elif table.current_snapshot():
                        current = [t.file for t in table.scan().plan_files()]
                    else:
                        current = []
                    with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
                        for f in current:
                            ow.delete_data_file(f)
                            removed.append(f.file_path)
                        for f in data_files:
                            ow.append_data_file(f)
                else:
                    tx.delete(overwrite_filter, snapshot_properties=props)
                    with tx.update_snapshot(snapshot_properties=props).fast_append() as fa:
                        for f in data_files:
                            fa.append_data_file(f)
            return removed
        except (CommitFailedException, ValidationException) as exc:
            table.refresh()
            now = table.metadata.current_snapshot_id
            if (
                mode == "append"
                and attempt < APPEND_RETRIES
                and not isinstance(exc, ValidationException)
            ):
                continue  # a blind append: the same files on the new snapshot
            msg = (
                f"the commit to the Iceberg table {name} failed: the write read snapshot "
                f"{read}, the table is now at {now} ({exc})"
            )
            raise TableWriteError(object_store.redact(msg)) from None
    raise AssertionError("unreachable")  # pragma: no cover
