"""IcebergTable: an Iceberg table as a feed-backed table, planned while the query runs.

::

    coordinator (pyiceberg)                           leaf task i (DataFusion)
      register_iceberg: snapshot, schema, store
      per query: WorkSharingFeedProvider
        manifest list -> delete manifests -> data      units (one data file each)
        manifests, one by one (plan_files.py)   ───>   scan(ctx, units): read_parquet
        a unit per data file as soon as its            by field id, deletes applied
        manifest is read                               (read_files.py)

The snapshot is fixed at registration (the table's current one, or the one
``snapshot_id`` / ``as_of`` selects), as :meth:`register_parquet` fixes its
files: register the table again (after ``table.refresh()``) to read newer
commits. Each query plans the snapshot again with its own filters.
"""

from __future__ import annotations

import datetime
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator

import pyarrow as pa
from datafusion import DataFrame, SessionContext

from distfusion.errors import PlanningError
from distfusion.io import object_store
from distfusion.io.iceberg.filters import to_iceberg_expression
from distfusion.io.iceberg.plan_files import ScanReport, plan_units, refusal
from distfusion.io.iceberg.read_files import Layout, scan_units
from distfusion.io.iceberg.stores import ensure_store
from distfusion.work_unit_feed.feed import FeedContext, WorkSharingFeedProvider, WorkUnitFeed
from distfusion.work_unit_feed.table import FeedTableSource
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = ["IcebergTable", "arrow_schema", "import_pyiceberg"]

_REPORTS_KEPT = 32


def import_pyiceberg():
    """The ``pyiceberg`` module.

    Raises:
        ImportError: it is not installed (says what to install).
    """
    try:
        import pyiceberg  # optional dependency
    except ImportError as exc:
        msg = (
            "reading Iceberg tables needs pyiceberg: pip install 'distfusion[iceberg]' "
            "(or pip install 'pyiceberg>=0.12')"
        )
        raise ImportError(msg) from exc
    return pyiceberg


