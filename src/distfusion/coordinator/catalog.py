"""The tables registered on the coordinator: its DataFusion context and their sources.

:class:`TableCatalog` is the part of
:class:`~distfusion.context.DistributedContext` that keeps the two in step:
the object store of a path made known to DataFusion, exact lists of files
registered as a view, tables only tasks read (a Spark DataFrame, the objects
of a glob on an object store) known here as empty, sources added and
forgotten with their table. The public ``register_json`` and
``register_delta`` of the context are here too.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from distfusion.coordinator.hosts import ContextHost
from distfusion.coordinator.statements import table_name
from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.sources import (
    TableSource,
    csv_source,
    json_source,
    list_files,
    list_sized,
    parquet_source,
    register_scan,
    sized_files,
    sql_name,
)

FOOTER_THREADS = 16
"""Footers :func:`unreadable_parquet` reads at the same time."""


def check_path(name: str, path: str, extension: str) -> None:
    """Raise a clear PlanningError (naming table and path) when no file is at ``path``."""
    try:
        list_files(path, extension)
    except PlanningError as exc:
        raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from None


def unreadable_parquet(path: str | list[str]) -> tuple[str, str] | None:
    """The first Parquet file at ``path`` whose footer cannot be read, and why; None if none.

    Asked by :meth:`~distfusion.context.DistributedContext.register_parquet`
    after DataFusion refused ``path``: DataFusion's error names no file
    (``Parquet error: Invalid Parquet file. Corrupt footer``), so a directory
    holding one file that is not Parquet (named ``.parquet``) would be
    reported as the directory. Every footer is read again, :data:`FOOTER_THREADS`
    at a time, only on that failure path.

    Args:
        path: a file, a directory, a glob or an object store URL, or a list of files.

    Returns:
        ``(file, cause)``, the file as listed (an absolute path or a URL); None
        when every footer reads, or ``path`` cannot be listed (DataFusion's
        error then stands).
    """
    try:
        files = sized_files(path) if isinstance(path, list) else list_sized(path, ".parquet")
    except PlanningError:
        return None

    def cause(item: tuple[str, int]) -> str | None:
        file, size = item
        try:
            if object_store.is_url(file):
                object_store.read_parquet_metadata(file, size)
            else:
                pq.read_metadata(file)
        except Exception as exc:  # pyarrow's ArrowInvalid, obstore's, OSError
            return object_store.describe(exc)
        return None

    with ThreadPoolExecutor(min(FOOTER_THREADS, max(1, len(files)))) as pool:
        for (file, _), why in zip(files, pool.map(cause, files), strict=True):
            if why is not None:
                return file, why
    return None


def parquet_register_error(name: str, path: str | list[str], exc: Exception) -> PlanningError:
    """The error of registering Parquet ``path`` as table ``name`` after DataFusion raised ``exc``.

    Names the file that is not Parquet when there is one
    (:func:`unreadable_parquet`), and what to do; else keeps DataFusion's message.
    """
    where = f"{len(path)} files ({path[0]}, ...)" if isinstance(path, list) else repr(path)
    found = unreadable_parquet(path)
    if found is None:
        return PlanningError(f"cannot register {where} as table {name!r}: {exc}")
    file, why = found
    # object_store's message names the file too: "<url> is not a Parquet file (no PAR1 ...)"
    why = why.removeprefix(f"{file} is not a Parquet file ").removeprefix("(").removesuffix(")")
    leave_out = (
        "leave it out of the list"
        if isinstance(path, list)
        else "remove it, or register a glob or a list of the Parquet files without it"
    )
    msg = (
        f"cannot register {where} as table {name!r}: the file {file} is not Parquet: "
        f"{why.rstrip('.')}; {leave_out}"
    )
    return PlanningError(msg)


class TableCatalog(ContextHost):
    """The tables of a :class:`~distfusion.context.DistributedContext` (a mixin).

    Keeps its DataFusion ``ctx`` and its ``sources`` in step (with
    ``_file_views``, ``_held``, ``_feed_sources``, ``_not_on_coordinator``).
    """

    def register_json(
        self, name: str, path: str | os.PathLike | list, schema: pa.Schema | None = None
    ) -> None:
        """Register the newline-delimited JSON file, directory or glob at ``path`` as ``name``.

        As DataFusion's ``register_json`` (files ending ``.json``): each file
        is one work unit, read by DataFusion in the tasks. ``path`` may be an
        object store URL (a glob too) or a list of files, as for
        :meth:`register_parquet`. Without ``schema``, DataFusion infers it
        (from the first file, for a glob on an object store or a list).

        Raises:
            PlanningError: no ``.json`` file at ``path``, or DataFusion cannot
                infer a schema (the message names the path).
        """
        if isinstance(path, list | tuple):
            self._register_files(name, "json", list(path), schema)
            return
        path = self._stores_for(os.fspath(path), ".json")
        if object_store.is_url(path) and object_store.is_glob(path):
            self._register_glob(name, "json", path, schema)
            return
        check_path(name, path, ".json")
        try:
            self.ctx.register_json(name, path, schema=schema)
            table_schema = self.ctx.table(name).schema()
        except Exception as exc:
            self._forget(name)
            raise PlanningError(f"cannot register {path!r} as table {name!r}: {exc}") from exc
        self._add(json_source(name, path, table_schema))

    def register_delta(
        self,
        name: str,
        table: Any,
        version: int | None = None,
        storage_options: dict[str, str] | None = None,
        timestamp: datetime.datetime | str | None = None,
    ) -> None:
        """Register a Delta Lake table (its latest version, or one version of it) as ``name``.

        The table is read through its own log, with delta-rs (``pip install
        'distfusion[delta]'``): every active data file of the version is one
        work unit (its URL, size and row count from the log, never listed),
        read natively by DataFusion in the tasks. Partition values come from
        the log, so a filter on a partition column keeps only the matching
        files; deletion vectors and column mapping are applied, schema
        evolution reads added columns as NULL in older files
        (:mod:`distfusion.io.delta`, docs/delta.md).

        On an object store (``s3://bucket/path``), the tasks read the files
        through the store registered for the bucket
        (:meth:`register_object_store`), and delta-rs reads the log with
        ``storage_options`` made from that store unless given. A table given
        ``storage_options`` for a bucket with no store registered gets a store
        made from them (:func:`distfusion.io.delta.store_from_options`).

        Args:
            name: the table name in SQL.
            table: the table's root (a path, ``file://`` or object store URL:
                the directory holding ``_delta_log``) or a
                ``deltalake.DeltaTable``.
            version: the version to read (time travel); default the latest
                (or the ``DeltaTable``'s loaded version).
            storage_options: delta-rs's storage options (``AWS_ENDPOINT_URL``,
                ``AWS_REGION``, keys, ...) for reading the log.
            timestamp: read the version that was current at this time
                (``datetime``, naive meaning UTC, or an ISO 8601 string), as
                ``DeltaTable.load_as_version``; not with ``version``.

        Raises:
            ImportError: deltalake is not installed.
            PlanningError: ``table`` is no Delta table; the version does not
                exist or the time is before the table; the log is corrupt or
                unreachable; the table needs a reader feature distfusion does
                not apply (the message names the table, where it is and why).

        Example:
            >>> import tempfile, pyarrow as pa
            >>> from deltalake import write_deltalake
            >>> from distfusion import DistributedContext, LocalRuntime
            >>> path = tempfile.mkdtemp()
            >>> write_deltalake(path, pa.table({"x": [1, 2, 3]}))
            >>> ctx = DistributedContext(runtime=LocalRuntime())
            >>> ctx.register_delta("t", path)
            >>> ctx.sql("SELECT sum(x) AS s FROM t").to_pylist()
            [{'s': 6}]
        """
        dt = delta.load_delta(name, table, version, timestamp, storage_options)
        uri = dt.table_uri
        options = storage_options or getattr(dt, "_storage_options", None)
        if object_store.is_url(uri):
            key = object_store.store_url(uri)
            if key not in self.stores.registered() and options:
                store = delta.store_from_options(uri, options)
                if store is not None:
                    scheme, _, host = key.partition("://")
                    self.register_object_store(scheme + "://", store, host)
            self._stores_for(uri)
        self._forget(name)
        try:
            schema, unreadable = delta.register_on_coordinator(self.ctx, table_name(name), dt)
            source = delta.delta_source(name, dt, schema)
            for key in {object_store.store_url(u.path) for u in source.units if "://" in u.path}:
                self._stores_for(key)  # files elsewhere (a shallow clone's): their stores
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            msg = f"cannot register the Delta table at {uri} as table {name!r}: {exc}"
            raise PlanningError(object_store.redact(msg)) from exc
        self._add(source)
        if unreadable:
            self._not_on_coordinator[table_name(name)] = unreadable

    def _register_delta_files(self, name: str, dt: Any, keep: set[int]) -> None:
        """Register version ``dt`` of a Delta table as ``name``, reading only some of its files.

        ``keep`` holds indexes into ``dt.get_add_actions()``'s rows (the order
        of :func:`~distfusion.io.delta.delta_source`'s units). The coordinator's
        context gets a view of exactly those files (as :meth:`_register_files`
        does), so a query runs alike in place and in tasks. Called by
        :mod:`distfusion.table_write.delta_predicate` for the files a
        predicate overwrite rewrites.

        Raises:
            PlanningError: as :meth:`register_delta`.
        """
        self.register_delta(name, dt)
        full = self.sources[table_name(name)]
        units = tuple(u for i, u in enumerate(full.units) if i in keep)
        paths = {u.path for u in units}
        stats = {p: s for p, s in full.unit_stats.items() if p in paths}
        source = dataclasses.replace(full, units=units, unit_stats=stats)
        self._forget(name)
        try:
            register_scan(self.ctx, source, units)
        except Exception as exc:
            self._forget(name)
            raise PlanningError(f"cannot read the files of {name!r}: {exc}") from exc
        self._file_views.add(table_name(name))
        self._add(source)

    def _stores_for(self, path: str, extension: str | None = None) -> str:
        """Make sure the store of ``path`` (when a URL) is this context's and DataFusion's.

        A bucket without a store of this context's gets the process's
        (:func:`~distfusion.io.object_store.spec_for`: one made from the
        environment unless registered); one with a store of this context's
        makes it the process's again, for the coordinator's listing.

        Returns:
            ``path``, a URL naming a "directory" with the ``/`` DataFusion
            needs to list it (``s3://b/t`` -> ``s3://b/t/``) when ``extension``
            is given and the URL does not end with it.
        """
        if not object_store.is_url(path):
            return path
        key = object_store.store_url(path)
        own = self.stores.registered().get(key)
        if own is None:  # none of its own: the one the process reads with
            self.stores.install(((key, object_store.spec_for(path)),))
            self.stores.add_to(self.ctx)
        elif object_store.registered().get(key) != own:  # another context's meanwhile
            object_store.install(((key, own),))  # the coordinator's listing reads with its own
        glob = object_store.is_glob(path)
        if extension and not glob and not path.endswith((extension, "/")):
            return path + "/"
        return path

    def _register_files(
        self,
        name: str,
        fmt: str,
        files: list,
        schema: pa.Schema | None,
        options: dict | None = None,
    ) -> None:
        """Register exactly ``files`` (paths or URLs) as ``name``: one work unit each.

        The coordinator's DataFusion context gets a view of their union (as a
        task reads its share), so queries run here see the same rows.

        Raises:
            PlanningError: no file given, a file is missing, or DataFusion cannot read it.
        """
        files = [self._stores_for(os.fspath(f)) for f in files]
        if not files:
            raise PlanningError(f"cannot register table {name!r}: the list of files is empty")
        options = options or {}
        try:
            if schema is None:
                schema = self._first_file_schema(fmt, files[0], None, options)
            if fmt == "parquet":
                source = parquet_source(name, files, schema)
            elif fmt == "json":
                source = json_source(name, files, schema)
            else:
                source = csv_source(name, files, schema, **options)
            self._forget(name)
            register_scan(self.ctx, source, source.units)
            self._file_views.add(table_name(name))
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, PlanningError):
                raise
            if fmt == "parquet":
                raise parquet_register_error(name, files, exc) from exc
            msg = f"cannot register {len(files)} files ({files[0]}, ...) as table {name!r}: {exc}"
            raise PlanningError(msg) from exc
        self._add(source)

    def _first_file_schema(
        self,
        fmt: str,
        first: str,
        schema: pa.Schema | None,
        options: dict,
        partition_cols: list[tuple] | None = None,
    ) -> pa.Schema:
        """The schema DataFusion reads ``first`` with (``fmt``'s options; ``schema`` if given).

        ``partition_cols`` (Parquet): ``(column, type)`` appended, typed as
        DataFusion's ``table_partition_cols`` types them.

        Raises:
            Exception: DataFusion's error reading the file (the caller wraps it).
        """
        url = object_store.datafusion_url(first)
        if fmt == "parquet":
            df = self.ctx.read_parquet(url, schema=schema, table_partition_cols=partition_cols)
        elif fmt == "json":
            df = self.ctx.read_json(url, schema=schema)
        else:
            df = self.ctx.read_csv(url, schema=schema, **options)
        return df.schema()

    def _register_glob(
        self,
        name: str,
        fmt: str,
        url: str,
        schema: pa.Schema | None,
        options: dict | None = None,
        partition_cols: list[tuple] | None = None,
    ) -> None:
        """Register the objects glob ``url`` matches (``s3://lake/t/*.parquet``) as ``name``.

        DataFusion expands globs in local paths only (a URL with one lists no
        file: "No files found"), so the objects are listed here, through the
        store (:func:`distfusion.io.object_store.list_objects`: ``*``, ``?``,
        ``[...]`` per path segment), one work unit each, read by the tasks.
        The schema is DataFusion's of the first file (``schema`` if given;
        ``partition_cols`` appended, read from ``col=value`` directories below
        the glob's literal prefix). The coordinator's context knows the table
        by that schema only, as an empty table: a query over it runs in tasks,
        never in place on the coordinator, and one that can only run on the
        coordinator is refused naming the table (``_not_on_coordinator``).

        Raises:
            PlanningError: nothing matches, a file cannot be read, or a file is
                not below a ``col=value`` directory of every partition column
                (the message names the table, the URL and the cause).
        """
        options = options or {}
        cols = list(partition_cols or [])
        extension = f".{fmt}"
        try:
            first = list_files(url, extension)[0]
            table_schema = self._first_file_schema(fmt, first, schema, options, cols or None)
            if fmt == "parquet":
                source = parquet_source(name, url, table_schema, tuple(c for c, _ in cols))
            elif fmt == "json":
                source = json_source(name, url, table_schema)
            else:
                source = csv_source(name, url, table_schema, **options)
        except Exception as exc:
            if isinstance(exc, PlanningError):
                raise PlanningError(f"cannot register {url!r} as table {name!r}: {exc}") from None
            msg = f"cannot register {url!r} as table {name!r}: {object_store.describe(exc)}"
            raise PlanningError(msg) from exc
        self._forget(name)
        empty = pa.RecordBatch.from_pylist([], schema=table_schema)
        self.ctx.register_record_batches(name, [[empty]])
        self._add(source)
        self._not_on_coordinator[table_name(name)] = (
            f"it is the {len(source.units)} objects glob {url} matches, which DataFusion "
            "cannot list here (it expands globs in local paths only)"
        )

    def _register_streamed(self, source: TableSource, held: object) -> None:
        """Register a table read at run time (a Spark DataFrame), keeping ``held`` alive with it.

        The coordinator's DataFusion context knows the table as empty, with its
        schema: it plans queries over it; only tasks read its rows.
        """
        source = dataclasses.replace(source, name=table_name(source.name))
        self._forget(sql_name(source.name))
        self._held[source.name] = held
        empty = pa.RecordBatch.from_pylist([], schema=source.schema)
        self.ctx.register_record_batches(sql_name(source.name), [[empty]])
        self._add(source)

    def _add(self, source: TableSource) -> None:
        name = table_name(source.name)
        self.sources[name] = dataclasses.replace(source, name=name)

    def _forget(self, name: str) -> None:
        self.sources.pop(table_name(name), None)
        self._file_views.discard(table_name(name))
        self._not_on_coordinator.pop(table_name(name), None)
        self._feed_sources.pop(table_name(name), None)
        self._held.pop(table_name(name), None)
        try:
            self.ctx.deregister_table(sql_name(table_name(name)))  # "lake.db.t": one name
        except Exception:  # not registered: nothing to forget
            pass
