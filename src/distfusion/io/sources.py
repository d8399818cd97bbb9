"""Table sources: registered tables described as work units.

A :class:`TableSource` is what the coordinator knows of a registered table: its
Arrow schema, its format and its work units (one per Parquet or CSV file, or per
in-memory record batch). Leaf tasks receive a share of the units and register
just that share under the table's name (:func:`register_scan`), so the same
Substrait ``ReadRel`` reads a different slice of the table in every task.

A feed-backed table (format ``"feed"``, :func:`feed_source`) has no units at
planning time: its :class:`~distfusion.work_unit_feed.WorkUnitFeed` streams
them to the leaf tasks while the query runs; only the feed's id and how to
rebuild its reader travel in the plan (``options``).

A Spark DataFrame (format ``"spark"``, :func:`spark_source`) has no units
either: Spark reads it, and each leaf task is fed the Arrow batches of one
Spark partition in the Spark task that computes that partition
(:mod:`distfusion.worker.spark_partitions`); only the Spark runtime runs it.
Feed and Spark tables are both *streamed* (:attr:`TableSource.streamed`):
read once, one partition per leaf task, never in full by several tasks.

Sizes come from the files themselves: Parquet footers give row counts and the
uncompressed bytes of every column chunk (used by the task estimator and the
broadcast decision); CSV gives only its file size. A lakehouse table
(:mod:`distfusion.io.delta`) is a Parquet source whose units come from the
table's own metadata instead: row counts and per-file statistics
(:attr:`TableSource.unit_stats`) from its log, and, per file, how to read it
(:func:`file_read`): columns named otherwise in the files (column mapping),
rows deleted without rewriting the file (deletion vectors).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from datafusion import SessionConfig, SessionContext, col, lit

from distfusion.errors import PlanningError
from distfusion.io import object_store
from distfusion.work_unit_feed.table import (
    UNKNOWN_FEED_BYTES,
    FeedTableSource,
    live_source,
    source_class_path,
)
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = [
    "FEED",
    "SPARK",
    "TableSource",
    "WorkUnit",
    "parquet_source",
    "csv_source",
    "json_source",
    "memory_source",
    "feed_source",
    "spark_source",
    "sql_name",
    "FileRead",
    "file_read",
    "arrow_width",
    "read_footers",
]


def sql_name(name: str) -> str:
    """``name`` as DataFusion's ``register_*`` must be given it to register exactly ``name``.

    DataFusion parses a registered name as an SQL identifier (unquoted folds to
    lower case): a name with upper case is double-quoted. Lower-case names are
    passed as they are.
    """
    if name == name.lower() and '"' not in name and "." not in name:
        return name
    return '"' + name.replace('"', '""') + '"'


FEED = "feed"
"""The format of a table whose work units come from a work unit feed at run time."""

SPARK = "spark"
"""The format of a Spark DataFrame read through Spark, one Spark partition per leaf task."""

UNKNOWN_SPARK_BYTES = 1024**3
"""Bytes assumed for a Spark DataFrame whose plan has no size statistics (1 GiB)."""


@dataclass(frozen=True)
class TableSource:
    """A registered table: format, schema, work units and size statistics.

    Attributes:
        name: the table name used in SQL.
        format: ``"parquet"``, ``"csv"``, ``"json"`` (newline-delimited),
            ``"memory"``, ``"feed"`` or ``"spark"``.
        schema: the Arrow schema DataFusion reads the table with.
        units: the table's work units, in a stable order.
        column_bytes: uncompressed bytes per column over all units (Parquet), used
            to size projected scans; empty when unknown.
        options: format options (CSV: ``has_header``, ``delimiter``; feed:
            ``feed_id``, ``reader`` (class path), ``state`` (base64),
            ``tasks``, ``estimated_bytes``, and per stage ``chunked``;
            spark: ``dataframe_id``, ``partitions``, ``estimated_bytes``,
            ``estimated_rows``, and per stage ``chunked``; Parquet:
            ``partition_cols`` (see :func:`parquet_source`), ``file_columns``
            (a table column -> its name in every file, when they differ:
            Delta's column mapping), ``table`` (the registered name of a
            pruned read), ``all_units`` (the units before pruning) and
            ``pruned`` (how: partition values, statistics)).
        unit_stats: statistics of the units, known without reading them (a
            lakehouse table's metadata): unit path -> {column: ``(min, max,
            null_count)``}, a value None when unknown; read by the planner on
            the coordinator to skip units a filter rules out, never sent to
            workers. Empty when unknown (files listed from a store).
        key_ranges: the integer columns' value range in each Parquet file,
            from its footer: unit path -> {column: ``(min, max, null_count)``},
            a value None when a row group has no statistics. Read by the
            planner to join tables stored in key order file by file
            (:mod:`~distfusion.planner.storage_partitioned_joins`), never sent
            to workers. Empty for other formats.
    """

    name: str
    format: str
    schema: pa.Schema
    units: tuple[WorkUnit, ...]
    column_bytes: dict[str, int] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    unit_stats: dict[str, dict[str, tuple]] = field(default_factory=dict)
    key_ranges: dict[str, dict[str, tuple]] = field(default_factory=dict)

    @property
    def is_feed(self) -> bool:
        """True for a feed-backed table (units discovered at run time)."""
        return self.format == FEED

    @property
    def is_spark(self) -> bool:
        """True for a Spark DataFrame read through Spark (only the Spark runtime runs it)."""
        return self.format == SPARK

    @property
    def streamed(self) -> bool:
        """True when the rows reach each leaf task at run time, one partition per task.

        A feed or a Spark DataFrame: no units at planning time, a task count
        the source decides, never read in full by several tasks (no broadcast
        scan), and a fragment linear in it may run per chunk of its rows.
        """
        return self.format in (FEED, SPARK)

    @property
    def remote(self) -> bool:
        """True when the table's files are on an object store (``s3://...`` units)."""
        return any(object_store.is_url(u.path) for u in self.units[:1])

    @property
    def num_rows(self) -> int | None:
        """Total rows, or None when a unit's count is unknown (always for a feed).

        A Spark DataFrame: the row count of Spark's plan statistics, when it has one.
        """
        if self.is_spark:
            rows = self.options.get("estimated_rows")
            return None if rows is None else int(rows)
        if self.is_feed:
            return None
        if any(u.num_rows is None for u in self.units):
            return None
        return sum(u.num_rows for u in self.units)  # type: ignore[misc]

    @property
    def size_bytes(self) -> int:
        """Total bytes to scan over all units (a feed or Spark table: its estimate, or 1 GiB)."""
        if self.streamed:
            est = self.options.get("estimated_bytes")
            return UNKNOWN_FEED_BYTES if est is None else int(est)
        return sum(u.size_bytes for u in self.units)

    def projected_bytes(self, columns: list[str] | None) -> int:
        """Bytes to scan when only ``columns`` are read (all columns when None)."""
        if columns is None or not self.column_bytes:
            total = self.size_bytes
            if columns is not None and len(self.schema) > 0:
                total = total * len(columns) // len(self.schema)
            return total
        return sum(self.column_bytes.get(c, 0) for c in columns)


