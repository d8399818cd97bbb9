"""Iceberg scan planning on the coordinator, streamed: a work unit per data file, as found.

The model is Trino's Iceberg split source: the manifest list of the snapshot
is read, manifests whose partition summaries cannot match the query's
filters are skipped, and each remaining manifest is read *in turn*; every
live data file that survives partition and min/max pruning becomes a work
unit at once, so leaf tasks read the first files while later manifests are
still being read. Up to :data:`PREFETCH_MANIFESTS` manifests are read ahead
in parallel, their units released in manifest-list order.

The spec logic is pyiceberg's (0.12), used as ``DataScan.plan_files`` uses
it (``ManifestGroupPlanner``): its manifest evaluator (partition summaries),
partition evaluator (the filter projected onto each spec by
``inclusive_projection``), ``_InclusiveMetricsEvaluator`` (column bounds,
null and NaN counts), the sequence-number rule that skips delete manifests
older than every data file, its manifest reader (``_open_manifest``: live
entries only) and its ``DeleteFileIndex`` (which position delete files
apply to a data file: same partition or the exact path, and a sequence
number not older than the data file's). What pyiceberg does in one call,
:func:`plan_units` does manifest by manifest, delete manifests first (a data
file's unit must carry every delete file that applies to it).

Refused with a clear error rather than read wrong: equality delete files
and deletion vectors (Puffin) (their files named), data or delete files
that are not Parquet, a delete file listed in a data manifest or the other
way round (metadata the spec does not allow; its deletes would not be
indexed before the data files they apply to), and files on a bucket no
object store is registered for (the tasks could not read them).

A unit (:class:`~distfusion.work_unit_feed.WorkUnit`): ``path`` is the file's
URL (a local path for ``file://``), ``size_bytes`` its size, ``num_rows`` its
record count, ``data`` JSON: ``file_path`` (as the manifest names it: what
position delete files name), ``spec_id``, ``identity`` (identity partition
values by source field id: a column a file lacks reads as its value),
``deletes`` (``path``, ``size``, ``rows`` of each position delete file).
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from distfusion.io import object_store
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = ["PREFETCH_MANIFESTS", "ScanReport", "local_path", "plan_units", "refusal"]

PREFETCH_MANIFESTS = 4
"""Manifests read ahead of the one whose units are being released (in parallel)."""


@dataclass
class ScanReport:
    """What the planning of one read of an Iceberg table did (one query, one leaf stage).

    Attributes:
        query_id: the query.
        snapshot_id: the snapshot planned.
        filter: the pyiceberg expression pruning used (``AlwaysTrue()``: none).
        data_files_total: live data files in the snapshot (its summary's
            ``total-data-files``; None when the summary lacks it).
        data_files: data files planned (units streamed).
        delete_files: position delete files that apply to a planned file.
        manifests_total: manifests in the snapshot's manifest list.
        manifests_read: manifests read (the others were skipped by their
            partition summaries or sequence numbers).
        rows: record count of the planned files (before deletes).
        bytes: size of the planned files (bytes on storage).
        finished: planning ended (every manifest read), not stopped early.
    """

    query_id: str
    snapshot_id: int | None
    filter: str = "AlwaysTrue()"
    data_files_total: int | None = None
    data_files: int = 0
    delete_files: int = 0
    manifests_total: int = 0
    manifests_read: int = 0
    rows: int = 0
    bytes: int = 0
    finished: bool = False
    _deletes: set = field(default_factory=set, repr=False)

    def count_delete_file(self, path: str) -> None:
        """Count the delete file at ``path`` in :attr:`delete_files`, once however often seen."""
        if path not in self._deletes:
            self._deletes.add(path)
            self.delete_files += 1

    def describe(self) -> str:
        """One line for ``explain()``: "planned N of M data files ..."."""
        total = "?" if self.data_files_total is None else str(self.data_files_total)
        state = "" if self.finished else " (planning stopped early)"
        return (
            f"Iceberg snapshot {self.snapshot_id}: planned {self.data_files} of {total} data "
            f"files ({self.rows:,} rows, {self.bytes:,} bytes), {self.delete_files} position "
            f"delete files, {self.manifests_read} of {self.manifests_total} manifests read; "
            f"pruning filter {self.filter}{state}"
        )


def local_path(path: str) -> str:
    """``path`` as the tasks read it: ``file:///x`` -> ``/x``; URLs and paths as they are."""
    parsed = urlparse(path)
    if parsed.scheme.lower() == "file":
        return unquote(parsed.path)
    return path


