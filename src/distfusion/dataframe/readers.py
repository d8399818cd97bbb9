"""The first DataFrames of a context: ``table``, ``read_parquet``, ``read_csv``, ``read_json``, ...

:class:`Readers` is the part of :class:`~distfusion.context.DistributedContext`
that makes DataFrames from registered tables, files and Arrow data, as
datafusion-python 55's ``SessionContext`` readers of the same names and
arguments do.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import pyarrow as pa
from datafusion import DataFrame, SessionContext

from distfusion.coordinator.hosts import ContextHost
from distfusion.dataframe.sessions import check_session, plan_label
from distfusion.errors import PlanningError

__all__ = ["Readers"]


def _generated_name(kind: str, path: Any = None) -> str:
    """A fresh table name for a source a reader registers: ``<what>_<12 hex digits>``.

    ``<what>`` is the last part of ``path`` (a file's name without its
    extension, a directory's name) in lower-case letters, digits and ``_``
    (``data/tpch/lineitem/`` -> ``lineitem_3f2a...``), else ``kind``: the
    name ``explain()`` shows tells which files the scan reads.
    """
    stem = ""
    if isinstance(path, str | os.PathLike):
        last = os.path.basename(os.fspath(path).rstrip("/"))
        stem = re.sub(r"[^a-z0-9_]+", "_", last.split(".")[0].lower()).strip("_")
    if not stem or not stem[0].isalpha():
        stem = kind
    return f"{stem[:40]}_{uuid.uuid4().hex[:12]}"


def _refuse_options(method: str, **options: tuple[Any, Any]) -> None:
    """Raise for DataFusion options ``method`` takes for its signature but does not apply.

    Args:
        method: the reader's name, for the message.
        options: name -> (value given, DataFusion's default).

    Raises:
        ValueError: a value differs from its default (names every such option).
    """
    given = [name for name, (value, default) in options.items() if value != default]
    if given:
        msg = (
            f"{method}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} not supported: "
            "every task reads with DataFusion's defaults; register the files with "
            "DataFusion's defaults, or run this read in datafusion.SessionContext"
        )
        raise ValueError(msg)


class Readers(ContextHost):
    """The first DataFrames of a :class:`~distfusion.context.DistributedContext` (a mixin).

    The class using it has ``ctx`` (its DataFusion ``SessionContext``),
    ``_marker`` (:func:`mark_session`'s name), the ``register_*`` methods,
    ``_catalog_table`` (a mounted catalog's table by name), and
    ``_frame(df, label)`` (a distributed DataFrame of this context around
    DataFusion's ``df``). Readers register their input under a generated name
    (``lineitem_<hex>`` for ``read_parquet("data/lineitem/")``, ``arrow_<hex>``;
    ``table_names()`` lists them), so that the
    planner sees a source as for ``register_parquet``: files become work
    units split across the leaf tasks. Such a table stays registered until
    ``deregister_table(name)``, as DataFusion's ``from_arrow`` tables do.
    """

    ctx: SessionContext
    _marker: str

    def _frame(self, df: DataFrame, label: str) -> Any:
        """A distributed DataFrame of this context around ``df`` (see the class)."""
        raise NotImplementedError

    def _check_own(self, df: DataFrame) -> None:
        """Raise unless ``df`` was made on this context (:func:`check_session`)."""
        check_session(self.ctx, self._marker, df)

    def table(self, name: str) -> Any:
        """The registered table ``name`` as a DataFrame (as DataFusion's ``SessionContext.table``).

        ``name`` may be ``catalog.namespace.table`` of a catalog mounted with
        ``register_catalog`` (loaded now, at its current version).

        Raises:
            PlanningError: no table ``name`` (DataFusion's message, or the
                catalog's: see :mod:`distfusion.table_write.catalogs`).
        """
        self._reread_memory_tables()
        name = self._catalog_table(name)
        try:
            df = self.ctx.table(name)
        except Exception as exc:  # DataFusion's bare Exception
            raise PlanningError(f"table {name!r}: {exc}") from exc
        return self._frame(df, f"DataFrame {name}")

    def from_datafusion(self, df: DataFrame) -> Any:
        """Distribute a ``datafusion.DataFrame`` made on this context's ``ctx``.

        ``df`` may be built with any DataFusion API on ``context.ctx``
        (``ctx.ctx.table("t").filter(...)``, ``ctx.ctx.sql(...)``); it runs
        distributed when an action runs. A table of ``ctx.ctx`` that distfusion
        did not register (DataFusion's own ``ctx.ctx.from_pydict``) has no
        source: such a query runs whole on the coordinator.

        Raises:
            TypeError: ``df`` is no ``datafusion.DataFrame``.
            PlanningError: ``df`` was made on another ``SessionContext``, or
                scans a table this context does not know.
        """
        self._check_own(df)
        return self._frame(df, plan_label(df))

    def read_parquet(
        self,
        path: str | os.PathLike | list,
        table_partition_cols: list[tuple[str, str | pa.DataType]] | None = None,
        parquet_pruning: bool = True,
        file_extension: str = ".parquet",
        skip_metadata: bool = True,
        schema: pa.Schema | None = None,
        file_sort_order: Any = None,
        object_store: Any = None,
    ) -> Any:
        """Parquet files as a DataFrame: registered under a generated name, then :meth:`table`.

        DataFusion's ``SessionContext.read_parquet`` arguments; the files
        are read as by ``register_parquet``: a file, a directory (recursively),
        a glob, a list of files, or an object store URL
        (``s3://bucket/prefix/``, its store registered with
        ``register_object_store`` or made from the environment).

        Args:
            path: the file(s).
            table_partition_cols: Hive-style partition columns ``(name, type)``.
            parquet_pruning: DataFusion's default only (tasks prune row groups).
            file_extension: ``".parquet"`` only.
            skip_metadata: DataFusion's default only.
            schema: the table's schema (default: the files').
            file_sort_order: None only.
            object_store: None only: stores are registered by URL
                (``register_object_store``).

        Raises:
            ValueError: an option other than its default where marked "only".
            PlanningError: no Parquet file at ``path``, or DataFusion cannot read it.
        """
        _refuse_options(
            "read_parquet",
            parquet_pruning=(parquet_pruning, True),
            file_extension=(file_extension, ".parquet"),
            skip_metadata=(skip_metadata, True),
            file_sort_order=(file_sort_order, None),
            object_store=(object_store, None),
        )
        name = _generated_name("parquet", path)
        self.register_parquet(name, path, schema=schema, table_partition_cols=table_partition_cols)
        return self.table(name)

    def read_csv(
        self,
        path: str | os.PathLike | list,
        schema: pa.Schema | None = None,
        has_header: bool = True,
        delimiter: str = ",",
        schema_infer_max_records: int = 1000,
        file_extension: str = ".csv",
        table_partition_cols: list[tuple[str, str | pa.DataType]] | None = None,
        file_compression_type: str | None = None,
        options: Any = None,
        object_store: Any = None,
    ) -> Any:
        """CSV files as a DataFrame: registered under a generated name, then :meth:`table`.

        DataFusion's ``SessionContext.read_csv`` arguments; the files are read
        as by ``register_csv`` (a file, a directory, a glob, a list of files,
        an object store URL).

        Args:
            path: the file(s).
            schema: the table's schema (default: inferred from the files).
            has_header: the first line of each file names the columns.
            delimiter: the field separator.
            schema_infer_max_records: 1000 only (DataFusion's default).
            file_extension: ``".csv"`` only.
            table_partition_cols: None only.
            file_compression_type: None only (uncompressed files).
            options: None only (a ``CsvReadOptions``: use the arguments above).
            object_store: None only: stores are registered by URL.

        Raises:
            ValueError: an option other than its default where marked "only".
            PlanningError: no CSV file at ``path``, or DataFusion cannot infer a schema.
        """
        _refuse_options(
            "read_csv",
            schema_infer_max_records=(schema_infer_max_records, 1000),
            file_extension=(file_extension, ".csv"),
            table_partition_cols=(table_partition_cols or None, None),
            file_compression_type=(file_compression_type, None),
            options=(options, None),
            object_store=(object_store, None),
        )
        name = _generated_name("csv", path)
        self.register_csv(name, path, schema=schema, has_header=has_header, delimiter=delimiter)
        return self.table(name)

    def read_json(
        self,
        path: str | os.PathLike | list,
        schema: pa.Schema | None = None,
        schema_infer_max_records: int = 1000,
        file_extension: str = ".json",
        table_partition_cols: list[tuple[str, str | pa.DataType]] | None = None,
        file_compression_type: str | None = None,
        object_store: Any = None,
    ) -> Any:
        """Newline-delimited JSON files as a DataFrame: registered, then :meth:`table`.

        DataFusion's ``SessionContext.read_json`` arguments; the files are
        read as by ``register_json`` (a file, a directory, a glob, a list of
        files, an object store URL), each file one work unit.

        Args:
            path: the file(s).
            schema: the table's schema (default: inferred from the files).
            schema_infer_max_records: 1000 only (DataFusion's default).
            file_extension: ``".json"`` only.
            table_partition_cols: None only.
            file_compression_type: None only (uncompressed files).
            object_store: None only: stores are registered by URL.

        Raises:
            ValueError: an option other than its default where marked "only".
            PlanningError: no ``.json`` file at ``path``, or DataFusion cannot
                infer a schema.
        """
        _refuse_options(
            "read_json",
            schema_infer_max_records=(schema_infer_max_records, 1000),
            file_extension=(file_extension, ".json"),
            table_partition_cols=(table_partition_cols or None, None),
            file_compression_type=(file_compression_type, None),
            object_store=(object_store, None),
        )
        name = _generated_name("json", path)
        self.register_json(name, path, schema=schema)
        return self.table(name)

    def register_view(self, name: str, df: Any) -> None:
        """Register the query of ``df`` as view ``name`` (DataFusion's ``register_view``).

        A query reading ``name`` reads the view's plan, inlined: it is
        distributed over the view's tables. The view is DataFusion's, on
        the coordinator's context; it has no source of its own and is not
        in :meth:`table_names`.

        Args:
            name: the view's name in SQL.
            df: a DataFrame of this context (a ``DistributedDataFrame``, or a
                ``datafusion.DataFrame`` made on ``ctx.ctx``).

        Raises:
            TypeError: ``df`` is no DataFrame.
            PlanningError: ``df`` belongs to another context.
        """
        inner = getattr(df, "df", df)
        if getattr(df, "context", self) is not self:
            msg = f"register_view: {name!r} is a DataFrame of another DistributedContext"
            raise PlanningError(msg)
        self._check_own(inner)
        self._forget(name)
        self.ctx.register_view(name, inner)

    def from_arrow(self, data: Any, name: str | None = None) -> Any:
        """Arrow data as a DataFrame: registered as an in-memory table, then :meth:`table`.

        The table is cut into work units of at most 65,536 rows, split
        across the leaf tasks (``register_table``).

        Args:
            data: a ``pyarrow.Table``, ``RecordBatch``, ``RecordBatchReader``
                or any object exporting an Arrow stream or array
                (``__arrow_c_stream__``, ``__arrow_c_array__``: polars,
                nanoarrow, ...).
            name: the table's name (default: a generated one).

        Raises:
            TypeError: ``data`` is not Arrow data.
            PlanningError: a table ``name`` exists already.
        """
        table = _arrow_table(data)
        name = name or _generated_name("arrow")
        if self.ctx.table_exist(name):
            msg = f"from_arrow: a table {name!r} exists already; deregister_table it first"
            raise PlanningError(msg)
        self.register_table(name, table)
        return self.table(name)

    def from_pydict(self, data: dict[str, list[Any]], name: str | None = None) -> Any:
        """``{column: [values]}`` as a DataFrame (types as ``pyarrow.Table.from_pydict``).

        Raises:
            TypeError, pyarrow.ArrowInvalid: pyarrow cannot convert ``data``.
            PlanningError: as :meth:`from_arrow`.
        """
        return self.from_arrow(pa.Table.from_pydict(data), name)

    def from_pylist(self, data: list[dict[str, Any]], name: str | None = None) -> Any:
        """A list of row dicts as a DataFrame (types as ``pyarrow.Table.from_pylist``).

        Raises:
            TypeError, pyarrow.ArrowInvalid: pyarrow cannot convert ``data``.
            PlanningError: as :meth:`from_arrow`.
        """
        return self.from_arrow(pa.Table.from_pylist(data), name)

    def from_pandas(self, data: Any, name: str | None = None) -> Any:
        """A pandas DataFrame as a DataFrame (types as ``pyarrow.Table.from_pandas``).

        Raises:
            TypeError, pyarrow.ArrowInvalid: pyarrow cannot convert ``data``.
            PlanningError: as :meth:`from_arrow`.
        """
        return self.from_arrow(pa.Table.from_pandas(data), name)


def _arrow_table(data: Any) -> pa.Table:
    """``data`` as a ``pyarrow.Table`` (see :meth:`Readers.from_arrow`).

    Raises:
        TypeError: ``data`` is not Arrow data.
    """
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__"):
        return pa.table(data)
    msg = f"from_arrow takes Arrow data (a pyarrow.Table, RecordBatch, ...), got {type(data)!r}"
    raise TypeError(msg)