def list_files(path: str, extension: str) -> list[str]:
    """The ``extension`` files at ``path`` (a file, a directory searched recursively, a glob).

    ``path`` may be an object store URL (``s3://bucket/prefix/``): see
    :func:`list_sized`.

    Raises:
        PlanningError: nothing exists at ``path``, or no such file is there, or
            the object store cannot be listed.
    """
    return [f for f, _ in list_sized(path, extension)]


def list_sized(path: str, extension: str) -> list[tuple[str, int]]:
    """``(file, size in bytes)`` of the ``extension`` files at ``path``, sorted.

    A local ``path`` is a file, a directory (searched recursively) or a glob,
    its files named by absolute path. An object store URL (``s3://``,
    ``gs://``, ``az://``, ``https://``, ...) is listed through its store
    (:func:`distfusion.io.object_store.list_objects`), its files named by URL.

    Raises:
        PlanningError: nothing exists at ``path``, no such file is there, or
            the store cannot be listed (the message names the URL and the cause).
    """
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    if object_store.is_url(path):
        try:
            return object_store.list_objects(path, extension)
        except FileNotFoundError as exc:
            raise PlanningError(str(exc)) from None
        except Exception as exc:  # obstore's errors: unreachable, refused, no bucket
            msg = f"cannot list {path}: {object_store.describe(exc)}"
            raise PlanningError(msg) from None
    return [(os.path.abspath(f), os.path.getsize(f)) for f in _local_files(path, extension)]


