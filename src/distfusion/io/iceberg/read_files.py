"""Reading an Iceberg table's data files in a leaf task (no pyiceberg needed here).

Each work unit is one data file (a Parquet URL or path, its size and record
count) and, in its ``data``, what the task needs to read it as the table:
the position delete files that apply to it, the identity partition values
of its spec and the data file's own path as the manifest names it (see
:mod:`distfusion.io.iceberg.plan_files`). The table's columns reach the worker
in the source's state (:class:`Layout`: field ids, names, Arrow types).

**Columns by field id** (Iceberg's schema evolution): a file's columns are
matched to the table's by the Parquet field id each carries
(``PARQUET:field_id``, which DataFusion keeps in the Arrow field metadata
when it reads the footer with ``skip_metadata=False``), never by name:

- a column renamed after the file was written is read under its new name;
- a column added since is NULL in the file (or, when it is the source of an
  identity partition field of the file's spec, that partition value, as the
  spec's column projection says);
- a dropped column is not read; a promoted type (``int`` -> ``long``,
  ``float`` -> ``double``, a wider decimal) is cast;
- a file without field ids is matched through the table's name mapping
  (``schema.name-mapping.default``), else refused;
- a struct, list or map column is read when its nested field ids and names
  are the table's (types may be promoted); a nested rename, addition or
  reorder is refused with the column and file named rather than read wrong.

**Natively** (:func:`native_frame`): a file without deletes is
``ctx.read_parquet(url)`` in the task's DataFusion session, through the
object store registered for its bucket, with a projection that renames,
casts and fills the columns: DataFusion reads only the columns and row
groups the fragment needs. Its footer is fetched once per task: DataFusion
reads the schema with field ids, then the file again without field metadata
(from its footer cache: a HEAD request, no second footer read), so that no
output batch carries metadata the others lack (an exchange's batches must
agree on their schema).

**Position deletes** (:func:`frame_with_deletes`): the delete files are read
natively (``file_path``, ``pos``, filtered to this data file), but the data
file itself is read with pyarrow, because a delete removes the row at a
*position* of the file and DataFusion 55 cannot say which position a row had
(its Parquet scan has no row-index column, and prunes row groups and pages by
statistics, so neither the order nor the count of the rows it returns gives
positions). pyarrow's ``ParquetFile.iter_batches`` returns every row of the
file in order, so the position of each row is its offset; the rows whose
positions are deleted are dropped, and the rest become a memory table
(the file is held in the task's memory). pyiceberg applies deletes the same
way (``pyiceberg.io.pyarrow._task_to_record_batches``).
"""

from __future__ import annotations

import decimal
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datafusion import DataFrame, SessionContext, col, lit

from distfusion.io import object_store
from distfusion.io.sources import listed, missing_files
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = [
    "FIELD_ID",
    "Layout",
    "check_present",
    "deleted_positions",
    "frame_with_deletes",
    "native_frame",
    "scan_units",
    "without_file_statistics",
]

FIELD_ID = b"PARQUET:field_id"
"""The Arrow field metadata key of a Parquet column's field id (Arrow's and pyarrow's)."""

_READ_BATCH_ROWS = 64 * 1024
_PARALLEL_FOOTERS = 8


@dataclass(frozen=True)
class Layout:
    """The table's columns as the tasks read them.

    Attributes:
        table: the table's name, for errors (``db.events``).
        schema: the declared Arrow schema (names and types, all nullable).
        field_ids: the Iceberg field id of each column of ``schema``, in order.
        nested: per column, its nested field ids and names (:func:`signature`
            of the table's type), or None for a primitive column.
        name_mapping: the table's name mapping, top-level names to field
            ids, for files without field ids; None when it has none.
    """

    table: str
    schema: pa.Schema
    field_ids: tuple[int, ...]
    nested: tuple[Any, ...]
    name_mapping: dict[str, int] | None

    def to_json(self) -> dict:
        """The layout without its schema (sent with it separately), as JSON-able data."""
        return {
            "table": self.table,
            "field_ids": list(self.field_ids),
            "nested": list(self.nested),
            "name_mapping": self.name_mapping,
        }

    @classmethod
    def from_json(cls, d: dict, schema: pa.Schema) -> Layout:
        """Inverse of :meth:`to_json`.

        Raises:
            KeyError: a field is missing.
        """
        return cls(
            d["table"],
            schema,
            tuple(d["field_ids"]),
            tuple(_tuples(n) for n in d["nested"]),
            d["name_mapping"],
        )


