"""Writing a query result as files, one per task, with a safe commit.

Used by :meth:`DistributedDataFrame.write_parquet`,
:meth:`~DistributedDataFrame.write_csv` and
:meth:`~DistributedDataFrame.write_json`. Every part of the head stage
(:mod:`distfusion.worker.head_parts`) writes its rows where it runs (a Spark
executor, a worker thread), and the files appear in the output directory only
when the whole job succeeded. The protocol is the one of Hadoop's
``FileOutputCommitter`` (algorithm 1), which Spark's file writes use::

    setup job     path/ must be missing or empty (mode="overwrite": emptied)
    task attempt  writes path/_temporary/<query>/_attempt-<task>-<attempt id>/...
    commit task   renames its attempt directory to path/_temporary/<query>/task-<task>
                  (a rename, atomic on one file system; the first attempt to
                  commit wins, a later one deletes its own files)
    abort task    deletes its attempt directory (a killed attempt's stays until
                  the job ends)
    commit job    moves every committed task's files into path/, writes
                  path/_SUCCESS, deletes path/_temporary/<query>
    abort job     deletes path/_temporary/<query>

A failed or retried task therefore leaves no partial or duplicate file in the
output directory: only committed task directories are moved, and one per task.
The files of a job that failed never appear (``_temporary`` is removed).

**On an object store** (``s3://``, ``gs://``, ``az://``: no rename, let alone
an atomic one) the same guarantees come from the coordinator choosing each
task's attempt and ``_SUCCESS`` written last, as Hadoop's S3A committers do::

    setup job     no object below path/ (mode="overwrite": all deleted)
    task attempt  writes its files on local disk (a temporary directory),
                  uploads them to path/_temporary/<query>/_attempt-<task>-<id>/...
                  (each upload is atomic: whole or absent), returns where they are
    commit task   the one attempt whose result reached the coordinator is the
                  task's (every runtime reports one result per task); a lost
                  or duplicate attempt's uploads are never copied
    commit job    copies every committed file to path/ (on the server), then
                  writes path/_SUCCESS: a JSON manifest of the files and their
                  rows; deletes path/_temporary/<query>/
    abort job     deletes path/_temporary/<query>/

The files of a committed job appear one by one while it copies: a reader
waits for ``_SUCCESS`` (Spark's and Hive's convention), whose manifest names
exactly the job's files. A failed job leaves no file in ``path`` (only what
is below ``_temporary``, deleted by the abort).

Files are named ``part-<task, 5 digits>-<query id, 8 characters>.<ext>``;
with ``partition_by``, Hive-style ``key=value/`` directories hold
``part-<task>-<query>-<n>.parquet`` (``pyarrow.dataset.write_dataset``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from datafusion import SessionContext

from distfusion.errors import DistfusionError
from distfusion.io import object_store

__all__ = [
    "FileCommitter",
    "FORMATS",
    "OutputExistsError",
    "WriteSpec",
    "WrittenFile",
    "file_schema",
    "write_part",
    "write_task",
]

FORMATS = ("parquet", "csv", "json")
"""File formats :func:`write_task` writes (JSON: newline-delimited, DataFusion's writer)."""

TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"


class OutputExistsError(DistfusionError, FileExistsError):
    """The output directory exists and is not empty (and ``mode`` is not ``"overwrite"``)."""


@dataclass(frozen=True)
class WriteSpec:
    """What a write task writes, shipped to wherever it runs (plain data).

    Attributes:
        path: the output directory (absolute).
        query_id: names the job's temporary directory and its files.
        format: ``"parquet"``, ``"csv"`` or ``"json"``.
        schema: the result's Arrow schema (names and types of the files' columns).
        partition_by: columns written as ``key=value/`` directories.
    """

    path: str
    query_id: str
    format: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()

    @property
    def remote(self) -> bool:
        """The output is on an object store (``path`` is a URL): see the module docstring."""
        return object_store.is_url(self.path)

    @property
    def job_dir(self) -> str:
        """``path/_temporary/<query>``: every attempt and committed task of the job."""
        if self.remote:
            return f"{self.path.rstrip('/')}/{TEMPORARY}/{self.query_id}"
        return os.path.join(self.path, TEMPORARY, self.query_id)

    def task_dir(self, task: int) -> str:
        """Where task ``task``'s committed files wait for the job commit (local disk)."""
        return os.path.join(self.job_dir, f"task-{task:05d}")

    def to_json(self) -> str:
        """The spec as JSON (the schema as hex Arrow IPC), for a worker's ``write_part``."""
        return json.dumps(
            {
                "path": self.path,
                "query_id": self.query_id,
                "format": self.format,
                "schema": self.schema.serialize().to_pybytes().hex(),
                "partition_by": list(self.partition_by),
            }
        )

    @classmethod
    def from_json(cls, data: str) -> WriteSpec:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: ``data`` is not a write spec, or names a format not in :data:`FORMATS`.
        """
        try:
            d = json.loads(data)
            schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(d["schema"])))
            spec = cls(d["path"], d["query_id"], d["format"], schema, tuple(d["partition_by"]))
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"not a distfusion write spec: {exc}"
            raise ValueError(msg) from exc
        if spec.format not in FORMATS or not (
            os.path.isabs(spec.path) or object_store.is_url(spec.path)
        ):
            msg = f"write spec: format {spec.format!r} or path {spec.path!r} not accepted"
            raise ValueError(msg)
        return spec


@dataclass(frozen=True)
class WrittenFile:
    """A file a committed task wrote: its path below the output directory, its rows.

    ``staged``: on an object store, the URL where the file waits for the job
    commit (below ``_temporary``); ``""`` on a file system.
    """

    relpath: str
    rows: int
    staged: str = ""

    def to_json(self) -> dict:
        """The file as JSON-able data (``staged`` only when set)."""
        d: dict = {"relpath": self.relpath, "rows": self.rows}
        if self.staged:
            d["staged"] = self.staged
        return d

    @classmethod
    def from_json(cls, d: dict) -> WrittenFile:
        """Inverse of :meth:`to_json`.

        Raises:
            KeyError: ``relpath`` or ``rows`` is missing.
        """
        return cls(d["relpath"], d["rows"], d.get("staged", ""))


def _plain(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` as ``schema`` (:func:`file_schema`: no views, which pyarrow's writers lack)."""
    columns = [
        c if c.type == f.type else c.cast(f.type)
        for c, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def file_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with view types as plain ones: the schema of the written files."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t):
            t = pa.binary()
        fields.append(f.with_type(t))
    return pa.schema(fields)


def write_task(
    spec: WriteSpec,
    task: int,
    batches: Iterator[pa.RecordBatch],
    on_batch_written: Callable[[], None] | None = None,
) -> list[WrittenFile]:
    """Write one task's ``batches`` as files and commit the task (see the module docstring).

    Runs where the task runs. An attempt writes into a directory of its own
    (``_attempt-<task>-<random id>``); on success it is renamed to the task's
    directory. When another attempt of the task committed first, this
    attempt's files are deleted and the committed ones returned.

    Args:
        spec: the job.
        task: the task's number (the head part's index).
        batches: the task's rows (columns in ``spec.schema``'s order).
        on_batch_written: called after each batch is written (tests inject
            failures there, mid-write).

    Returns:
        The committed files of the task, paths relative to ``spec.path``
        (none when it had no row).

    Raises:
        Exception: whatever reading ``batches`` or writing raised; the
            attempt's directory is deleted first.
    """
    if spec.remote:
        return _write_task_remote(spec, task, batches, on_batch_written)
    attempt = os.path.join(spec.job_dir, f"_attempt-{task:05d}-{uuid.uuid4().hex[:12]}")
    os.makedirs(attempt, exist_ok=True)
    schema = file_schema(spec.schema)
    stem = f"part-{task:05d}-{spec.query_id[:8]}"
    try:
        _write_local(spec, schema, attempt, stem, _plain_batches(spec, batches, on_batch_written))
        files = _listed(attempt)
        committed = spec.task_dir(task)
        try:
            os.rename(attempt, committed)  # the task commit
        except OSError:
            if not os.path.isdir(committed):
                raise
            shutil.rmtree(attempt, ignore_errors=True)  # another attempt committed first
            files = _listed(committed)
    except BaseException:
        shutil.rmtree(attempt, ignore_errors=True)
        raise
    return [WrittenFile(f, _rows(os.path.join(spec.task_dir(task), f), spec.format)) for f in files]


def _plain_batches(
    spec: WriteSpec,
    batches: Iterator[pa.RecordBatch],
    on_batch_written: Callable[[], None] | None,
) -> Iterator[pa.RecordBatch]:
    schema = file_schema(spec.schema)
    for b in batches:
        if b.num_rows == 0:
            continue
        yield _plain(b, schema)
        if on_batch_written is not None:
            on_batch_written()


def _write_local(
    spec: WriteSpec, schema: pa.Schema, directory: str, stem: str, batches: Iterator
) -> None:
    """The task's files in ``directory``: one file, or Hive-style partition folders."""
    if spec.partition_by:
        _write_partitioned(spec, schema, directory, stem, batches)
    else:
        _write_file(spec.format, schema, os.path.join(directory, f"{stem}.{spec.format}"), batches)


def _write_task_remote(
    spec: WriteSpec,
    task: int,
    batches: Iterator[pa.RecordBatch],
    on_batch_written: Callable[[], None] | None,
) -> list[WrittenFile]:
    """:func:`write_task` to an object store: files made locally, uploaded below ``_temporary``.

    Nothing is left behind on failure: the local directory is removed, and
    what was uploaded is deleted (or, if this process dies first, by the job's
    commit or abort, which delete ``_temporary/<query>/``).
    """
    attempt = f"{spec.job_dir}/_attempt-{task:05d}-{uuid.uuid4().hex[:12]}"
    stem = f"part-{task:05d}-{spec.query_id[:8]}"
    local = tempfile.mkdtemp(prefix="distfusion-write-")
    uploaded: list[str] = []
    try:
        _write_local(
            spec,
            file_schema(spec.schema),
            local,
            stem,
            _plain_batches(spec, batches, on_batch_written),
        )
        out = []
        for rel in _listed(local):
            url = f"{attempt}/{rel.replace(os.sep, '/')}"
            object_store.put_file(url, os.path.join(local, rel))
            uploaded.append(url)
            out.append(
                WrittenFile(
                    rel.replace(os.sep, "/"), _rows(os.path.join(local, rel), spec.format), url
                )
            )
        return out
    except BaseException:
        try:
            object_store.delete_objects(uploaded)
        except Exception:  # the job's abort deletes _temporary/<query>/ anyway
            pass
        raise
    finally:
        shutil.rmtree(local, ignore_errors=True)


def write_part(
    spec: WriteSpec, part: int, attempt: int, batches: Iterator[pa.RecordBatch]
) -> list[WrittenFile]:
    """:func:`write_task` as a head part's function (``map_head_parts``'s ``fn``)."""
    return write_task(spec, part, batches)


def _write_file(fmt: str, schema: pa.Schema, path: str, batches: Iterator[pa.RecordBatch]) -> None:
    """Stream ``batches`` into one file at ``path``; no file when there is no batch."""
    if fmt == "json":
        _write_json(path, batches)
        return
    writer = None
    try:
        for b in batches:
            if writer is None:
                if fmt == "parquet":
                    writer = pq.ParquetWriter(path, schema)
                else:
                    writer = pcsv.CSVWriter(path, schema)
            writer.write_batch(b)
    finally:
        if writer is not None:
            writer.close()


def _write_json(path: str, batches: Iterator[pa.RecordBatch]) -> None:
    """Newline-delimited JSON, as DataFusion's ``write_json`` writes it, a batch at a time.

    DataFusion writes each batch to a file of its own (its writer's text:
    dates, timestamps, decimals, NULLs left out); lines concatenate, so the
    file is their bytes in order. No file when there is no batch.
    """
    out = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, b in enumerate(batches):
                part = os.path.join(tmp, f"{i}.json")
                SessionContext().from_arrow(b).write_json(part)
                out = out or open(path, "wb")
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
                os.remove(part)
    finally:
        if out is not None:
            out.close()


def _write_partitioned(
    spec: WriteSpec, schema: pa.Schema, attempt: str, stem: str, batches: Iterator[pa.RecordBatch]
) -> None:
    """Stream ``batches`` into Hive-style ``key=value/`` directories under ``attempt``."""
    part_schema = pa.schema([schema.field(c) for c in spec.partition_by])
    reader = pa.RecordBatchReader.from_batches(schema, batches)
    ds.write_dataset(
        reader,
        attempt,
        format=spec.format,
        partitioning=ds.partitioning(part_schema, flavor="hive"),
        basename_template=f"{stem}-{{i}}.{spec.format}",
        existing_data_behavior="overwrite_or_ignore",
        create_dir=True,
    )


def _listed(directory: str) -> list[str]:
    """Every file below ``directory``, relative to it, sorted."""
    out = []
    for root, _, files in os.walk(directory):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), directory))
    return sorted(out)


