"""Reading Spark Connect DataFrames: what Spark's explanations say of them, their rows as Arrow.

A Connect DataFrame has no JVM handle (``df._jdf``): what the classic path
reads from Spark's plan objects (the optimized plan, a file relation's files
and partition columns, the plan's statistics) comes from Spark's explanations
here (``AnalyzePlan`` calls; nothing runs). :mod:`distfusion.spark` reads
catalog tables, temp views and DataFrames of a Connect session with these;
:mod:`distfusion.runtime.spark.connect` runs its jobs with :func:`collect_arrow`
and :func:`stream_arrow`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Generator
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import pyarrow as pa

__all__ = [
    "FileScan",
    "ProgressHandler",
    "collect_arrow",
    "explain_text",
    "file_scan",
    "is_connect_dataframe",
    "statistics",
    "stream_arrow",
]


def is_connect_dataframe(df) -> bool:
    """Whether ``df`` is a Spark Connect DataFrame (checked without importing its client)."""
    return type(df).__module__.startswith("pyspark.sql.connect")


def explain_text(df, mode: str = "extended") -> str:
    """Spark's explanation of Connect DataFrame ``df`` in ``mode``, as ``df.explain`` prints it.

    One ``AnalyzePlan`` call to the server; nothing runs. ``mode``: ``simple``,
    ``extended``, ``cost``, ``formatted`` (Spark's).

    Raises:
        Exception: Spark cannot analyze ``df`` (its error).
    """
    return df._explain_string(mode=mode)  # noqa: SLF001 (the Connect client's explain(), as text)


@dataclass(frozen=True)
class FileScan:
    """A Connect DataFrame that is a plain scan of Parquet files (:func:`file_scan`).

    Attributes:
        root: the table's root directory (a URI, as Spark lists it) when it is
            partitioned by directory, else None.
        partition_columns: the partition columns, in the table's order (they
            come last in its schema, as Spark's file tables put them).
    """

    root: str | None
    partition_columns: tuple[str, ...]


_RELATION = re.compile(r"^Relation\b.*\]\s+(\w+)(?:,\s+Statistics\(.*\))?$")
_READ_SCHEMA = re.compile(r"^ReadSchema: struct<(.*)>$", re.MULTILINE)
_LOCATION = re.compile(r"^Location: \w+ \[(.*)\]$", re.MULTILINE)
_STATISTICS = re.compile(r"Statistics\(sizeInBytes=([\d.]+)\s*([KMGTPE]i)?B(?:, rowCount=(\d+))?")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def _section(text: str, title: str) -> str:
    """The part of an explanation under ``== title ==``, up to the next heading."""
    found = re.search(rf"== {re.escape(title)} ==\n(.*?)(?=\n== |\Z)", text, re.DOTALL)
    return found.group(1) if found else ""


def _top_level_names(struct: str) -> list[str]:
    """The field names of a ``struct<a:bigint,`b c`:string,...>`` body (Spark's catalog string)."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(struct + ","):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            field = struct[start:i]
            if field.startswith("`"):
                names.append(field[1:].split("`:", 1)[0].replace("``", "`"))
            else:
                names.append(field.split(":", 1)[0])
            start = i + 1
    return names


def file_scan(df) -> FileScan | None:
    """How Connect DataFrame ``df`` reads files, when its optimized plan is a plain Parquet scan.

    A Connect DataFrame has no JVM handle: Spark's explanations say what the
    classic path reads from the plan's objects. The optimized logical plan
    must be one ``Relation [...] parquet`` line (a temp view or a catalog
    table over Parquet files, nothing on top); the columns missing from the
    scan's ``ReadSchema`` (the ``formatted`` explanation prints it whole) are
    its partition columns, and its one root directory (``Location``) is where
    every file's ``column=value`` directories start. Two ``AnalyzePlan``
    calls, and one ``inputFiles`` call for a partitioned table; nothing runs.

    Returns:
        None when ``df`` is anything else (CSV too: its options are not in the
        explanation), or the layout is not one root of ``column=value`` directories.
    """
    try:
        text = explain_text(df, "extended")
    except Exception:  # Spark cannot analyze it: read through Spark, which says why
        return None
    lines = [ln.strip() for ln in _section(text, "Optimized Logical Plan").splitlines()]
    lines = [ln for ln in lines if ln]
    found = _RELATION.match(lines[0]) if len(lines) == 1 else None
    if found is None or found.group(1).lower() != "parquet":
        return None
    try:
        scan = explain_text(df, "formatted")
    except Exception:
        return None
    read = _READ_SCHEMA.search(scan)
    location = _LOCATION.search(scan)
    if read is None or location is None:
        return None
    names = df.columns
    data = set(_top_level_names(read.group(1)))
    parts = tuple(n for n in names if n not in data)
    if not parts:
        return FileScan(None, ())
    if tuple(names[-len(parts) :]) != parts:
        return None
    files = df.inputFiles()
    if not files:
        return None
    segments = files[0].split("/")
    keys = [seg.split("=", 1)[0].lower() for seg in segments[-1 - len(parts) : -1]]
    if keys != [p.lower() for p in parts]:
        return None
    root = "/".join(segments[: -1 - len(parts)])
    if not all(f.startswith(root + "/") for f in files):
        return None
    if [_uri_path(u) for u in location.group(1).split(", ")] != [_uri_path(root)]:
        return None  # several roots, or not where the files' directories start
    return FileScan(root, parts)


def _uri_path(uri: str) -> tuple[str, str]:
    """``(scheme, path)`` of ``uri``: ``file:/a`` and ``file:///a`` are the same."""
    parsed = urlparse(uri)
    return parsed.scheme.lower(), unquote(parsed.netloc + parsed.path).rstrip("/")


def statistics(df) -> tuple[int | None, int | None, int | None]:
    """``(partitions, sizeInBytes, rowCount)`` Spark estimates for Connect DataFrame ``df``.

    From the optimized plan's ``Statistics(...)`` in Spark's cost explanation
    (the classic path reads the same plan's statistics object). Partitions
    are not known before the DataFrame runs: None. Sizes print rounded
    (``3.3 KiB``); Spark's unknown (``Long.MaxValue``, 8.0 EiB) is None.
    """
    try:
        text = _section(explain_text(df, "cost"), "Optimized Logical Plan")
    except Exception:  # Spark's: no estimate
        return None, None, None
    found = _STATISTICS.search(text)
    if found is None:
        return None, None, None
    size = int(float(found.group(1)) * _UNITS[found.group(2)])
    rows = int(found.group(3)) if found.group(3) else None
    return None, (None if size >= 2**62 else size), rows


def collect_arrow(df) -> pa.Table:
    """Run Connect DataFrame ``df``; its rows as one Arrow table.

    The client's own call (no second round trip for the schema, which
    ``toArrow()`` makes first).
    """
    # The Connect client's own calls: pyspark has no public one returning Arrow as sent.
    client = df._session.client  # noqa: SLF001
    plan = df._plan  # noqa: SLF001
    table, _, _ = client.to_table(plan.to_proto(client), plan.observations)
    return table


def stream_arrow(df) -> Generator[pa.Table, None, None]:
    """Run Connect DataFrame ``df``; its rows as Arrow tables, as the server sends them."""
    client = df._session.client  # noqa: SLF001 (see collect_arrow)
    plan = df._plan  # noqa: SLF001
    for item in client.to_table_as_iterator(plan.to_proto(client), plan.observations):
        if isinstance(item, pa.Table):
            yield item


class ProgressHandler:
    """Registered on a Connect session (``registerProgressHandler``): progress of a runtime's jobs.

    The client calls it in the thread running a job; :meth:`running` says
    which query run (its ``operations``: Connect operation -> ``(done, tasks)``)
    that thread runs a job for.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.inflight: dict[str, int] = {}  # operation id -> tasks running now

    @contextlib.contextmanager
    def running(self, run):
        """The calling thread runs a job of query run ``run`` inside the block."""
        previous = getattr(self._local, "run", None)
        self._local.run = run
        try:
            yield
        finally:
            self._local.run = previous

    def __call__(self, stages, inflight_tasks, operation_id, done) -> None:
        """A progress report of the client: the running query's operation counts its tasks."""
        run = getattr(self._local, "run", None)
        if run is None or not operation_id:
            return
        stages = list(stages or ())
        total = sum(s.num_tasks for s in stages)
        completed = sum(s.num_completed_tasks for s in stages)
        with self._lock:
            run.operations[operation_id] = (completed, total)
            if done:
                self.inflight.pop(operation_id, None)
            else:
                self.inflight[operation_id] = inflight_tasks

    def ended(self, run) -> None:
        """``run``'s job returned, failed or was interrupted: none of its tasks runs now.

        An interrupted job's last report may still count running tasks (no
        report says it is done).
        """
        with self._lock:
            for operation_id in run.operations:
                self.inflight.pop(operation_id, None)