def _json_value(v):
    """An identity partition value as JSON (see ``read_files._partition_value``)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, uuid.UUID):
        return {"bytes": v.bytes.hex()}
    if isinstance(v, datetime.datetime):  # pyiceberg reads partition timestamps as micros
        epoch = datetime.datetime(1970, 1, 1, tzinfo=v.tzinfo)
        return (v - epoch) // datetime.timedelta(microseconds=1)
    if isinstance(v, datetime.date):
        return (v - datetime.date(1970, 1, 1)).days
    return str(v)


def _safe(evaluate: Callable, default: bool = True) -> Callable:
    """``evaluate`` that answers ``default`` ("might match") where pyiceberg raises.

    pyiceberg's evaluators decode a file's bounds with the column's current
    type; a bound written before a type promotion (4 bytes of an ``int``
    read as a ``long``) may not decode. Not pruning is always correct.
    """

    def safe(x) -> bool:
        try:
            return evaluate(x)
        except Exception:
            return default

    return safe


def _built(build: Callable, *args) -> Callable:
    """``build(*args)`` made :func:`_safe`; an evaluator that cannot be built prunes nothing."""
    try:
        return _safe(build(*args))
    except Exception:
        return lambda _x: True


class _Checked:
    """Files whose bucket has a store registered (the tasks read them through it)."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.keys: set[str] = set()

    def __call__(self, path: str) -> None:
        if not object_store.is_url(path):
            return
        key = object_store.store_url(path)
        if key in self.keys:
            return
        if key not in object_store.registered():
            msg = (
                f"Iceberg table {self.table!r}: file {path} is on {key}, which has no object "
                f"store registered (the table's location has one); register one before the "
                f"query: ctx.register_object_store({key.split('://')[0] + '://'!r}, store, "
                f"{key.split('://')[1]!r})"
            )
            raise ValueError(msg)
        self.keys.add(key)


