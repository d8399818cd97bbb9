"""The data files of a table write: written by the tasks, placed, described, or discarded.

A table write (:mod:`distfusion.table_write.delta`, :mod:`distfusion.table_write.iceberg`)
runs the query as the tasks of a :class:`~distfusion.io.write.WriteSpec` job whose
``path`` is where the table keeps its data files, exactly as
:meth:`~distfusion.context.DistributedDataFrame.write_parquet` runs it (one
file per head part, written where the part runs, Hadoop's task commit: see
:mod:`distfusion.io.write`). What differs is the job commit::

    run_job        the tasks write below path/_temporary/<query>/ (a failed
                   or interrupted query: the job is aborted, nothing is left)
    place_files    every committed file moves (local: a rename; object store:
                   a server-side copy) to path/<relpath>, and its footer is
                   read (statistics for the table's log); no _SUCCESS, no
                   empty file: the table's own commit says which files exist
    (table commit) the format's library commits one transaction naming the files
    discard        the commit failed: the placed files are deleted

Placed files are invisible to the table's readers until the commit names them
(Delta and Iceberg readers never list directories).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from distfusion.coordinator.checks import check_coordinator_reads, check_open
from distfusion.errors import DistfusionError, PlanningError
from distfusion.io import object_store
from distfusion.io.write import FileCommitter, WriteSpec, WrittenFile

__all__ = [
    "HIVE_NULL",
    "PlacedFile",
    "TableWriteError",
    "discard",
    "check_not_null_partitions",
    "not_null_columns",
    "partition_texts",
    "place_files",
    "run_job",
]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The directory name pyarrow's Hive partitioning gives a NULL partition value."""

_NOT_NULL = re.compile(r"Column '([^']*)' is declared non-nullable but contains nulls")
"""pyarrow's writers' error for a NULL in a non-nullable field of the batch they write."""


class TableWriteError(DistfusionError):
    """A table write could not commit (a conflict, a refused commit); nothing was committed."""


@dataclass(frozen=True)
class PlacedFile:
    """A data file in its final place, not yet part of the table.

    Attributes:
        relpath: the path below the job's ``path``, ``/``-separated, as
            written (Hive directories hold pyarrow's URI-encoded values).
        location: the absolute local path or the object's URL.
        size: bytes.
        rows: rows.
        metadata: its Parquet footer.
    """

    relpath: str
    location: str
    size: int
    rows: int
    metadata: Any


def run_job(frame: Any, spec: WriteSpec, table: str = "") -> list[list[WrittenFile]]:
    """Run ``frame``'s query as the tasks of ``spec``'s job; each task's committed files.

    **NOT NULL columns.** A column of ``spec.schema`` that is not nullable (a
    table's required / NOT NULL column, :func:`not_null_columns`) is checked
    on the data, as Spark's ANSI store assignment and Delta's NOT NULL
    constraint do: the query's column may be typed nullable, but a task whose
    batch holds a NULL there fails (pyarrow's Parquet writer verifies each
    batch against the schema's nullability) and the job writes nothing.
    Partition columns are not in the files: :func:`check_not_null_partitions`
    checks them on the placed files.

    Args:
        frame: a :class:`~distfusion.context.DistributedDataFrame`.
        spec: the job; ``spec.path`` is where the table's data files go.
        table: the table's name for the error messages.

    Returns:
        By task, the files it committed below ``path/_temporary/<query>/``.

    Raises:
        ContextClosedError: the frame's context is closed.
        PlanningError: the statement returns no columns; a coordinator-only
            query reads a table only tasks can read.
        TableWriteError: a NULL reached a NOT NULL column (names the
            table and the column); no file of the job remains.
        TaskError, TransportError: a task failed or a worker was lost (also
            KeyboardInterrupt): the job is aborted first, so no file of it
            remains.
    """
    check_open(frame.context.closed, frame.context._runtime)
    if not frame._is_query():
        msg = "the statement returns no columns (DDL): there is nothing to write"
        raise PlanningError(msg)
    reason = frame.coordinator_only()
    if reason is not None:
        check_coordinator_reads(
            frame.df, frame.context.sources, reason, frame.context._not_on_coordinator
        )
    committer = FileCommitter(spec, "overwrite")
    if not spec.remote:
        os.makedirs(spec.job_dir, exist_ok=True)
    try:
        return frame._write_tasks(spec, reason)
    except BaseException as exc:
        committer.abort_job()
        bad = _NOT_NULL.search(str(exc)) if isinstance(exc, Exception) else None
        if bad is None:
            raise
        msg = _not_null_message(table, bad.group(1))
        raise TableWriteError(msg) from exc