def _tuples(v: Any) -> Any:
    """JSON lists back as tuples (signatures compare as tuples)."""
    if isinstance(v, list):
        return tuple(_tuples(x) for x in v)
    return v


def _field_id(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(FIELD_ID)
    return int(raw) if raw is not None else None


def signature(field: pa.Field, with_ids: bool = True) -> Any:
    """The nested field ids and names of an Arrow ``field``'s type; None for a primitive.

    ``("struct", ((id, name, sig), ...))``, ``("list", id, sig)``,
    ``("map", key id, key sig, value id, value sig)``, with ids None when
    ``with_ids`` is false (a file without field ids).
    """
    t = field.type

    def fid(f: pa.Field) -> int | None:
        return _field_id(f) if with_ids else None

    if pa.types.is_struct(t):
        return ("struct", tuple((fid(c), c.name, signature(c, with_ids)) for c in t))
    if pa.types.is_map(t):
        k, v = t.key_field, t.item_field
        return ("map", fid(k), signature(k, with_ids), fid(v), signature(v, with_ids))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        v = t.value_field
        return ("list", fid(v), signature(v, with_ids))
    return None


def _without_ids(sig: Any) -> Any:
    """``sig`` with every field id None (to compare with a file that has none)."""
    if sig is None:
        return None
    if sig[0] == "struct":
        return ("struct", tuple((None, name, _without_ids(s)) for _, name, s in sig[1]))
    if sig[0] == "list":
        return ("list", None, _without_ids(sig[2]))
    return ("map", None, _without_ids(sig[2]), None, _without_ids(sig[4]))


def _partition_value(raw: Any, t: pa.DataType) -> pa.Scalar:
    """An identity partition value (as :mod:`.plan_files` encodes it) as a scalar of type ``t``.

    Dates arrive as days, times and timestamps as microseconds (Iceberg's
    representations), decimals as text, binary as hex.
    """
    if isinstance(raw, dict) and "decimal" in raw:
        return pa.scalar(decimal.Decimal(raw["decimal"]), t)
    if isinstance(raw, dict) and "bytes" in raw:
        value = pa.scalar(bytes.fromhex(raw["bytes"]), pa.binary())
    elif isinstance(raw, int) and not isinstance(raw, bool) and pa.types.is_date32(t):
        value = pa.scalar(raw, pa.int32())
    elif isinstance(raw, int) and not isinstance(raw, bool) and pa.types.is_temporal(t):
        value = pa.scalar(raw, pa.int64())
    elif isinstance(raw, str):
        value = pa.scalar(raw, pa.string())
    else:
        value = pa.scalar(raw)
    return value.cast(_plain(t))


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with view types as plain ones (DataFusion's ``lit`` takes those)."""
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    return t


def column_sources(layout: Layout, file_schema: pa.Schema, info: dict, path: str) -> list:
    """Where each table column comes from in a file: ``("column", name)``, ``("value", scalar)``.

    The value of a column the file lacks is its identity partition value
    (a pyarrow scalar), or None (NULL).

    Args:
        layout: the table's columns.
        file_schema: the file's Arrow schema with its field-id metadata.
        info: the unit's ``data`` (identity partition values by field id).
        path: the file, for errors.

    Raises:
        ValueError: the file has no field ids and the table no name mapping;
            a nested column's fields differ from the table's (named).
    """
    by_id: dict[int, pa.Field] = {}
    with_ids = any(_field_id(f) is not None for f in file_schema)
    if with_ids:
        for f in file_schema:
            fid = _field_id(f)
            if fid is not None:
                by_id[fid] = f
    elif layout.name_mapping is not None:
        for f in file_schema:
            fid = layout.name_mapping.get(f.name)
            if fid is not None:
                by_id[fid] = f
    else:
        msg = (
            f"Iceberg table {layout.table!r}: data file {path} has no Parquet field ids and "
            "the table has no name mapping (schema.name-mapping.default): its columns cannot "
            "be matched to the table's; add a name mapping to the table (as Iceberg's "
            "add_files/migrate procedures do)"
        )
        raise ValueError(msg)
    identity = info.get("identity", {})
    out = []
    for target, fid, nested in zip(layout.schema, layout.field_ids, layout.nested, strict=True):
        found = by_id.get(fid)
        if found is not None:
            if nested is not None:
                expected = nested if with_ids else _without_ids(nested)
                if signature(found, with_ids) != expected:
                    msg = (
                        f"Iceberg table {layout.table!r}: column {target.name!r} of data file "
                        f"{path} has nested fields other than the table's (a nested field was "
                        "renamed, added, dropped or reordered since the file was written); "
                        "distfusion reads nested columns only as they were written"
                    )
                    raise ValueError(msg)
            out.append(("column", found.name))
        elif str(fid) in identity:
            out.append(("value", _partition_value(identity[str(fid)], target.type)))
        else:
            out.append(("value", None))
    return out


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def native_frame(ctx: SessionContext, layout: Layout, unit: WorkUnit, info: dict) -> DataFrame:
    """A data file without deletes, read by DataFusion as the table's columns (see the module).

    Raises:
        ValueError: see :func:`column_sources`.
        Exception: DataFusion's error (unreadable file, a refused request).
    """
    with_ids = ctx.read_parquet(unit.path, skip_metadata=False).schema()
    sources = column_sources(layout, with_ids, info, unit.path)
    # Read again without the field metadata (DataFusion's footer cache: no second
    # footer read), so that no batch carries it: batches of one exchange must agree.
    df = ctx.read_parquet(unit.path)
    exprs = []
    for target, (kind, what) in zip(layout.schema, sources, strict=True):
        if kind == "column":
            exprs.append(col(_quoted(what)).cast(target.type).alias(target.name))
        else:
            exprs.append(lit(what).cast(target.type).alias(target.name))  # lit(None): NULL
    return df.select(*exprs)


def deleted_positions(ctx: SessionContext, info: dict) -> np.ndarray:
    """The positions the unit's position delete files delete from its data file, sorted, unique.

    The delete files are read natively (DataFusion, through the object
    stores), only their rows naming this data file (``file_path`` as the
    manifest names it).

    Returns:
        int64 positions (0 is the file's first row).

    Raises:
        Exception: DataFusion's error reading a delete file.
    """
    target = info["file_path"]
    found: list[Any] = []  # numpy arrays of positions
    for d in info.get("deletes", ()):
        df = ctx.read_parquet(d["path"])
        rows = df.filter(col("file_path") == lit(target)).select(col("pos")).to_arrow_table()
        found.extend(c.to_numpy(zero_copy_only=False) for c in rows.column(0).chunks)
    if not found:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64))