def plan_units(
    metadata,
    io,
    snapshot,
    row_filter,
    table: str,
    report: ScanReport,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[WorkUnit]:
    """The work units of a scan of ``snapshot``, streamed manifest by manifest (see the module).

    Args:
        metadata: the table's pyiceberg ``TableMetadata`` whose current schema
            is the schema the query reads (the snapshot's for time travel:
            the filter binds to its column names).
        io: the table's pyiceberg ``FileIO`` (manifest reads).
        snapshot: the pyiceberg ``Snapshot``; None for a table without one
            (no unit).
        row_filter: the pyiceberg expression to prune with.
        table: the table's name, for errors.
        report: updated as planning goes (files, manifests, finished).
        cancelled: true once the query ended; planning stops.

    Raises:
        ValueError: an equality delete file or a deletion vector applies, a
            data or delete file is not Parquet, or a file's bucket has no
            object store (each names the files).
        OSError: a manifest list or manifest cannot be read (pyiceberg's
            error, with the manifest's URL).
    """
    from pyiceberg.manifest import (  # optional dependency
        DataFileContent,
        FileFormat,
        ManifestContent,
    )

    # pyiceberg (0.12) has no public API for one manifest's pruning and reading (no
    # public min_sequence_number, open_manifest, or ManifestGroupPlanner evaluators
    # and sequence-number check): its public plan_manifest_entries filters and reads
    # every manifest at once on its own executor, which would not stream units, stop
    # when the query is cancelled or name a manifest that cannot be read. Its private
    # steps are used one by one (the noqa comments below).
    from pyiceberg.table import (  # optional dependency
        ManifestGroupPlanner,
        _min_sequence_number,  # noqa: PLC2701 - no public min_sequence_number
        _open_manifest,  # noqa: PLC2701 - no public open_manifest
    )
    from pyiceberg.table.delete_file_index import DeleteFileIndex  # optional dependency
    from pyiceberg.typedef import KeyDefaultDict  # optional dependency

    if snapshot is None:
        report.finished = True
        return
    planner = ManifestGroupPlanner(metadata, io, row_filter, case_sensitive=True)
    try:
        manifests = list(snapshot.manifests(io))
    except Exception as exc:
        msg = f"cannot read the manifest list {snapshot.manifest_list}: {type(exc).__name__}: {exc}"
        raise OSError(msg) from exc
    report.manifests_total = len(manifests)
    manifest_evaluators: KeyDefaultDict[int, Callable] = KeyDefaultDict(
        # No public ManifestGroupPlanner.build_manifest_evaluator (above).
        lambda spec_id: _built(planner._build_manifest_evaluator, spec_id)  # noqa: SLF001
    )
    kept = [m for m in manifests if manifest_evaluators[m.partition_spec_id](m)]
    min_sequence_number = _min_sequence_number(kept)
    deletes = [
        m
        for m in kept
        if m.content == ManifestContent.DELETES
        # No public ManifestGroupPlanner.check_sequence_number (above).
        and planner._check_sequence_number(min_sequence_number, m)  # noqa: SLF001
    ]
    data = [m for m in kept if m.content == ManifestContent.DATA]
    partition_evaluators: KeyDefaultDict[int, Callable] = KeyDefaultDict(
        # No public ManifestGroupPlanner.build_partition_evaluator (above).
        lambda spec_id: _built(planner._build_partition_evaluator, spec_id)  # noqa: SLF001
    )
    # No public ManifestGroupPlanner.build_metrics_evaluator (above).
    metrics_evaluator = _built(planner._build_metrics_evaluator)  # noqa: SLF001
    specs = metadata.specs()
    checked = _Checked(table)

    def read(manifest) -> list:
        if cancelled():
            return []
        try:
            return _open_manifest(
                io,
                manifest,
                partition_evaluators[manifest.partition_spec_id],
                metrics_evaluator,
            )
        except Exception as exc:
            msg = f"cannot read manifest {manifest.manifest_path}: {type(exc).__name__}: {exc}"
            raise OSError(msg) from exc

    index = DeleteFileIndex()
    refused: dict[str, list[str]] = {}
    with _InOrder(read, PREFETCH_MANIFESTS) as reader:
        for entries in reader.results(deletes):
            report.manifests_read += 1
            for entry in entries:
                f = entry.data_file
                if f.content == DataFileContent.EQUALITY_DELETES:
                    refused.setdefault("equality delete files", []).append(f.file_path)
                elif f.file_format != FileFormat.PARQUET:
                    kind = (
                        "deletion vectors (Puffin)"
                        if f.file_format == FileFormat.PUFFIN
                        else f"{f.file_format.name} position delete files"
                    )
                    refused.setdefault(kind, []).append(f.file_path)
                elif f.content == DataFileContent.POSITION_DELETES:
                    checked(f.file_path)
                    index.add_delete_file(entry, partition_key=f.partition)
                else:
                    refused.setdefault("data files in a delete manifest", []).append(f.file_path)
        if refused:
            raise ValueError(refusal(table, refused))
        for entries in reader.results(data):
            report.manifests_read += 1
            for entry in entries:
                f = entry.data_file
                if f.content != DataFileContent.DATA:  # its deletes were not indexed first
                    refused.setdefault("delete files in a data manifest", []).append(f.file_path)
                    raise ValueError(refusal(table, refused))
                if f.file_format != FileFormat.PARQUET:
                    msg = (
                        f"Iceberg table {table!r}: data file {f.file_path} is "
                        f"{f.file_format.name}; distfusion reads Parquet data files only"
                    )
                    raise ValueError(msg)
                checked(f.file_path)
                applying = index.for_data_file(
                    entry.sequence_number or 0, f, partition_key=f.partition
                )
                yield _unit(f, applying, specs, report)
                if cancelled():
                    return
    report.finished = True


def refusal(table: str, refused: dict[str, list[str]]) -> str:
    """The error message refusing ``table`` for its delete files (kind -> files)."""
    parts = []
    for kind, files in refused.items():
        more = f" (and {len(files) - 3} more)" if len(files) > 3 else ""
        parts.append(f"{kind}: {', '.join(files[:3])}{more}")
    return (
        f"Iceberg table {table!r} has delete files distfusion cannot apply, so it refuses to "
        f"read the table rather than return deleted rows: {'; '.join(parts)}. Rewrite the "
        "table's data files to remove them (e.g. Spark's rewrite_data_files with "
        "delete-file-threshold=1, or rewrite_position_delete_files), or read a snapshot "
        "from before they were written"
    )


def _unit(f, deletes, specs, report: ScanReport) -> WorkUnit:
    """The work unit of data file ``f`` with the position delete files ``deletes``."""
    from pyiceberg.transforms import IdentityTransform  # optional dependency

    identity = {}
    spec = specs.get(f.spec_id)
    if spec is not None:
        for i, pf in enumerate(spec.fields):
            if isinstance(pf.transform, IdentityTransform) and i < len(f.partition):
                value = f.partition[i]
                if value is not None:
                    identity[str(pf.source_id)] = _json_value(value)
    info = {
        "file_path": f.file_path,
        "spec_id": f.spec_id,
        "identity": identity,
        "deletes": [
            {
                "path": local_path(d.file_path),
                "size": d.file_size_in_bytes,
                "rows": d.record_count,
            }
            for d in sorted(deletes, key=lambda d: d.file_path)
        ],
    }
    report.data_files += 1
    report.rows += f.record_count
    report.bytes += f.file_size_in_bytes
    for d in deletes:
        report.count_delete_file(d.file_path)
    return WorkUnit(
        path=local_path(f.file_path),
        size_bytes=f.file_size_in_bytes,
        num_rows=f.record_count,
        data=json.dumps(info, separators=(",", ":")).encode(),
    )


class _InOrder:
    """Reads items with ``read`` on up to ``ahead`` threads, results in the items' order.

    A context manager: leaving it cancels the reads not started yet (a
    planning stopped early waits for none of them).
    """

    def __init__(self, read: Callable, ahead: int) -> None:
        self.read = read
        self.ahead = max(1, ahead)
        self.pool = ThreadPoolExecutor(self.ahead, thread_name_prefix="distfusion-iceberg-plan")

    def results(self, items: list) -> Iterator:
        """``read(item)`` of every item, in order, reading up to ``ahead`` items in advance.

        Raises:
            Exception: what ``read`` raised for the first item that failed.
        """
        pending: list[Future] = []
        it = iter(items)
        for item in it:
            pending.append(self.pool.submit(self.read, item))
            if len(pending) >= self.ahead:
                break
        while pending:
            result = pending.pop(0).result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(self.pool.submit(self.read, nxt))
            yield result

    def __enter__(self) -> _InOrder:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
