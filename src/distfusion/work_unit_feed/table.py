"""Feed-backed tables: FeedTableSource (users implement it) and ListingFeed (built in).

A :class:`FeedTableSource` is a table whose work units are discovered while
the query runs. It has an Arrow :attr:`~FeedTableSource.schema`, a
:class:`~distfusion.work_unit_feed.feed.WorkUnitFeed`, a desired task count,
and ``read(unit) -> pyarrow.RecordBatchReader``, which runs on the worker.
A source may also read natively: ``scan(ctx, units) -> datafusion.DataFrame``
(:meth:`FeedTableSource.scan`, e.g. Parquet files read by DataFusion through
the task's object stores); a leaf task then registers that DataFrame as the
table instead of reading batches in Python.

How a worker gets a ``read``: in process (the local runtime) it calls the very
object registered on the coordinator. A worker in another process (Flight, a
Spark executor) rebuilds the source from its class, imported by
``module:qualname``, and the bytes of :meth:`FeedTableSource.to_bytes`
(:meth:`FeedTableSource.from_bytes`); nothing is pickled. So a source read on
another process must be a class importable there (not defined inside a
function), and must carry in ``to_bytes`` whatever ``read`` needs.
"""

from __future__ import annotations

import base64
import importlib
import io
import json
import os
import weakref
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from datafusion import DataFrame, SessionContext

from distfusion.work_unit_feed.feed import (
    FeedContext,
    WorkSharingFeedProvider,
    WorkUnitFeed,
)
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = [
    "FeedTableSource",
    "ListingFeed",
    "UNKNOWN_FEED_BYTES",
    "live_source",
    "rebuild_source",
    "source_class_path",
]

UNKNOWN_FEED_BYTES = 1024**3
"""The size the planner assumes for a feed without ``estimated_bytes`` (1 GiB): large
enough never to broadcast a feed of unknown size."""

_LIVE: weakref.WeakValueDictionary[str, FeedTableSource] = weakref.WeakValueDictionary()


class FeedTableSource:
    """A table whose work units come from a work unit feed; subclass it.

    Set in ``__init__`` (or as class attributes):

    Attributes:
        schema: the table's Arrow schema; ``read`` returns batches of it
            (columns matched by name, cast to these types).
        feed: the :class:`~distfusion.work_unit_feed.feed.WorkUnitFeed`.
        tasks: the desired task count of a leaf stage reading the table (the
            feed's partitions). The task estimator sees it
            (``TaskEstimator.feed_tasks``); None lets it choose (one task per
            worker with the default estimator). Capped by the workers.
        estimated_bytes: the table's size for broadcast decisions, bytes; None
            when unknown (:data:`UNKNOWN_FEED_BYTES`: never broadcast).

    Implement :meth:`read`, or :meth:`scan` for a native read (a task then
    never calls ``read``); override :meth:`to_bytes` / :meth:`from_bytes`
    when they need state of the instance on another process.
    """

    schema: pa.Schema
    feed: WorkUnitFeed | None = None
    tasks: int | None = None
    estimated_bytes: int | None = None

    def read(self, unit: WorkUnit) -> pa.RecordBatchReader:
        """Open ``unit`` for reading; runs inside a leaf task on a worker.

        Returns:
            A reader of the unit's rows, with :attr:`schema`'s columns.

        Raises:
            Exception: anything; the task fails with a TaskError carrying it.
        """
        raise NotImplementedError

    def scan(self, ctx: SessionContext, units: list[WorkUnit]) -> DataFrame:
        """Optional native read of ``units``: a DataFusion DataFrame over their rows.

        Runs inside a leaf task on a worker, with the task's ``SessionContext``
        (its object stores and UDFs registered). Implement it instead of
        :meth:`read` when DataFusion can read the units itself (Parquet files:
        ``ctx.read_parquet(url)``): the rows then never pass through Python,
        and DataFusion reads them in parallel, projecting and filtering as the
        task's fragment asks. The task calls it once per chunk of units that
        arrived (a fragment run per chunk), or once with every unit of its
        partition (see docs/work-unit-feeds.md); never with an empty list.

        Returns:
            A DataFrame with exactly :attr:`schema`'s column names and types, in
            order (it is registered as the table the fragment reads).

        Raises:
            Exception: anything; the task fails with a TaskError carrying it.
        """
        raise NotImplementedError

    @property
    def scans_natively(self) -> bool:
        """True when the class implements :meth:`scan` (tasks use it, not :meth:`read`)."""
        return type(self).scan is not FeedTableSource.scan

    def describe_run(self, query_id: str | None = None) -> str:
        """One line about what the feed did in query ``query_id`` (default: the last), or ``""``.

        ``explain()`` after a run prints it under the table's feed metrics
        (an Iceberg table: "planned 3 of 10 data files ..."). Called on the
        coordinator. The default says nothing.
        """
        return ""

    def to_bytes(self) -> bytes:
        """What another process needs to rebuild this source for ``read`` (default none)."""
        return b""

    @classmethod
    def from_bytes(cls, data: bytes, schema: pa.Schema) -> FeedTableSource:
        """Rebuild a source on a worker from :meth:`to_bytes` output; ``feed`` is None there.

        The default makes an instance without calling ``__init__`` and sets
        :attr:`schema`: right for sources whose ``read`` needs nothing else.
        """
        source = cls.__new__(cls)
        try:
            source.schema = schema
        except AttributeError:  # a read-only property: the class knows its schema
            pass
        return source