def _local_files(path: str, extension: str) -> list[str]:
    if not object_store.is_glob(path) and not os.path.exists(path):
        msg = f"no such file or directory: {path!r}"
        raise PlanningError(msg)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "**", f"*{extension}"), recursive=True))
    else:
        files = sorted(glob.glob(path)) if object_store.is_glob(path) else [path]
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        msg = f"no {extension} files found at {path!r}"
        raise PlanningError(msg)
    return files


def sized_files(paths: list[str]) -> list[tuple[str, int]]:
    """``(file, size in bytes)`` of each of ``paths`` (local paths or object store URLs).

    Raises:
        PlanningError: a file does not exist, or its store cannot be reached.
    """
    local = [p for p in paths if not object_store.is_url(p)]
    sizes: dict[str, int] = {}
    for p in local:
        try:
            sizes[p] = os.path.getsize(p)
        except OSError as exc:
            raise PlanningError(f"cannot read {p}: {exc}") from None
    remote = [p for p in paths if object_store.is_url(p)]
    if remote:
        try:
            sizes.update(zip(remote, object_store.object_sizes(remote), strict=True))
        except Exception as exc:  # obstore's: missing, unreachable, refused
            raise PlanningError(f"cannot read {remote[0]}: {object_store.describe(exc)}") from None
    return [(p if object_store.is_url(p) else os.path.abspath(p), sizes[p]) for p in paths]


def parquet_source(
    name: str,
    path: str | os.PathLike | list[str],
    schema: pa.Schema,
    partition_cols: tuple[str, ...] = (),
) -> TableSource:
    """Describe the Parquet files at ``path`` (a file, a directory, a glob, or a list of files).

    Reads every file's footer (not its data) for row counts and column sizes.
    ``partition_cols``: the table is partitioned by directory, Hive style
    (``path/dt=2024-01-01/region=EU/part-0.parquet``): ``schema`` ends with
    these columns, which are not in the files; each file's unit carries their
    values, read from its path below ``path`` (``WorkUnit.partition_values``).

    Raises:
        PlanningError: no ``.parquet`` file at ``path``; a footer cannot be
            read; a file of a partitioned table is not below a ``col=value``
            directory for every partition column.
    """
    # Parquet's encodings (dictionary, RLE) can make a column's uncompressed size far
    # smaller than its Arrow form; sizes are never estimated below rows x Arrow width.
    row_width = sum(arrow_width(f.type) for f in schema)
    units = []
    column_bytes: dict[str, int] = {}
    key_ranges: dict[str, dict[str, tuple]] = {}
    if isinstance(path, list | tuple):
        files = sized_files(list(path))
        path = ""
    else:
        files = list_sized(os.fspath(path), ".parquet")
    for sized, md in zip(files, read_footers(name, files), strict=True):
        f = sized[0]
        size = 0
        for rg in range(md.num_row_groups):
            rgm = md.row_group(rg)
            for c in range(rgm.num_columns):
                cc = rgm.column(c)
                top = cc.path_in_schema.split(".", 1)[0]
                column_bytes[top] = column_bytes.get(top, 0) + cc.total_uncompressed_size
                size += cc.total_uncompressed_size
        size = max(size, md.num_rows * row_width)
        key_ranges[f] = _integer_ranges(md, schema, partition_cols)
        values = _partition_values(name, os.fspath(path), f, partition_cols)
        units.append(
            WorkUnit(
                path=f,
                size_bytes=size,
                num_rows=md.num_rows,
                partition_values=values,
            )
        )
    rows = sum(u.num_rows or 0 for u in units)  # every unit's is known here
    for f in schema:
        column_bytes[f.name] = max(column_bytes.get(f.name, 0), rows * arrow_width(f.type))
    options = {"partition_cols": list(partition_cols)} if partition_cols else {}
    return TableSource(
        name, "parquet", schema, tuple(units), column_bytes, options, key_ranges=key_ranges
    )