def _open(path: str):
    """A seekable binary file of ``path``: local, or an object read through its store."""
    if object_store.is_url(path):
        return object_store.open_input(path)
    return open(path, "rb")  # noqa: SIM115 -- the caller closes it


def frame_with_deletes(
    ctx: SessionContext, layout: Layout, unit: WorkUnit, info: dict, deleted: np.ndarray
) -> DataFrame:
    """A data file read with pyarrow, its rows at ``deleted`` positions dropped (see the module).

    Raises:
        ValueError: see :func:`column_sources`.
        OSError: the file cannot be read.
    """
    with _open(unit.path) as f:
        pf = pq.ParquetFile(f)
        file_schema = pf.schema_arrow
        sources = column_sources(layout, file_schema, info, unit.path)
        columns = sorted({what for kind, what in sources if kind == "column"})
        batches = []
        offset = 0
        for batch in pf.iter_batches(batch_size=_READ_BATCH_ROWS, columns=columns or None):
            n = batch.num_rows
            lo, hi = np.searchsorted(deleted, [offset, offset + n])
            if hi > lo:
                keep = np.ones(n, dtype=bool)
                keep[deleted[lo:hi] - offset] = False
                batch = batch.filter(pa.array(keep))
            offset += n
            if batch.num_rows:
                batches.append(_project(batch, layout.schema, sources))
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=layout.schema)]
    return ctx.create_dataframe([batches], schema=layout.schema)