class IcebergTable(FeedTableSource):
    """A pyiceberg ``Table``, read by distfusion (see the module docs and docs/iceberg.md).

    Made on the coordinator by
    :meth:`~distfusion.context.DistributedContext.register_iceberg`; workers
    rebuild it from :meth:`to_bytes` (the table's columns, no credentials,
    no pyiceberg needed) and read with :meth:`scan`.

    Args:
        table: a ``pyiceberg.table.Table`` from any catalog (REST, SQL, Glue,
            Hive, a ``StaticTable``).
        snapshot_id: read this snapshot (time travel) instead of the current one.
        as_of: read the snapshot current at this time: an aware ``datetime``
            (a naive one is local time, as ``datetime.timestamp()`` reads it)
            or milliseconds since the epoch.
        name: the table's name in errors (default: its catalog identifier).
        tasks: desired leaf tasks (feed partitions); None lets the task
            estimator choose (one per worker).
        buffer_units: data files each partition buffers on the coordinator
            (small: units go to whichever task asks next).

    Attributes:
        snapshot_id: the snapshot every query reads (None: the table has none).
        data_files_total: live data files in it (its summary), or None.

    Raises:
        ImportError: pyiceberg is not installed.
        PlanningError: both or an unknown ``snapshot_id`` / ``as_of``; a type
            DataFusion cannot read; the snapshot's manifest list cannot be
            read (corrupt, missing: names its URL); the snapshot has equality
            delete files (named); no object store for the table's location.
    """

    def __init__(
        self,
        table,
        snapshot_id: int | None = None,
        as_of: datetime.datetime | int | None = None,
        *,
        name: str | None = None,
        tasks: int | None = None,
        buffer_units: int = 2,
    ) -> None:
        import_pyiceberg()
        self.table = table
        self.name = name or ".".join(table.name())
        metadata = table.metadata
        self.snapshot = _snapshot(self.name, table, snapshot_id, as_of)
        self.snapshot_id = self.snapshot.snapshot_id if self.snapshot is not None else None
        iceberg_schema = metadata.schema()
        if (snapshot_id is not None or as_of is not None) and self.snapshot is not None:
            iceberg_schema = _snapshot_schema(metadata, self.snapshot)
        self.iceberg_schema = iceberg_schema
        # The planner binds filters to the metadata's current schema: the one read here.
        self.metadata = (
            metadata
            if iceberg_schema.schema_id == metadata.current_schema_id
            else metadata.model_copy(update={"current_schema_id": iceberg_schema.schema_id})
        )
        self.schema = arrow_schema(self.name, iceberg_schema)
        self.layout = Layout(
            self.name,
            self.schema,
            tuple(f.field_id for f in iceberg_schema.fields),
            tuple(_signature(f.field_type) for f in iceberg_schema.fields),
            _name_mapping(metadata),
        )
        try:
            ensure_store(metadata.location, dict(table.io.properties))
        except ValueError as exc:
            raise PlanningError(f"Iceberg table {self.name!r}: {exc}") from None
        summary = _summary(self.snapshot)
        self.data_files_total = _int(summary.get("total-data-files"))
        size = _int(summary.get("total-files-size"))
        self.estimated_bytes = size
        self.tasks = tasks
        self._check_snapshot(summary)
        self.feed = WorkUnitFeed(WorkSharingFeedProvider(self._discover), buffer_units)
        self._reports: OrderedDict[str, list[ScanReport]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------- coordinator
    def _check_snapshot(self, summary: dict) -> None:
        """Read the manifest list now (a corrupt table fails registration), refuse equality deletes.

        Raises:
            PlanningError: see the class.
        """
        if self.snapshot is None:
            return
        try:
            manifests = list(self.snapshot.manifests(self.table.io))
        except Exception as exc:
            msg = (
                f"Iceberg table {self.name!r}: cannot read the manifest list "
                f"{self.snapshot.manifest_list} of snapshot {self.snapshot_id}: "
                f"{type(exc).__name__}: {str(exc)[:300]} (the table's metadata is corrupt "
                "or its files were removed)"
            )
            raise PlanningError(msg) from None
        deletion_vectors = self.metadata.format_version >= 3 and _int(
            summary.get("total-position-deletes")
        )
        if _int(summary.get("total-equality-deletes")) or deletion_vectors:
            self._refuse_unreadable_deletes(manifests)

    def _refuse_unreadable_deletes(self, manifests: list) -> None:
        """Raise when a delete manifest holds equality deletes or deletion vectors (named)."""
        from pyiceberg.manifest import (  # optional dependency
            DataFileContent,
            FileFormat,
            ManifestContent,
        )

        found: dict[str, list[str]] = {}
        for m in manifests:
            if m.content != ManifestContent.DELETES:
                continue
            try:
                entries = m.fetch_manifest_entry(self.table.io, discard_deleted=True)
            except Exception as exc:
                msg = (
                    f"Iceberg table {self.name!r}: cannot read manifest {m.manifest_path}: "
                    f"{type(exc).__name__}: {str(exc)[:300]}"
                )
                raise PlanningError(msg) from None
            for e in entries:
                f = e.data_file
                if f.content == DataFileContent.EQUALITY_DELETES:
                    found.setdefault("equality delete files", []).append(f.file_path)
                elif f.file_format != FileFormat.PARQUET:
                    found.setdefault(f"{f.file_format.name} delete files", []).append(f.file_path)
        if found:
            raise PlanningError(refusal(self.name, found))

    def _discover(self, ctx: FeedContext) -> Iterator[WorkUnit]:
        """One query's planning (every partition of the leaf stage takes units from it)."""
        filters = tuple(getattr(ctx, "filters", None) or ())
        expr = to_iceberg_expression(filters, self.iceberg_schema)
        report = ScanReport(ctx.query_id, self.snapshot_id, str(expr), self.data_files_total)
        with self._lock:
            self._reports.setdefault(ctx.query_id, []).append(report)
            self._reports.move_to_end(ctx.query_id)
            while len(self._reports) > _REPORTS_KEPT:
                self._reports.popitem(last=False)
        yield from plan_units(
            self.metadata,
            self.table.io,
            self.snapshot,
            expr,
            self.name,
            report,
            lambda: ctx.cancelled,
        )

    def reports(self, query_id: str | None = None) -> list[ScanReport]:
        """What planning did in query ``query_id`` (default: the last one that read the table).

        Returns:
            One :class:`~distfusion.io.iceberg.plan_files.ScanReport` per read of
            the table in the query (a self-join reads it twice); empty when
            no query planned it. Updated while planning runs (``finished``).
        """
        with self._lock:
            if not self._reports:
                return []
            key = query_id if query_id is not None else next(reversed(self._reports))
            return list(self._reports.get(key, []))

    def describe_run(self, query_id: str | None = None) -> str:
        """``explain()``'s line: "Iceberg snapshot S: planned N of M data files ..." per read."""
        return "; ".join(r.describe() for r in self.reports(query_id))

    # ------------------------------------------------------------- workers
    def scan(self, ctx: SessionContext, units: list[WorkUnit]) -> DataFrame:
        """The rows of ``units`` (data files) as the table: native reads, deletes applied.

        See :mod:`distfusion.io.iceberg.read_files`.

        Raises:
            FileNotFoundError: a data or delete file was removed after planning (named).
            ValueError: a file's columns cannot be matched to the table's (named).
            Exception: DataFusion's or pyarrow's error reading a file.
        """
        return scan_units(ctx, self.layout, units)

    def read(self, unit: WorkUnit) -> pa.RecordBatchReader:
        """One data file as batches (tasks use :meth:`scan`; this is for other callers).

        Raises:
            As :meth:`scan`.
        """
        ctx = SessionContext()
        object_store.add_to(ctx)
        table = self.scan(ctx, [unit]).to_arrow_table()
        return pa.RecordBatchReader.from_batches(self.schema, table.to_batches())

    def to_bytes(self) -> bytes:
        """The table's columns (names, field ids, nested fields, name mapping): no credentials."""
        return json.dumps(self.layout.to_json()).encode()

    @classmethod
    def from_bytes(cls, data: bytes, schema: pa.Schema) -> IcebergTable:
        """A reader of the table's files on a worker (no pyiceberg table, no feed)."""
        source = cls.__new__(cls)
        source.schema = schema
        source.layout = Layout.from_json(json.loads(data), schema)
        source.name = source.layout.table
        return source

    def __repr__(self) -> str:
        return f"IcebergTable({self.name}, snapshot {getattr(self, 'snapshot_id', None)})"


# ---------------------------------------------------------------------- helpers
def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _summary(snapshot) -> dict[str, str]:
    """The snapshot's summary properties (``total-data-files``, ...); empty without one."""
    summary = getattr(snapshot, "summary", None)
    if summary is None:
        return {}
    return {k: summary[k] for k in getattr(summary, "_additional_properties", {})}


def _snapshot(name: str, table, snapshot_id: int | None, as_of):
    """The snapshot to read (None: the table has no snapshot yet).

    Raises:
        PlanningError: both arguments, an unknown id, or no snapshot at ``as_of``.
    """
    if snapshot_id is not None and as_of is not None:
        msg = f"Iceberg table {name!r}: give snapshot_id or as_of, not both"
        raise PlanningError(msg)
    if snapshot_id is not None:
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            known = [s.snapshot_id for s in table.metadata.snapshots][-10:]
            msg = f"Iceberg table {name!r} has no snapshot {snapshot_id} (its last ones: {known})"
            raise PlanningError(msg)
        return snapshot
    if as_of is not None:
        if isinstance(as_of, datetime.datetime):
            ms = int(as_of.timestamp() * 1000)
        elif isinstance(as_of, int) and not isinstance(as_of, bool):
            ms = as_of
        else:
            msg = f"as_of takes a datetime or milliseconds since the epoch, got {as_of!r}"
            raise PlanningError(msg)
        snapshot = table.snapshot_as_of_timestamp(ms)
        if snapshot is None:
            msg = f"Iceberg table {name!r} has no snapshot at or before {as_of!r} ({ms} ms)"
            raise PlanningError(msg)
        return snapshot
    return table.metadata.current_snapshot()


def _snapshot_schema(metadata, snapshot):
    """The schema the snapshot was written with, as pyiceberg's time travel reads it."""
    if snapshot.schema_id is not None:
        for s in metadata.schemas:
            if s.schema_id == snapshot.schema_id:
                return s
    return metadata.schema()


def _name_mapping(metadata) -> dict[str, int] | None:
    """The table's name mapping as top-level name -> field id, or None."""
    mapping = metadata.name_mapping()
    if mapping is None:
        return None
    return {n: mf.field_id for mf in mapping for n in mf.names if mf.field_id is not None}


def _signature(t):
    """The nested field ids and names of Iceberg type ``t`` (see ``read_files.signature``)."""
    from pyiceberg import types as it  # optional dependency

    if isinstance(t, it.StructType):
        return ("struct", tuple((f.field_id, f.name, _signature(f.field_type)) for f in t.fields))
    if isinstance(t, it.ListType):
        return ("list", t.element_id, _signature(t.element_type))
    if isinstance(t, it.MapType):
        return ("map", t.key_id, _signature(t.key_type), t.value_id, _signature(t.value_type))
    return None


def arrow_schema(name: str, schema) -> pa.Schema:
    """The Arrow schema distfusion reads Iceberg ``schema`` with (as DataFusion reads Parquet).

    Every column nullable; top-level ``string``/``binary`` as views (DataFusion
    reads Parquet strings so), nested ones plain; ``uuid`` and ``fixed[L]`` as
    fixed-size binary; ``timestamptz`` in UTC.

    Raises:
        PlanningError: a type with no Arrow form DataFusion reads (named).
    """
    fields = []
    for f in schema.fields:
        try:
            t = _arrow_type(f.field_type, top=True)
        except TypeError as exc:
            msg = f"Iceberg table {name!r}: column {f.name!r}: {exc}"
            raise PlanningError(msg) from None
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def _arrow_type(t, top: bool = False) -> pa.DataType:
    from pyiceberg import types as it  # optional dependency

    simple = {
        it.BooleanType: pa.bool_(),
        it.IntegerType: pa.int32(),
        it.LongType: pa.int64(),
        it.FloatType: pa.float32(),
        it.DoubleType: pa.float64(),
        it.DateType: pa.date32(),
        it.TimeType: pa.time64("us"),
        it.TimestampType: pa.timestamp("us"),
        it.TimestamptzType: pa.timestamp("us", "UTC"),
        it.UUIDType: pa.binary(16),
    }
    for cls, arrow in simple.items():
        if isinstance(t, cls):
            return arrow
    if isinstance(t, it.StringType):
        return pa.string_view() if top else pa.string()
    if isinstance(t, it.BinaryType):
        return pa.binary_view() if top else pa.binary()
    if isinstance(t, it.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, it.FixedType):
        return pa.binary(len(t))
    ns = getattr(it, "TimestampNanoType", None)
    if ns is not None and isinstance(t, ns):
        return pa.timestamp("ns")
    nstz = getattr(it, "TimestamptzNanoType", None)
    if nstz is not None and isinstance(t, nstz):
        return pa.timestamp("ns", "UTC")
    if isinstance(t, it.StructType):
        return pa.struct(
            [pa.field(f.name, _arrow_type(f.field_type), nullable=True) for f in t.fields]
        )
    if isinstance(t, it.ListType):
        return pa.list_(pa.field("element", _arrow_type(t.element_type), nullable=True))
    if isinstance(t, it.MapType):
        return pa.map_(
            pa.field("key", _arrow_type(t.key_type), nullable=False),
            pa.field("value", _arrow_type(t.value_type), nullable=True),
        )
    msg = f"Iceberg type {t} has no Arrow type distfusion reads"
    raise TypeError(msg)