def _integer_ranges(
    md: pq.FileMetaData, schema: pa.Schema, skip: tuple[str, ...]
) -> dict[str, tuple]:
    """``{column: (min, max, null_count)}`` of ``schema``'s integer columns in a file's footer.

    Over the file's row groups; ``min`` and ``max`` are None when a row group
    with values has no statistics for the column, or the file lacks it.
    """
    wanted = {f.name for f in schema if pa.types.is_integer(f.type) and f.name not in skip}
    columns = {}
    if md.num_row_groups:
        first = md.row_group(0)
        for c in range(first.num_columns):
            top = first.column(c).path_in_schema
            if top in wanted:
                columns[top] = c
    out: dict[str, tuple] = {}
    for name in wanted:
        index = columns.get(name)
        lo = hi = None
        nulls = 0
        known = index is not None or md.num_rows == 0
        for rg in range(md.num_row_groups if index is not None else 0):
            rgm = md.row_group(rg)
            st = rgm.column(index).statistics
            if st is None or not st.has_null_count:
                known = False
                break
            nulls += st.null_count
            if st.null_count == rgm.num_rows:
                continue  # all nulls: no min or max
            if not st.has_min_max:
                known = False
                break
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
        out[name] = (lo, hi, nulls) if known else (None, None, None)
    return out


def read_footers(name: str, files: list[tuple[str, int]]) -> list[pq.FileMetaData]:
    """The Parquet footer of every ``(file, size)`` (an object store's read in parallel).

    Raises:
        PlanningError: a footer cannot be read (names the table and the file).
    """
    if files and object_store.is_url(files[0][0]):
        try:
            return object_store.read_parquet_metadata_all(files)
        except Exception as exc:
            msg = f"table {name!r}: cannot read a Parquet footer: {object_store.describe(exc)}"
            raise PlanningError(msg) from None
    out = []
    for f, _ in files:
        try:
            out.append(pq.ParquetFile(f).metadata)
        except Exception as exc:
            msg = f"table {name!r}: cannot read the Parquet footer of {f}: {exc}"
            raise PlanningError(msg) from exc
    return out


def _partition_values(
    name: str, root: str, file: str, partition_cols: tuple[str, ...]
) -> tuple[str, ...]:
    """The ``col=value`` directory values of ``file`` below ``root``, in ``partition_cols`` order.

    Values are URL-unquoted as Spark and Hive escape them (``%3A`` is ``:``).

    Raises:
        PlanningError: a partition column has no ``col=value`` directory in the path.
    """
    if not partition_cols:
        return ()
    if object_store.is_url(root):
        if object_store.is_glob(root):
            base = object_store.glob_base(root)
        else:
            base = root.rstrip("/") if not root.endswith(".parquet") else root.rsplit("/", 1)[0]
        parts = file[len(base) :].strip("/").split("/")[:-1] if file.startswith(base) else []
    else:
        base = root if os.path.isdir(root) else os.path.dirname(root)
        parts = os.path.relpath(file, base).split(os.sep)[:-1]
    found: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep and key in partition_cols and key not in found:
            found[key] = unquote(value)
    missing = [c for c in partition_cols if c not in found]
    if missing:
        msg = (
            f"table {name!r} is partitioned by {list(partition_cols)}, but {file} is not "
            f"below a {missing[0]}=<value> directory of {base}: give the table's root "
            "directory, or leave out table_partition_cols"
        )
        raise PlanningError(msg)
    return tuple(found[c] for c in partition_cols)