def source_class_path(source: FeedTableSource) -> str:
    """``module:qualname`` of ``source``'s class, as workers import it."""
    cls = type(source)
    return f"{cls.__module__}:{cls.__qualname__}"


def live_source(feed_id: str, source: FeedTableSource) -> None:
    """Remember ``source`` in this process, so in-process workers call it directly."""
    _LIVE[feed_id] = source


def rebuild_source(feed_id: str, class_path: str, state: str, schema: pa.Schema) -> FeedTableSource:
    """The feed-backed source a leaf task reads with, on any worker.

    Args:
        feed_id: the feed's UUID (the registered object is used when it lives here).
        class_path: ``module:qualname`` of the source's class.
        state: base64 of the source's :meth:`FeedTableSource.to_bytes`.
        schema: the table's schema.

    Raises:
        ImportError: the class cannot be imported on this worker (names it).
        TypeError: the class is not a FeedTableSource.
    """
    live = _LIVE.get(feed_id)
    if live is not None:
        return live
    module, _, qualname = class_path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        msg = (
            f"cannot import the feed-backed table source {class_path} on this worker: {exc} "
            "(it must be a module-level class importable where the tasks run)"
        )
        raise ImportError(msg) from exc
    if not (isinstance(obj, type) and issubclass(obj, FeedTableSource)):
        msg = f"{class_path} is not a FeedTableSource"
        raise TypeError(msg)
    return obj.from_bytes(base64.b64decode(state), schema)


def _open_input(path: str):
    """A readable binary file for a local path or a ``pyarrow.fs`` / fsspec URI."""
    if "://" not in path:
        return open(path, "rb")  # noqa: SIM115 -- the caller closes it
    try:
        filesystem, inner = pafs.FileSystem.from_uri(path)
        return filesystem.open_input_file(inner)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import fsspec  # optional: URIs pyarrow does not know

        return fsspec.open(path, "rb").open()