def _project(batch: pa.RecordBatch, schema: pa.Schema, sources: list) -> pa.RecordBatch:
    """``batch`` (a file's columns) as the table's columns, by ``sources``."""
    arrays = []
    for target, (kind, what) in zip(schema, sources, strict=True):
        if kind == "column":
            a = batch.column(what)
            # Equal types may differ in nested field metadata (field ids): view them away.
            arrays.append(a.view(target.type) if a.type == target.type else a.cast(target.type))
        else:
            value = what if what is not None else pa.scalar(None, _plain(target.type))
            arrays.append(pa.repeat(value, batch.num_rows).cast(target.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def check_present(layout: Layout, units: list[WorkUnit]) -> None:
    """Raise unless every data and delete file of ``units`` exists now.

    DataFusion reads a file URL that names nothing as an empty table (it
    lists the path as a prefix), so a file removed after the scan was
    planned (an expired snapshot's files deleted, an orphan-file clean-up)
    would lose its rows without a word (:func:`distfusion.io.sources.missing_files`,
    as :func:`distfusion.io.sources.check_files_exist` does for file tables).

    Raises:
        FileNotFoundError: a file is gone (names the table and up to 3 files).
        OSError: the object store refused or could not be reached.
    """
    paths = [u.path for u in units]
    for u in units:
        paths.extend(d["path"] for d in json.loads(u.data).get("deletes", ()))
    gone = missing_files(f"Iceberg table {layout.table!r}", paths)
    if gone:
        msg = (
            f"Iceberg table {layout.table!r}: file {listed(gone)} no longer "
            "exists: it was removed after the scan was planned from the table's snapshot "
            "(snapshots expired and their files deleted, an orphan-file clean-up, or the "
            "table was dropped); run the query again (register the table again to read "
            "its current snapshot)"
        )
        raise FileNotFoundError(msg)


def without_file_statistics(ctx: SessionContext) -> None:
    """Turn off DataFusion's file statistics in ``ctx`` (the task's session).

    DataFusion 55 (``datafusion.execution.collect_statistics``, on by default)
    reads a column whose Parquet statistics have ``min == max`` and no nulls
    as that constant; but Parquet statistics leave NaN out, so a ``double``
    column holding ``[15.5, NaN]`` is read as ``[15.5, 15.5]``: a wrong
    answer (seen with a file pyiceberg wrote; single-node DataFusion reads
    it so too). Without file statistics DataFusion reads the values. Row
    group and page pruning by the query's filters still run (they read the
    footer themselves).
    """
    ctx.sql("SET datafusion.execution.collect_statistics = false").collect()


def scan_units(ctx: SessionContext, layout: Layout, units: list[WorkUnit]) -> DataFrame:
    """The union of ``units``' files read as the table (natively, or with their deletes).

    Footers of files read natively are fetched in parallel (up to
    ``_PARALLEL_FOOTERS`` at once: DataFusion reads each one's schema now).

    Raises:
        FileNotFoundError: a data or delete file is gone (:func:`check_present`).
        ValueError: a file's columns cannot be matched (:func:`column_sources`).
        Exception: DataFusion's or pyarrow's error reading a file.
    """
    check_present(layout, units)
    infos = [json.loads(u.data) for u in units]
    without_file_statistics(ctx)

    def frame(i: int) -> DataFrame:
        unit, info = units[i], infos[i]
        if info.get("deletes"):
            deleted = deleted_positions(ctx, info)
            if len(deleted):
                return frame_with_deletes(ctx, layout, unit, info, deleted)
        return native_frame(ctx, layout, unit, info)

    if len(units) == 1:
        frames = [frame(0)]
    else:
        with ThreadPoolExecutor(min(_PARALLEL_FOOTERS, len(units))) as pool:
            frames = list(pool.map(frame, range(len(units))))
    df = frames[0]
    for other in frames[1:]:
        df = df.union(other)
    return df