def not_null_columns(schema: pa.Schema, columns: set[str]) -> pa.Schema:
    """``schema`` (Arrow) with the fields named in ``columns`` not nullable.

    The write schema of a table with NOT NULL (required) columns: the query's
    columns are typed nullable (an outer join's, a literal's), the table's
    are not; the tasks check the values (:func:`run_job`).
    """
    return pa.schema([f.with_nullable(False) if f.name in columns else f for f in schema])


def check_not_null_partitions(
    placed: list[PlacedFile], parts: tuple[str, ...], columns: set[str], table: str
) -> None:
    """A placed file below a NULL partition directory of a NOT NULL column fails the write.

    Raises:
        TableWriteError: names the table and the column (the caller discards the files).
    """
    checked = [c for c in parts if c in columns]
    if not checked:
        return
    for p in placed:
        for c, text in partition_texts(p.relpath, tuple(checked)).items():
            if text is None:
                raise TableWriteError(_not_null_message(table, c))


def _not_null_message(table: str, column: str) -> str:
    return (
        f"a NULL value reached the NOT NULL column {column!r} of the table {table}; "
        "nothing was written"
    )


def place_files(
    spec: WriteSpec,
    tasks: list[list[WrittenFile]],
    rename: Callable[[str], str] | None = None,
) -> list[PlacedFile]:
    """Move the committed files of ``tasks`` to ``spec.path``, read their footers.

    ``rename`` maps a file's path as written (below ``spec.path``) to the one
    it takes there (Iceberg: its partition's directory); default: the same.

    Local disk: a rename per file; an object store: a copy on the server per
    file, then one footer read (a range request) per file, in parallel. The
    job's temporary directory is deleted afterwards, and on failure together
    with every file already moved.

    Returns:
        The placed files, in task order.

    Raises:
        OSError: a move, copy or footer read failed (nothing is left behind).
    """
    committer = FileCommitter(spec, "overwrite")
    rename = rename or (lambda relpath: relpath)
    moved: list[str] = []
    try:
        if spec.remote:
            base = spec.path.rstrip("/")
            files = [f for files in tasks for f in files]
            rels = [rename(f.relpath) for f in files]
            for f, rel in zip(files, rels, strict=True):
                url = f"{base}/{rel}"
                object_store.copy_object(f.staged, url)
                moved.append(url)
            sizes = object_store.object_sizes(moved)
            footers = object_store.read_parquet_metadata_all(list(zip(moved, sizes, strict=True)))
            placed = [
                PlacedFile(rel, u, s, m.num_rows, m)
                for rel, u, s, m in zip(rels, moved, sizes, footers, strict=True)
            ]
        else:
            placed = []
            for task, files in enumerate(tasks):
                for f in files:
                    src = os.path.join(spec.task_dir(task), f.relpath)
                    rel = rename(f.relpath.replace(os.sep, "/"))
                    dst = os.path.join(spec.path, *rel.split("/"))
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    os.replace(src, dst)
                    moved.append(dst)
                    md = pq.read_metadata(dst)
                    placed.append(PlacedFile(rel, dst, os.path.getsize(dst), md.num_rows, md))
    except BaseException:
        _delete(moved, spec.path)
        committer.abort_job()
        raise
    committer.abort_job()  # the temporary directory, now empty of committed files
    return placed


def discard(spec: WriteSpec, placed: list[PlacedFile]) -> None:
    """Delete ``placed`` files (their table commit failed), and directories left empty."""
    _delete([p.location for p in placed], spec.path)


def _delete(locations: list[str], root: str) -> None:
    if not locations:
        return
    if object_store.is_url(locations[0]):
        object_store.delete_objects(locations)
        return
    for loc in locations:
        try:
            os.remove(loc)
        except FileNotFoundError:
            pass
        parent = os.path.dirname(loc)
        while os.path.abspath(parent) != os.path.abspath(root) and parent.startswith(root):
            try:
                os.rmdir(parent)  # only when empty
            except OSError:
                break
            parent = os.path.dirname(parent)


def partition_texts(relpath: str, columns: tuple[str, ...]) -> dict[str, str | None]:
    """The partition values of a file from its Hive directories, as text (NULL: None).

    ``relpath`` is ``k1=v1/k2=v2/part-....parquet`` with pyarrow's URI-encoded
    values (:func:`~distfusion.io.write.write_task` with ``partition_by``).

    Raises:
        ValueError: a directory of ``columns`` is missing from ``relpath``.
    """
    found: dict[str, str | None] = {}
    for segment in relpath.split("/")[:-1]:
        key, sep, value = segment.partition("=")
        if sep:
            text = unquote(value)
            found[unquote(key)] = None if text == HIVE_NULL else text
    missing = [c for c in columns if c not in found]
    if missing:
        msg = f"{relpath}: no partition directory for {missing}"
        raise ValueError(msg)
    return {c: found[c] for c in columns}