class ListingFeed(FeedTableSource):
    """A Parquet (or CSV) table whose files are listed page by page while the scan runs.

    ``ctx.register_feed_table("t", ListingFeed(pages))``: each query calls
    ``lister()`` on the coordinator and streams each path to a leaf task as
    soon as its page arrives. Paths of one listing go to whichever task asks
    next (:class:`~distfusion.work_unit_feed.feed.WorkSharingFeedProvider`).

    Args:
        lister: ``lister() -> Iterable[list[str]]``: pages of paths (local
            paths, or any ``pyarrow.fs`` / fsspec URI). Called once per query
            (and once at construction when ``schema`` is None).
        format: ``"parquet"`` or ``"csv"``.
        schema: the table's schema; None reads it from the first listed file
            (only the first page is listed for it).
        tasks: desired leaf tasks (see :attr:`FeedTableSource.tasks`).
        has_header: CSV files start with a header row.
        delimiter: the CSV field delimiter.
        buffer_units: paths each partition buffers on the coordinator.
        estimated_bytes: see :attr:`FeedTableSource.estimated_bytes`.

    Raises:
        ValueError: unknown ``format``, or no schema given and the first page is empty.
        OSError: the first file cannot be read for its schema.
    """

    def __init__(
        self,
        lister: Callable[[], Iterable[Iterable[str]]] | None,
        format: str = "parquet",
        schema: pa.Schema | None = None,
        tasks: int | None = None,
        *,
        has_header: bool = True,
        delimiter: str = ",",
        buffer_units: int = 2,
        estimated_bytes: int | None = None,
    ) -> None:
        if format not in ("parquet", "csv"):
            msg = f"ListingFeed format must be 'parquet' or 'csv', got {format!r}"
            raise ValueError(msg)
        self.lister = lister
        self.format = format
        self.has_header = has_header
        self.delimiter = delimiter
        self.tasks = tasks
        self.estimated_bytes = estimated_bytes
        self.feed = (
            WorkUnitFeed(WorkSharingFeedProvider(self._discover), buffer_units)
            if lister is not None
            else None
        )
        self.schema = schema if schema is not None else self._first_schema()

    def _pages(self) -> Iterable[Iterable[str]]:
        if self.lister is None:
            raise ValueError("a ListingFeed without a lister needs its schema (schema=...)")
        return self.lister()

    def _discover(self, ctx: FeedContext) -> Iterator[WorkUnit]:
        for page in self._pages():
            for path in page:
                yield WorkUnit(path=os.fspath(path))
            if ctx.cancelled:
                return

    def _first_schema(self) -> pa.Schema:
        pages = iter(self._pages())
        try:
            first = next(iter(next(pages)), None)
        except StopIteration:
            first = None
        finally:
            close = getattr(pages, "close", None)
            if close is not None:
                close()
        if first is None:
            msg = "ListingFeed: no schema given and the first page lists no file"
            raise ValueError(msg)
        if self.format == "parquet":
            with _open_input(os.fspath(first)) as f:
                return pq.read_schema(f)
        return self._csv_reader(os.fspath(first)).schema

    def _csv_reader(self, path: str, schema: pa.Schema | None = None) -> pa.RecordBatchReader:
        f = _open_input(path)
        data = f.read()
        f.close()
        read = pcsv.ReadOptions(autogenerate_column_names=not self.has_header)
        if schema is not None and not self.has_header:
            read = pcsv.ReadOptions(column_names=schema.names)
        convert = pcsv.ConvertOptions(
            column_types={f.name: f.type for f in schema} if schema is not None else None
        )
        parse = pcsv.ParseOptions(delimiter=self.delimiter)
        return pcsv.open_csv(
            io.BytesIO(data), read_options=read, parse_options=parse, convert_options=convert
        )

    def read(self, unit: WorkUnit) -> pa.RecordBatchReader:
        """The file of ``unit`` (its ``path``) as batches.

        Raises:
            OSError: the file cannot be opened.
            pyarrow.ArrowInvalid: it is not a valid Parquet/CSV file.
        """
        if self.format == "csv":
            return self._csv_reader(unit.path, self.schema)
        f = _open_input(unit.path)
        pf = pq.ParquetFile(f)

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from pf.iter_batches(columns=self.schema.names)
            finally:
                f.close()

        file_schema = pf.schema_arrow
        schema = pa.schema([file_schema.field(n) for n in self.schema.names])
        return pa.RecordBatchReader.from_batches(schema, batches())

    def to_bytes(self) -> bytes:
        """Format and CSV options (all a worker needs to read a listed file)."""
        return json.dumps(
            {"format": self.format, "has_header": self.has_header, "delimiter": self.delimiter}
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, schema: pa.Schema) -> ListingFeed:
        """A ListingFeed reading files like the coordinator's (no lister, no feed)."""
        d = json.loads(data)
        return cls(None, d["format"], schema, has_header=d["has_header"], delimiter=d["delimiter"])

    def __repr__(self) -> str:
        return f"ListingFeed({self.format}, tasks={self.tasks})"