def _rows(path: str, fmt: str) -> int:
    """Rows of a written file (Parquet: its footer; CSV: not counted, -1)."""
    if fmt != "parquet":
        return -1

    return pq.ParquetFile(path).metadata.num_rows


class FileCommitter:
    """The coordinator's side of a write: set up, commit or abort the job.

    Args:
        spec: the job (its ``path`` is made absolute by the caller).
        mode: ``"error"`` (default): the directory must be missing or empty;
            ``"overwrite"``: its contents are deleted first.

    Raises:
        ValueError: ``mode`` or ``spec.format`` is unknown, or
            ``partition_by`` names a column the result lacks, or every column.
    """

    def __init__(self, spec: WriteSpec, mode: str = "error") -> None:
        if mode not in ("error", "overwrite"):
            msg = f"mode must be 'error' or 'overwrite', got {mode!r}"
            raise ValueError(msg)
        if spec.format not in FORMATS:
            msg = f"format must be one of {', '.join(FORMATS)}, got {spec.format!r}"
            raise ValueError(msg)
        missing = [c for c in spec.partition_by if c not in spec.schema.names]
        if missing:
            msg = (
                f"partition_by names {missing}, not columns of the result "
                f"({', '.join(spec.schema.names)})"
            )
            raise ValueError(msg)
        if spec.partition_by and len(spec.partition_by) == len(spec.schema):
            msg = "partition_by takes every column of the result: no column is left for the files"
            raise ValueError(msg)
        self.spec = spec
        self.mode = mode

    def setup_job(self) -> None:
        """Check (or empty, with ``overwrite``) the output directory and make the job's.

        Raises:
            OutputExistsError: the directory has files and ``mode`` is ``"error"``.
            NotADirectoryError: the path is a file.
        """
        path = self.spec.path
        if self.spec.remote:
            self._setup_remote()
            return
        if os.path.exists(path) and not os.path.isdir(path):
            msg = f"cannot write to {path!r}: it is a file, not a directory"
            raise NotADirectoryError(msg)
        if os.path.isdir(path) and os.listdir(path):
            if self.mode != "overwrite":
                msg = (
                    f"cannot write to {path!r}: the directory exists and is not empty; "
                    "pass mode='overwrite' to replace its contents, or choose another path"
                )
                raise OutputExistsError(msg)
            for name in os.listdir(path):
                full = os.path.join(path, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.remove(full)
        os.makedirs(self.spec.job_dir, exist_ok=True)

    def commit_job(self, tasks: list[list[WrittenFile]]) -> list[WrittenFile]:
        """Move every committed task's files into place, write ``_SUCCESS``; the files.

        Args:
            tasks: what each task's :func:`write_task` returned, by task.

        Returns:
            Every file of the output, paths relative to the output directory.
            A result with no row is written as one empty file (Parquet: with
            the schema; CSV: the header), so reading it back gives the columns.
        """
        spec = self.spec
        if spec.remote:
            return self._commit_remote(tasks)
        out: list[WrittenFile] = []
        for task, files in enumerate(tasks):
            for f in files:
                src = os.path.join(spec.task_dir(task), f.relpath)
                dst = os.path.join(spec.path, f.relpath)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.replace(src, dst)
                out.append(f)
        if not out:
            schema = file_schema(spec.schema)
            name = f"part-00000-{spec.query_id[:8]}.{spec.format}"
            _write_empty(spec.format, schema, os.path.join(spec.path, name))
            out.append(WrittenFile(name, 0))
        self._remove_temporary()
        with open(os.path.join(spec.path, SUCCESS), "w"):
            pass
        return out

    def abort_job(self) -> None:
        """Delete the job's temporary directory (every attempt and committed task)."""
        self._remove_temporary()

    def _setup_remote(self) -> None:
        """Object store: no object below the path, or (overwrite) every one deleted."""
        path = self.spec.path
        try:
            existing = object_store.list_prefix(path)
        except Exception as exc:  # obstore's: unreachable, refused, no bucket
            msg = f"cannot write to {path!r}: {object_store.describe(exc)}"
            raise OSError(msg) from None
        if existing and self.mode != "overwrite":
            msg = (
                f"cannot write to {path!r}: objects exist below it ({existing[0]}, ...); "
                "pass mode='overwrite' to replace them, or choose another path"
            )
            raise OutputExistsError(msg)
        object_store.delete_objects(existing)

    def _commit_remote(self, tasks: list[list[WrittenFile]]) -> list[WrittenFile]:
        """Object store: copy each task's files into place, then ``_SUCCESS`` (a manifest)."""
        spec = self.spec
        base = spec.path.rstrip("/")
        out: list[WrittenFile] = []
        for files in tasks:
            for f in files:
                object_store.copy_object(f.staged, f"{base}/{f.relpath}")
                out.append(WrittenFile(f.relpath, f.rows))
        if not out:
            name = f"part-00000-{spec.query_id[:8]}.{spec.format}"
            local = tempfile.mkdtemp(prefix="distfusion-write-")
            try:
                _write_empty(spec.format, file_schema(spec.schema), os.path.join(local, name))
                object_store.put_file(f"{base}/{name}", os.path.join(local, name))
            finally:
                shutil.rmtree(local, ignore_errors=True)
            out.append(WrittenFile(name, 0))
        self._remove_temporary()
        manifest = {"query_id": spec.query_id, "files": [f.to_json() for f in out]}
        object_store.put_bytes(f"{base}/{SUCCESS}", json.dumps(manifest).encode())
        return out

    def _remove_temporary(self) -> None:
        if self.spec.remote:
            object_store.delete_objects(object_store.list_prefix(self.spec.job_dir))
            return
        shutil.rmtree(self.spec.job_dir, ignore_errors=True)
        parent = os.path.join(self.spec.path, TEMPORARY)
        try:
            os.rmdir(parent)  # only when no other job writes here
        except OSError:
            pass


def _write_empty(fmt: str, schema: pa.Schema, path: str) -> None:
    if fmt == "json":
        open(path, "wb").close()  # no row: no line
    elif fmt == "parquet":
        pq.write_table(schema.empty_table(), path)
    else:
        pcsv.write_csv(schema.empty_table(), path)
