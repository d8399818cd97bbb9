"""Writing a query's result into a Delta Lake table: distributed files, one commit.

:func:`write_delta` is :meth:`DistributedDataFrame.write_delta
<distfusion.context.DistributedDataFrame.write_delta>`. The tasks write
Parquet data files into the table's directory (:mod:`distfusion.table_write.files`:
each head part where it runs, Hive-style ``col=value/`` directories for the
partition columns, which the files do not hold, as the Delta protocol has
it); the coordinator reads their footers and commits **one** transaction
through delta-rs (``DeltaTable.create_write_transaction``, or
``deltalake.transaction.create_table_with_add_actions`` for a new table)::

    check schema, partitions, predicate  (before any task runs)
    tasks write path/_temporary/<query>/...   -> job commit moves them to path/
    add action per file: path, size, partitionValues,
        stats {numRecords, minValues, maxValues, nullCount} from the footer
    overwrite: remove actions of the files replaced
    one commit: version v+1 (v = the version the write started from);
        a conflicting commit in between fails it (delta-rs's conflict check)

Nothing is visible before the commit; a failed query or a refused commit
deletes every file the write made. Names and meanings of the arguments are
``deltalake.write_deltalake``'s (delta-rs 1.x); ``partition_overwrite_mode``
is Spark's ``spark.sql.sources.partitionOverwriteMode``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from datafusion import SessionContext

from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.write import WriteSpec, file_schema
from distfusion.table_write.delta_predicate import (
    candidate_files,
    over_partitions_only,
    replace_where,
)
from distfusion.table_write.files import (
    PlacedFile,
    TableWriteError,
    check_not_null_partitions,
    discard,
    not_null_columns,
    partition_texts,
    place_files,
    run_job,
)

__all__ = ["TableCommit", "delta_stats", "merge_candidates", "write_delta"]

MODES = ("append", "overwrite")
SCHEMA_MODES = (None, "merge", "overwrite")
PARTITION_OVERWRITE_MODES = ("static", "dynamic")


@dataclass(frozen=True)
class TableCommit:
    """What a table write committed.

    Attributes:
        table: the table's URI (Delta) or name (Iceberg).
        version: the new Delta version, or the new Iceberg snapshot id.
        files_added: data files added (paths relative to the table's data root).
        files_removed: data files the commit removed (overwrite), as the table names them.
        rows: rows added.
        bytes: bytes of the files added.
    """

    table: str
    version: int
    files_added: list[str] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0


def write_delta(
    frame: Any,
    table: Any,
    mode: str = "append",
    partition_by: list[str] | str | None = None,
    predicate: str | None = None,
    schema_mode: str | None = None,
    storage_options: dict[str, str] | None = None,
    partition_overwrite_mode: str = "static",
    *,
    replacing: list[dict] | None = None,
) -> TableCommit:
    """Run ``frame``'s query and commit its rows into the Delta table ``table``.

    See :meth:`distfusion.context.DistributedDataFrame.write_delta`.
    ``replacing`` (with ``mode="overwrite"`` and a ``DeltaTable``): remove
    exactly these active files (as :func:`merge_candidates` gives them) in the
    commit instead of every file; MERGE's pruned rewrite.
    """
    dl = delta.import_deltalake()
    _check_arguments(mode, schema_mode, predicate, partition_overwrite_mode)
    uri, options = _located(frame, dl, table, storage_options)
    try:
        # a DeltaTable given is the snapshot the write reads (its conflict check starts there)
        given = isinstance(table, dl.DeltaTable)
        dt = table if given else dl.DeltaTable(uri, storage_options=options)
    except dl.exceptions.TableNotFoundError:
        dt = None
    except Exception as exc:
        msg = f"cannot load the Delta table at {uri}: {_cause(exc)}"
        raise PlanningError(object_store.redact(msg)) from None
    _check_writable(uri, dt)
    schema = file_schema(frame.schema())
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    parts = _partition_columns(uri, dt, partition_by, schema, schema_mode)
    table_schema = _checked_schema(uri, dt, schema, schema_mode, mode)
    removed: list[Any] = []
    cleanup = None  # forgets what a predicate over data columns registered
    if replacing is not None and dt is not None and mode == "overwrite":
        removed = replacing
    elif dt is not None and mode == "overwrite" and predicate is not None:
        if over_partitions_only(predicate, parts):
            removed = _files_matching(uri, dt, parts, predicate)
        else:  # copy-on-write of the files that can match: distfusion.table_write.delta_predicate
            frame, removed, cleanup = replace_where(
                frame,
                uri,
                dt,
                parts,
                predicate,
                lambda p: _files_matching(uri, dt, parts, p),
                lambda: _file_table(dt, ()).to_pylist(),
            )
            schema = file_schema(frame.schema())
    elif dt is not None and mode == "overwrite" and partition_overwrite_mode == "static":
        removed = _file_table(dt, ()).to_pylist()  # delta-rs removes them (mode "overwrite")
    # NOT NULL columns: checked on the values (files.run_job), not on the result's types
    not_null = set() if dt is None or schema_mode == "overwrite" else _not_null(dt)
    schema = not_null_columns(schema, not_null)
    spec = WriteSpec(uri.rstrip("/"), str(uuid.uuid4()), "parquet", schema, parts)
    created = _make_root(uri)
    try:
        placed = place_files(spec, run_job(frame, spec, object_store.redact(uri)))
    except BaseException:
        _remove_root(created)
        raise
    finally:
        if cleanup is not None:
            cleanup()
    try:
        check_not_null_partitions(placed, parts, not_null, object_store.redact(uri))
        if predicate is not None and dt is not None and mode == "overwrite" and cleanup is None:
            _check_written(uri, placed, parts, schema, predicate)
        adds = [_add_action(dl, p, parts, schema) for p in placed]
        if dt is not None and mode == "overwrite" and partition_overwrite_mode == "dynamic":
            types = [schema.field(c).type for c in parts]
            written = {
                tuple(map(_typed, partition_texts(p.relpath, parts).values(), types))
                for p in placed
            }
            removed = _files_in_partitions(dt, parts, written)
        version = _commit(
            dl,
            uri,
            options,
            dt,
            adds,
            removed,
            mode,
            predicate,
            partition_overwrite_mode,
            parts,
            table_schema,
            schema_mode,
            replacing is not None,
        )
    except BaseException:
        discard(spec, placed)
        _remove_root(created)
        raise
    return TableCommit(
        uri,
        version,
        [p.relpath for p in placed],
        [r["path"] for r in removed] if removed else [],
        sum(p.rows for p in placed),
        sum(p.size for p in placed),
    )


def merge_candidates(uri: str, dt: Any, predicate: str) -> tuple[list[dict], set[int], int]:
    """The active files of ``dt`` that can hold a row ``predicate`` selects (MERGE's pruning).

    Returns:
        ``(files, their indexes in dt.get_add_actions(), number of active files)``
        (see :func:`~distfusion.table_write.delta_predicate.candidate_files`).
    """
    parts = tuple(dt.metadata().partition_columns)
    files, keep = candidate_files(
        dt,
        parts,
        predicate,
        lambda p: _files_matching(uri, dt, parts, p),
        lambda: _file_table(dt, ()).to_pylist(),
    )
    return files, keep, len(_file_table(dt, ()))


def _check_arguments(mode, schema_mode, predicate, partition_overwrite_mode) -> None:
    if mode not in MODES:
        msg = f"mode must be one of {', '.join(MODES)}, got {mode!r}"
        raise ValueError(msg)
    if schema_mode not in SCHEMA_MODES:
        msg = f"schema_mode must be None, 'merge' or 'overwrite', got {schema_mode!r}"
        raise ValueError(msg)
    if schema_mode == "overwrite" and mode != "overwrite":
        msg = "schema_mode='overwrite' needs mode='overwrite' (as in deltalake.write_deltalake)"
        raise ValueError(msg)
    if partition_overwrite_mode not in PARTITION_OVERWRITE_MODES:
        msg = (
            f"partition_overwrite_mode must be 'static' or 'dynamic', "
            f"got {partition_overwrite_mode!r}"
        )
        raise ValueError(msg)
    if predicate is not None and mode != "overwrite":
        msg = "predicate needs mode='overwrite' (it says which rows the write replaces)"
        raise ValueError(msg)
    if predicate is not None and partition_overwrite_mode == "dynamic":
        msg = "give a predicate or partition_overwrite_mode='dynamic', not both"
        raise ValueError(msg)


def _check_writable(uri: str, dt: Any) -> None:
    """Refuse a table whose files this writer would name wrongly (column mapping).

    Raises:
        ValueError: the table maps columns (``delta.columnMapping.mode`` is
            ``name`` or ``id``): its files name columns by physical names and
            field ids, which these tasks do not write yet.
    """
    if dt is None:
        return
    mode = (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode not in (None, "none"):
        msg = (
            f"the Delta table at {uri} maps columns (delta.columnMapping.mode={mode}); "
            "distfusion does not write such tables yet"
        )
        raise ValueError(msg)


def _located(frame: Any, dl: Any, table: Any, storage_options) -> tuple[str, dict | None]:
    """The table's URI (a local absolute path or a URL) and delta-rs's storage options.

    A bucket gets a store for the tasks: the context's, or one made from
    ``storage_options`` (as ``register_delta`` does).
    """
    if isinstance(table, dl.DeltaTable):
        uri = table.table_uri
        options = storage_options or getattr(table, "_storage_options", None)
    else:
        uri = os.fspath(table)
        options = storage_options
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if not object_store.is_url(uri):
        return os.path.abspath(uri), None
    key = object_store.store_url(uri)
    if options and key not in frame.context.stores.registered():
        store = delta.store_from_options(uri, options)
        if store is not None:
            scheme, _, host = key.partition("://")
            frame.context.register_object_store(scheme + "://", store, host)
    frame.context._stores_for(uri)
    if options is None:
        options = delta.storage_options_for(uri)
    else:
        options = {**delta.COORDINATOR_STORAGE_OPTIONS, **options}
    return uri.rstrip("/"), options


def _partition_columns(
    uri: str, dt: Any, partition_by, schema: pa.Schema, schema_mode: str | None = None
) -> tuple[str, ...]:
    """The partition columns of the write: the table's, or (new table, new schema) the given ones.

    Raises:
        ValueError: ``partition_by`` differs from an existing table's (unless
            ``schema_mode="overwrite"``: new metadata), or names a column not
            in the result, or every column.
    """
    if dt is not None and not (schema_mode == "overwrite" and partition_by is not None):
        existing = list(dt.metadata().partition_columns)
        if partition_by is not None and list(partition_by) != existing:
            msg = (
                f"the Delta table at {uri} is partitioned by {existing}, "
                f"not by {list(partition_by)} (partition_by must match the table's)"
            )
            raise ValueError(msg)
        parts = existing
    else:
        parts = list(partition_by or [])
    missing = [c for c in parts if c not in schema.names]
    if missing:
        msg = (
            f"partition column(s) {missing} of {uri} are not columns of the result "
            f"({', '.join(schema.names)})"
        )
        raise ValueError(msg)
    if parts and len(parts) == len(schema):
        msg = f"{uri}: every column is a partition column; no column is left for the files"
        raise ValueError(msg)
    return tuple(parts)


def _not_null(dt: Any) -> set[str]:
    """The table's NOT NULL columns (top-level fields whose ``nullable`` is false)."""
    return {f.name for f in dt.schema().fields if not f.nullable}


def _delta_types(schema: Any) -> dict[str, str]:
    """Column name -> the Delta type's text (``long``, ``struct<...>``)."""
    out = {}
    for f in schema.fields:
        t = f.type
        out[f.name] = getattr(t, "type", None) or str(t)
    return out


def _checked_schema(uri: str, dt: Any, schema: pa.Schema, schema_mode, mode: str) -> pa.Schema:
    """The schema to commit; raises when the result does not fit the table.

    Raises:
        ValueError: a column missing, extra or of another type, naming it
            (unless ``schema_mode`` allows it); a type Delta lacks.
    """
    dl = delta.import_deltalake()
    try:
        ours = _delta_types(dl.Schema.from_arrow(schema))
    except Exception as exc:
        msg = f"the result's schema cannot be a Delta table's ({uri}): {exc}"
        raise ValueError(msg) from None
    if dt is None or schema_mode == "overwrite":
        return schema
    theirs = _delta_types(dt.schema())
    for name, t in ours.items():
        if name in theirs and theirs[name] != t:
            msg = (
                f"column {name!r} is {t} in the result but {theirs[name]} in the Delta table "
                f"at {uri}; cast it"
                + (" or pass schema_mode='overwrite'" if mode == "overwrite" else "")
            )
            raise ValueError(msg)
    extra = [n for n in ours if n not in theirs]
    missing = [n for n in theirs if n not in ours]
    if schema_mode == "merge":
        table_schema = pa.schema(dt.schema().to_arrow())
        return pa.schema([*table_schema, *[schema.field(n) for n in extra]])
    if extra:
        msg = (
            f"column(s) {extra} of the result are not in the Delta table at {uri} "
            f"(columns {list(theirs)}); pass schema_mode='merge' to add them"
        )
        raise ValueError(msg)
    if missing:
        msg = (
            f"column(s) {missing} of the Delta table at {uri} are missing from the result; "
            "select them (NULL if need be) or pass schema_mode='merge'"
        )
        raise ValueError(msg)
    return pa.schema(dt.schema().to_arrow())


def _make_root(uri: str) -> str | None:
    """Make a local table's directory when missing; returns it then (to remove on failure)."""
    if object_store.is_url(uri) or os.path.isdir(uri):
        return None
    os.makedirs(uri)
    return uri


def _remove_root(created: str | None) -> None:
    if created is None:
        return
    try:
        os.rmdir(created)  # only when empty
    except OSError:
        pass


def _file_table(dt: Any, parts: tuple[str, ...]) -> pa.Table:
    """The table's active files: ``path``, ``size_bytes`` and each partition column, typed."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    # the log's paths are percent-encoded; delta-rs's actions take them decoded
    paths = pa.array([unquote(p) for p in actions["path"].to_pylist()], pa.string())
    columns = {"path": paths, "size_bytes": actions["size_bytes"]}
    for c in parts:
        columns[c] = actions[f"partition.{c}"]
    return pa.table(columns)


def _files_matching(uri: str, dt: Any, parts: tuple[str, ...], predicate: str) -> list[dict]:
    """The active files ``predicate`` selects; it may name partition columns only.

    Raises:
        ValueError: ``predicate`` names a column that is not a partition
            column, or is not SQL DataFusion parses.
    """
    files = _file_table(dt, parts)
    paths = _select(files, predicate, uri, parts)
    chosen = set(paths)
    return [r for r in files.to_pylist() if r["path"] in chosen]


def _select(files: pa.Table, predicate: str, uri: str, parts: tuple[str, ...]) -> list[str]:
    ctx = SessionContext()
    ctx.register_record_batches(
        "files", [files.to_batches() or [pa.RecordBatch.from_pylist([], files.schema)]]
    )
    try:
        out = ctx.sql(f"SELECT path FROM files WHERE {predicate}").to_arrow_table()
    except Exception as exc:
        msg = (
            f"predicate {predicate!r} for the Delta table at {uri} must be SQL over its "
            f"partition columns ({', '.join(parts) or 'none: the table is not partitioned'}); "
            f"predicates over data columns are not supported yet ({str(exc).splitlines()[0]})"
        )
        raise ValueError(msg) from None
    return out["path"].to_pylist()


def _check_written(uri, placed: list[PlacedFile], parts, schema: pa.Schema, predicate) -> None:
    """Every written row must match ``predicate`` (delta-rs's rule for a predicate overwrite).

    Raises:
        ValueError: a written file's partition is outside the predicate.
    """
    if not placed:
        return
    rows = [{"path": p.relpath, **partition_texts(p.relpath, parts)} for p in placed]
    texts = pa.Table.from_pylist(rows)
    columns = {"path": texts["path"], "size_bytes": pa.array([p.size for p in placed])}
    for c in parts:
        columns[c] = texts[c].cast(pa.string()).cast(schema.field(c).type)
    ok = set(_select(pa.table(columns), predicate, uri, parts))
    outside = [r["path"] for r in rows if r["path"] not in ok]
    if outside:
        msg = (
            f"rows written to the Delta table at {uri} do not match the overwrite "
            f"predicate {predicate!r} (files {outside[:3]}); nothing was committed"
        )
        raise ValueError(msg)


def _files_in_partitions(dt: Any, parts: tuple[str, ...], written: set[tuple]) -> list[dict]:
    """Active files in one of the ``written`` partitions: a dynamic overwrite's removes.

    ``written`` holds typed values (:func:`_typed`); the log's partition values
    come typed from delta-rs, so a date, timestamp or number compares as a value.
    """
    files = _file_table(dt, parts).to_pylist()
    return [r for r in files if tuple(r[c] for c in parts) in written]


def _typed(text: str | None, type_: pa.DataType) -> Any:
    """A partition directory's value (pyarrow's Hive text) as a value of the column's type."""
    if text is None:
        return None
    try:
        return pa.array([text], pa.string()).cast(type_)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if pa.types.is_boolean(type_):
            return text == "true"
        return text


def _add_action(dl: Any, placed: PlacedFile, parts: tuple[str, ...], schema: pa.Schema) -> Any:
    data_fields = pa.schema([f for f in schema if f.name not in parts])
    return dl.transaction.AddAction(
        placed.relpath,  # delta-rs percent-encodes it for the log
        placed.size,
        partition_texts(placed.relpath, parts),
        int(time.time() * 1000),
        True,
        delta_stats(placed.metadata, data_fields),
    )


def delta_stats(metadata: Any, schema: pa.Schema) -> str:
    """A file's Delta statistics as the add action's JSON text, from its Parquet footer.

    ``{"numRecords": n, "minValues": {...}, "maxValues": {...}, "nullCount": {...}}``
    for the top-level columns (Delta protocol, "Per-file Statistics"). Minimum
    and maximum are given for integers, floats (not NaN or infinite), strings
    whose footer bounds are exact, and dates; they are left out for
    timestamps (the protocol keeps milliseconds: a truncated maximum would
    skip rows), decimals, binary, booleans and nested columns, and for any
    column a row group has no statistics for. Left out means "unknown" to a
    reader, never a wrong skip.

    Args:
        metadata: the file's ``pyarrow.parquet.FileMetaData``.
        schema: the file's Arrow schema (without the partition columns).
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    top = {f.name: f.type for f in schema}
    for i in range(metadata.num_columns):
        name = metadata.schema.column(i).path
        if name not in top:
            continue  # a nested leaf
        lo = hi = None
        count = 0
        counted = True  # every row group has statistics
        bounded = True
        for g in range(metadata.num_row_groups):
            st = metadata.row_group(g).column(i).statistics
            if st is None:
                bounded = False
                counted = False
                break
            count += st.null_count or 0
            if not st.has_min_max:
                if st.num_values:
                    bounded = False
                continue
            if not (
                getattr(st, "is_min_value_exact", True) and getattr(st, "is_max_value_exact", True)
            ):
                bounded = False
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
        if counted:
            nulls[name] = count
        if bounded and lo is not None and _bounded_type(top[name]):
            lo_v, hi_v = _json_value(lo), _json_value(hi)
            if lo_v is not None and hi_v is not None:
                mins[name], maxs[name] = lo_v, hi_v
    stats = {
        "numRecords": metadata.num_rows,
        "minValues": mins,
        "maxValues": maxs,
        "nullCount": nulls,
    }
    return json.dumps(stats)


def _bounded_type(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date32(t)
    )


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return None
    return v


def _commit(
    dl: Any,
    uri: str,
    options: dict | None,
    dt: Any,
    adds: list,
    removed: list[dict],
    mode: str,
    predicate: str | None,
    partition_overwrite_mode: str,
    parts: tuple[str, ...],
    schema: pa.Schema,
    schema_mode: str | None,
    replacing: bool = False,
) -> int:
    """Commit ``adds`` (and removes) as one transaction; the new version.

    ``schema_mode="merge"`` with new columns is two commits: delta-rs's
    write transaction keeps the table's metadata, so the columns are added
    first (``DeltaTable.alter.add_columns``), after the tasks succeeded.

    Raises:
        TableWriteError: delta-rs refused the commit (a conflicting
            concurrent commit, names the table and the version the write read).
    """
    props = dl.CommitProperties(custom_metadata={"engine": "distfusion"})
    read = None if dt is None else dt.version()
    try:
        if schema_mode == "merge" and dt is not None:
            _add_columns(dl, dt, schema)
        if dt is None:
            dl.transaction.create_table_with_add_actions(
                uri,
                dl.Schema.from_arrow(schema),
                adds,
                mode="error",
                partition_by=list(parts) or None,
                storage_options=options,
                commit_properties=props,
            )
        elif schema_mode == "overwrite":  # new metadata, removes of every file, adds: one commit
            dl.transaction.create_table_with_add_actions(
                uri,
                dl.Schema.from_arrow(schema),
                adds,
                mode="overwrite",
                partition_by=list(parts) or None,
                storage_options=options,
                commit_properties=props,
            )
        elif (
            mode == "overwrite"
            and predicate is None
            and partition_overwrite_mode == "static"
            and not replacing
        ):
            dt.create_write_transaction(
                adds, "overwrite", schema, list(parts) or None, commit_properties=props
            )
        else:
            now = int(time.time() * 1000)
            removes = [
                dl.transaction.RemoveAction(r["path"], True, now, r["size_bytes"]) for r in removed
            ]
            dt.create_write_transaction(
                [*removes, *adds],
                "append",
                schema,
                list(parts) or None,
                commit_properties=props,
            )
    except Exception as exc:
        at = "" if read is None else f" (the write read version {read})"
        msg = f"the commit to the Delta table at {uri} failed{at}: {_cause(exc)}"
        raise TableWriteError(object_store.redact(msg)) from None
    return dl.DeltaTable(uri, storage_options=options).version()


def _add_columns(dl: Any, dt: Any, schema: pa.Schema) -> None:
    """Add the columns of ``schema`` the table lacks (nullable), as one commit."""
    have = {f.name for f in dt.schema().fields}
    new = [f for f in dl.Schema.from_arrow(schema).fields if f.name not in have]
    if new:
        dt.alter.add_columns(new)


def _cause(exc: BaseException) -> str:
    """The first line of delta-rs's error (its backtrace dropped), secrets redacted."""
    lines = str(exc).strip().splitlines()
    return object_store.redact(lines[0] if lines else type(exc).__name__)