def arrow_width(dtype: pa.DataType) -> int:
    """Bytes per value of ``dtype`` in Arrow memory (16 for strings: a view's size)."""
    try:
        return max(1, dtype.bit_width // 8)
    except ValueError:  # variable width
        return 16


def csv_source(
    name: str,
    path: str | os.PathLike | list[str],
    schema: pa.Schema,
    has_header: bool,
    delimiter: str,
) -> TableSource:
    """Describe the CSV files at ``path`` (a file, a directory, a glob, or a list of files).

    Raises:
        PlanningError: no ``.csv`` file at ``path``; a listed file does not exist.
    """
    options = {"has_header": has_header, "delimiter": delimiter}
    return TableSource(name, "csv", schema, _file_units(path, ".csv"), {}, options)


def json_source(name: str, path: str | os.PathLike | list[str], schema: pa.Schema) -> TableSource:
    """Describe the newline-delimited JSON files at ``path`` (as :func:`csv_source`).

    ``path``: a file, a directory (its ``.json`` files), a glob, or a list of files.

    Raises:
        PlanningError: no ``.json`` file at ``path``; a listed file does not exist.
    """
    return TableSource(name, "json", schema, _file_units(path, ".json"))


def _file_units(path: str | os.PathLike | list[str], suffix: str) -> tuple[WorkUnit, ...]:
    """One work unit per file: the list given, or the ``suffix`` files listed at ``path``."""
    if isinstance(path, list | tuple):
        files = sized_files(list(path))
    else:
        files = list_sized(os.fspath(path), suffix)
    return tuple(WorkUnit(path=f, size_bytes=size) for f, size in files)


def memory_source(name: str, partitions: list[list[pa.RecordBatch]]) -> TableSource:
    """Describe in-memory record batches; each batch becomes one work unit.

    Raises:
        PlanningError: no batches, or batches whose schemas differ.
    """
    batches = [b for p in partitions for b in p]
    if not batches:
        msg = f"table {name!r}: register_record_batches needs at least one batch"
        raise PlanningError(msg)
    schema = batches[0].schema
    units = []
    for b in batches:
        if b.schema != schema:
            msg = f"table {name!r}: batch schema {b.schema} differs from {schema}"
            raise PlanningError(msg)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            w.write_batch(b)
        units.append(
            WorkUnit(size_bytes=b.nbytes, num_rows=b.num_rows, ipc=sink.getvalue().to_pybytes())
        )
    return TableSource(name, "memory", schema, tuple(units))


def feed_source(name: str, source: FeedTableSource) -> TableSource:
    """Describe a feed-backed table: its schema, the feed's id, how workers rebuild its reader.

    Raises:
        PlanningError: ``source`` has no schema or no feed, or its task count
            is below 1.
    """
    schema = getattr(source, "schema", None)
    feed = getattr(source, "feed", None)
    if not isinstance(schema, pa.Schema):
        msg = f"feed table {name!r}: its source has no Arrow schema (got {schema!r})"
        raise PlanningError(msg)
    if feed is None or not getattr(feed, "id", None):
        msg = f"feed table {name!r}: its source has no WorkUnitFeed (source.feed)"
        raise PlanningError(msg)
    tasks = getattr(source, "tasks", None)
    if tasks is not None and tasks < 1:
        msg = f"feed table {name!r}: tasks must be at least 1, got {tasks}"
        raise PlanningError(msg)
    live_source(feed.id, source)
    options = {
        "feed_id": feed.id,
        "reader": source_class_path(source),
        "state": base64.b64encode(source.to_bytes()).decode(),
        "tasks": tasks,
        "estimated_bytes": getattr(source, "estimated_bytes", None),
    }
    return TableSource(name, FEED, schema, (), {}, options)


def spark_source(
    name: str,
    schema: pa.Schema,
    dataframe_id: str,
    partitions: int | None,
    estimated_bytes: int | None,
    estimated_rows: int | None = None,
) -> TableSource:
    """Describe a Spark DataFrame that Spark reads and leaf tasks consume partition by partition.

    Args:
        name: the table name.
        schema: the Arrow schema of the DataFrame's batches as the tasks get them.
        dataframe_id: the key under which the Spark runtime finds the DataFrame
            on the driver (:func:`distfusion.runtime.spark.hold_dataframe`);
            only this id travels in plans.
        partitions: the DataFrame's Spark partitions when known without running
            it (None: decided when it runs, e.g. after an adaptive shuffle).
        estimated_bytes: Spark's ``sizeInBytes`` estimate (None: unknown, 1 GiB).
        estimated_rows: Spark's ``rowCount`` estimate, when its plan has one.

    Raises:
        PlanningError: ``partitions`` is given and below 0.
    """
    if partitions is not None and partitions < 0:
        msg = f"Spark table {name!r}: partitions must be at least 0, got {partitions}"
        raise PlanningError(msg)
    options = {
        "dataframe_id": dataframe_id,
        "partitions": partitions,
        "estimated_bytes": UNKNOWN_SPARK_BYTES if estimated_bytes is None else estimated_bytes,
        "estimated_rows": estimated_rows,
    }
    return TableSource(name, SPARK, schema, (), {}, options)


def register_scan(ctx: SessionContext, source: TableSource, units: tuple[WorkUnit, ...]) -> None:
    """Register ``source`` in ``ctx`` under its name, reading only ``units``.

    Called inside a leaf task: the Substrait ``ReadRel`` of the table then reads
    this task's share. With no unit, the table is empty with the source's schema.

    Raises:
        FileNotFoundError: a unit's file no longer exists (:func:`check_source_files`).
        ValueError: a file has fewer rows than its deletion vector covers.
        Exception: DataFusion's error when a file cannot be opened (the caller
            wraps it into a :class:`~distfusion.errors.TaskError`).
    """
    if not units:
        ctx.register_record_batches(
            sql_name(source.name), [[pa.RecordBatch.from_pylist([], schema=source.schema)]]
        )
        return
    if source.format == "memory":
        batches = []
        for u in units:
            with pa.ipc.open_stream(u.ipc) as r:
                batches.extend(r)
        ctx.register_record_batches(sql_name(source.name), [batches])
        return
    check_source_files(source, units)
    frames = []
    plain = not source.options.get("partition_cols") and not source.options.get("file_columns")
    for u in units:
        if source.format == "parquet" and plain and not u.data:
            frames.append(
                ctx.read_parquet(object_store.datafusion_url(u.path), schema=source.schema)
            )
        elif source.format == "parquet":
            frames.append(_read_parquet_unit(ctx, source, u))
        elif source.format == "json":
            frames.append(ctx.read_json(object_store.datafusion_url(u.path), schema=source.schema))
        else:
            frames.append(
                ctx.read_csv(
                    object_store.datafusion_url(u.path),
                    schema=source.schema,
                    has_header=source.options["has_header"],
                    delimiter=source.options["delimiter"],
                )
            )
    df = frames[0]
    for other in frames[1:]:
        df = df.union(other)
    ctx.register_view(sql_name(source.name), df)


def check_files_exist(table: str, paths: list[str], files_from: str | None = None) -> None:
    """Raise unless every file of ``paths`` (a table's units) exists now.

    DataFusion reads a file path that names nothing as an empty table (it
    lists it as a prefix), so a file deleted after its table was registered
    would lose its rows without a word; single-node DataFusion and Spark fail
    such a read.

    Args:
        table: the table's registered name (for the message).
        paths: the files to look up.
        files_from: where the table's files were named, when not by a listing
            at registration (which saw them all): a Delta table's are named
            by its log (``options["files_from"]``, e.g. ``"its Delta log
            (version 3)"``), which says nothing of when a file went missing.

    Raises:
        FileNotFoundError: a file is gone (names the table and up to 3 files,
            what is known of it, and how to register the table again).
        OSError: an object store refused or could not be reached (names the cause).
    """
    gone = missing_files(f"table {table!r}", paths)
    if not gone:
        return
    if files_from:
        msg = (
            f"table {table!r}: source file {listed(gone)} does not exist: {files_from} "
            "names it as one of the table's files, but it was deleted outside that log (a "
            "VACUUM that kept too little history, a delete by hand), before or after the "
            "table was registered; register the table again to read its latest version, "
            "or repair the table's log"
        )
    else:
        msg = (
            f"table {table!r}: source file {listed(gone)} no longer exists: it "
            "was removed after the table was registered; if the table's files changed on "
            "purpose, register it again (ctx.register_parquet / register_csv / register_delta) "
            "to list them anew"
        )
    raise FileNotFoundError(msg)


def check_source_files(source: TableSource, units: tuple[WorkUnit, ...]) -> None:
    """:func:`check_files_exist` for ``units`` of ``source`` (a pruned read: its table's name).

    Raises:
        FileNotFoundError, OSError: as :func:`check_files_exist`.
    """
    check_files_exist(
        source.options.get("table", source.name),
        [u.path for u in units],
        source.options.get("files_from"),
    )


def missing_files(what: str, paths: list[str]) -> list[str]:
    """The files of ``paths`` that do not exist now, in order (local first).

    Local files are checked with ``stat``; objects with one HEAD request each
    (:func:`distfusion.io.object_store.missing_objects`).

    Raises:
        OSError: an object store refused or could not be reached (the message
            starts with ``what``, e.g. ``table 'orders'``, and names the cause).
    """
    remote = [p for p in paths if object_store.is_url(p)]
    gone = [p for p in paths if p and p not in remote and not os.path.exists(p)]
    if remote:
        try:
            gone += object_store.missing_objects(remote)
        except Exception as exc:  # obstore's errors: unreachable, refused
            msg = f"{what}: cannot reach {remote[0]}: {object_store.describe(exc)}"
            raise OSError(msg) from None
    return gone


def listed(paths: list[str]) -> str:
    """Up to 3 of ``paths`` for an error message, and how many more there are."""
    more = f" (and {len(paths) - 3} more)" if len(paths) > 3 else ""
    return ", ".join(paths[:3]) + more


@dataclass(frozen=True)
class FileRead:
    """How one Parquet file of a lakehouse table is read, beyond its path.

    Travels in :attr:`WorkUnit.data` (JSON, :meth:`to_bytes`) of the file's
    unit; a plain file has none.

    Attributes:
        columns: table column -> the column's name in this file, for the
            columns whose name differs (Delta's column mapping by field id:
            resolved per file); None: the file has no such column, which reads
            as NULL.
        keep: the rows of the file that are live, in file order (a Delta
            deletion vector's selection vector: False for a deleted row); rows
            past its end are live. None: no row is deleted.
    """

    columns: dict[str, str | None] = field(default_factory=dict)
    keep: pa.BooleanArray | None = None

    def to_bytes(self) -> bytes:
        """The read as JSON bytes; ``keep`` as a zlib-compressed bitmap (1 bit per row)."""
        d: dict = {}
        if self.columns:
            d["columns"] = self.columns
        if self.keep is not None:
            keep = pa.concat_arrays([self.keep, pa.array([], pa.bool_())])  # offset 0
            bits = keep.buffers()[1].to_pybytes() if len(keep) else b""
            d["keep_rows"] = len(keep)
            d["keep"] = base64.b64encode(zlib.compress(bits)).decode()
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> FileRead:
        """Inverse of :meth:`to_bytes` (``b""``: a plain read).

        Raises:
            ValueError: ``raw`` is not a serialised file read.
        """
        if not raw:
            return cls()
        try:
            d = json.loads(raw)
            keep = None
            if "keep" in d:
                bits = zlib.decompress(base64.b64decode(d["keep"]))
                n = int(d["keep_rows"])
                keep = pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
            return cls(dict(d.get("columns", {})), keep)
        except (KeyError, TypeError, ValueError, zlib.error) as exc:
            msg = f"not a serialised FileRead: {exc}"
            raise ValueError(msg) from exc


def file_read(unit: WorkUnit) -> FileRead:
    """How ``unit`` (a Parquet file) is read: its :class:`FileRead` (plain when it has none).

    Raises:
        ValueError: the unit's ``data`` is not a serialised :class:`FileRead`.
    """
    return FileRead.from_bytes(unit.data)


def _read_parquet_unit(ctx: SessionContext, source: TableSource, unit: WorkUnit):
    """One Parquet file of ``source`` as a DataFrame of the table's columns.

    - partition columns (``options["partition_cols"]``) are constants: the
      unit's value text cast to the column's type, as DataFusion's listing
      table reads directory values (a None value is NULL);
    - a column named otherwise in the file (``options["file_columns"]``, the
      unit's :attr:`FileRead.columns`) is read by that name and renamed; one
      the file lacks is NULL (so is any column missing from an older file:
      DataFusion reads a file with the table's schema, as for schema
      evolution);
    - deleted rows (:attr:`FileRead.keep`) are dropped (:func:`_with_keep`).
    """
    read = file_read(unit)
    columns = {**(source.options.get("file_columns") or {}), **read.columns}
    partition_cols = source.options.get("partition_cols") or []
    values = dict(zip(partition_cols, unit.partition_values, strict=True))
    fields = []
    for f in source.schema:
        if f.name not in values and columns.get(f.name, f.name) is not None:
            fields.append(f.with_name(columns.get(f.name, f.name)))
    file_schema = pa.schema(fields)
    url = object_store.datafusion_url(unit.path)
    if read.keep is None:
        df = ctx.read_parquet(url, schema=file_schema)
    else:
        rows = _with_keep(url, unit.path, file_schema, read.keep)
        df = ctx.from_arrow(rows).filter(col(_quoted(_KEEP)))
    exprs = []
    for f in source.schema:
        if f.name in values:
            value = values[f.name]
            exprs.append(lit(value).cast(f.type).alias(f.name))
        elif columns.get(f.name, f.name) is None:
            exprs.append(lit(None).cast(f.type).alias(f.name))
        else:
            exprs.append(col(_quoted(columns.get(f.name, f.name))).alias(f.name))
    return df.select(*exprs)


def _quoted(name: str) -> str:
    """``name`` as a DataFusion column reference that keeps its case and characters."""
    return '"' + name.replace('"', '""') + '"'


_KEEP = "__distfusion_keep"
"""The column of a file's rows read with a deletion vector that says whether a row is live."""


def _with_keep(url: str, path: str, schema: pa.Schema, keep: pa.BooleanArray) -> pa.Table:
    """The rows of the Parquet file at ``url``, in file order, with a column :data:`_KEEP`.

    A deletion vector names rows by their position in the file, and
    DataFusion's Parquet scan exposes no row position; so DataFusion reads the
    whole file here, in one partition of a session of its own (no file
    splitting, no predicate: every row, in file order), and the vector becomes
    a column beside the rows, for DataFusion to filter on. The file's rows are
    held in memory (only files with deletion vectors are read so).

    Raises:
        ValueError: the file has fewer rows than ``keep`` covers (the table's
            log and its files disagree).
        Exception: DataFusion's error reading the file.
    """
    config = SessionConfig().with_target_partitions(1).with_repartition_file_scans(False)
    solo = SessionContext(config)
    object_store.add_to(solo)
    table = solo.read_parquet(url, schema=schema).to_arrow_table()
    n = table.num_rows
    if len(keep) > n:
        msg = (
            f"{path}: its deletion vector covers {len(keep)} rows but the file has {n}: "
            "the table's log and its files disagree"
        )
        raise ValueError(msg)
    if len(keep) < n:
        keep = pa.concat_arrays([keep, pa.array([True] * (n - len(keep)), pa.bool_())])
    return table.append_column(_KEEP, keep)
