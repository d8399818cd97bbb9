"""DataFusion's DataFrame methods on a distributed DataFrame: the plan built on the coordinator.

:class:`Transformations` is the part of
:class:`~distfusion.context.DistributedDataFrame` that calls datafusion-python
55's ``DataFrame`` method of the same name on the DataFusion DataFrame it
wraps, and the actions built on a distributed run (``count``, ``to_pydict``,
``describe``, ``to_polars``, the Arrow stream export).
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, Self

import pyarrow as pa
from datafusion import DataFrame, Expr
from datafusion import functions as F
from datafusion.catalog import Table
from datafusion.plan import ExecutionPlan, LogicalPlan

from distfusion.coordinator.hosts import FrameHost
from distfusion.coordinator.statements import table_name as sql_table_name
from distfusion.dataframe.actions import arrow_stream, describe_table, registered
from distfusion.errors import DistfusionError, PlanningError

__all__ = ["JoinHow", "Transformations"]

JoinHow = Literal["inner", "left", "right", "full", "semi", "anti"]


class Transformations(FrameHost):
    """DataFusion's DataFrame transformations for a distributed DataFrame (a mixin).

    The class using it has ``df`` (the DataFusion ``DataFrame`` it wraps, made
    on ``context.ctx``), ``context`` (its
    :class:`~distfusion.context.DistributedContext`) and ``_derive(df)`` (a
    DataFrame of its own kind and context around another DataFusion
    DataFrame). Every method mirrors datafusion-python 55's ``DataFrame``
    method of the same name and arguments; a transformation builds the plan on
    the coordinator and returns a new distributed DataFrame (nothing runs).

    Errors are DataFusion's, raised at once: an invalid expression or an
    unknown column raises :class:`~distfusion.errors.PlanningError` (also a
    ``ValueError``) with DataFusion's message; an argument of the wrong kind
    raises ``TypeError``. A DataFrame argument (``join``, ``union``, ...) must
    come from the same context.
    """

    df: DataFrame
    context: Any

    def _derive(self, df: DataFrame) -> Self:
        """A DataFrame of this kind and context around DataFusion's ``df`` (see the class)."""
        raise NotImplementedError

    def _transformed(self, method: str, build: Callable[[], DataFrame]) -> Self:
        """``build()``'s DataFrame, wrapped; DataFusion's bare errors as PlanningError.

        Raises:
            PlanningError: DataFusion rejected the transformation (its message,
                after ``method``).
            TypeError: an argument of the wrong kind.
        """
        try:
            df = build()
        except (DistfusionError, TypeError):
            raise
        except Exception as exc:  # DataFusion's bare Exception, or its ValueError
            raise PlanningError(f"{method}: {exc}") from exc
        if not isinstance(df, DataFrame):
            # datafusion-python 55's select_exprs returns its internal DataFrame
            df = DataFrame(df)
        return self._derive(df)

    def _other(self, other: Any, method: str) -> DataFrame:
        """The DataFusion DataFrame of ``other``, a DataFrame of this context.

        Raises:
            TypeError: ``other`` is no DataFrame.
            PlanningError: ``other`` belongs to another context.
        """
        if isinstance(other, Transformations):
            if other.context is not self.context:
                msg = (
                    f"{method}: the other DataFrame belongs to another DistributedContext; "
                    "both sides of a query must come from one context (register the other "
                    "side's tables in this one)"
                )
                raise PlanningError(msg)
            return other.df
        if isinstance(other, DataFrame):
            self.context._check_own(other)
            return other
        msg = f"{method}: expected a DataFrame of this context, got {type(other).__name__}"
        raise TypeError(msg)

    # --------------------------------------------------------------- columns
    def __getitem__(self, key: str | list[str]) -> Self:
        """The column ``key`` or the columns of list ``key`` (as DataFusion's ``df[key]``).

        Raises:
            PlanningError: a column is unknown.
        """
        return self._transformed("__getitem__", lambda: self.df[key])

    def column(self, name: str) -> Expr:
        """The column ``name`` as a qualified expression (DataFusion's ``DataFrame.column``).

        Use it to tell apart columns of the same name on two sides of a join.

        Raises:
            PlanningError: no such column, or it is ambiguous.
        """
        try:
            return self.df.column(name)
        except Exception as exc:  # DataFusion's bare Exception
            raise PlanningError(f"column: {exc}") from exc

    def col(self, name: str) -> Expr:
        """Alias of :meth:`column`.

        Raises:
            PlanningError: as :meth:`column`.
        """
        return self.column(name)

    def find_qualified_columns(self, *names: str) -> list[Expr]:
        """Qualified expressions of the columns ``names``, in order (DataFusion's).

        Raises:
            PlanningError: a column is unknown or ambiguous.
        """
        try:
            return self.df.find_qualified_columns(*names)
        except Exception as exc:  # DataFusion's bare Exception
            raise PlanningError(f"find_qualified_columns: {exc}") from exc

    def parse_sql_expr(self, expr: str) -> Expr:
        """The SQL expression text ``expr`` as an expression over this DataFrame's columns.

        Raises:
            PlanningError: DataFusion cannot parse or resolve ``expr``.
        """
        try:
            return self.df.parse_sql_expr(expr)
        except Exception as exc:  # DataFusion's bare Exception
            raise PlanningError(f"parse_sql_expr: {exc}") from exc

    # ------------------------------------------------------------ projections
    def select(self, *exprs: Expr | str) -> Self:
        """Project ``exprs`` (column names or expressions, window functions included).

        Args:
            exprs: column names or ``datafusion.Expr``; one output column each.

        Returns:
            A DataFrame with one column per expression.

        Raises:
            PlanningError: an unknown column or an invalid expression.
        """
        return self._transformed("select", lambda: self.df.select(*exprs))

    def select_exprs(self, *args: str) -> Self:
        """Project SQL expression texts (``"a + 1 AS b"``), as DataFusion's ``select_exprs``.

        Raises:
            PlanningError: DataFusion cannot parse or resolve an expression.
        """
        return self._transformed("select_exprs", lambda: self.df.select_exprs(*args))

    def drop(self, *columns: str) -> Self:
        """The DataFrame without ``columns`` (double-quote a name that is not lower case).

        Raises:
            PlanningError: DataFusion rejects a name.
        """
        return self._transformed("drop", lambda: self.df.drop(*columns))

    def with_column(self, name: str, expr: Expr | str) -> Self:
        """Add (or replace) column ``name`` computed by ``expr`` (an expression or SQL text).

        Raises:
            PlanningError: an unknown column or an invalid expression.
        """
        return self._transformed("with_column", lambda: self.df.with_column(name, expr))

    def with_columns(
        self, *exprs: Expr | str | Iterable[Expr | str], **named_exprs: Expr | str
    ) -> Self:
        """Add columns: aliased expressions, iterables of them, SQL texts, or ``name=expr``.

        Raises:
            PlanningError: an unknown column or an invalid expression.
        """
        return self._transformed(
            "with_columns", lambda: self.df.with_columns(*exprs, **named_exprs)
        )

    def with_column_renamed(self, old_name: str, new_name: str) -> Self:
        """Rename column ``old_name`` to ``new_name`` (no-op when there is no such column).

        Raises:
            PlanningError: DataFusion rejects the rename (a duplicate name).
        """
        return self._transformed(
            "with_column_renamed", lambda: self.df.with_column_renamed(old_name, new_name)
        )

    def cast(self, mapping: dict[str, pa.DataType]) -> Self:
        """Cast columns to Arrow types: ``{"column": pa.float64()}``.

        Raises:
            PlanningError: an unknown column or an impossible cast.
        """
        return self._transformed("cast", lambda: self.df.cast(mapping))

    def window(self, *exprs: Expr) -> Self:
        """Append window function columns (``F.row_number(partition_by=..., order_by=...)``).

        The planner shuffles the rows by each window's ``partition_by`` keys
        (no keys: one task), as for SQL windows.

        Raises:
            PlanningError: an invalid window expression.
        """
        return self._transformed("window", lambda: self.df.window(*exprs))

    def fill_null(self, value: Any, subset: list[str] | None = None) -> Self:
        """Replace NULL with ``value`` in ``subset`` (default: every column of a fitting type).

        Raises:
            PlanningError: an unknown column of ``subset``.
        """
        return self._transformed("fill_null", lambda: self.df.fill_null(value, subset))

    def fill_nan(self, value: float, subset: list[str] | None = None) -> Self:
        """Replace NaN with ``value`` in ``subset`` (default: every float column).

        Raises:
            PlanningError: an unknown column of ``subset``.
        """
        return self._transformed("fill_nan", lambda: self.df.fill_nan(value, subset))

    def unnest_columns(
        self,
        *columns: str,
        preserve_nulls: bool = True,
        recursions: list[tuple[str, str, int]] | None = None,
    ) -> Self:
        """One row per element of list columns ``columns`` (DataFusion's ``unnest_columns``).

        Substrait cannot carry an unnest: such a query runs whole on the
        coordinator (``coordinator_only()`` says so).

        Raises:
            PlanningError: an unknown column or one that is not a list.
        """
        return self._transformed(
            "unnest_columns",
            lambda: self.df.unnest_columns(
                *columns, preserve_nulls=preserve_nulls, recursions=recursions
            ),
        )

    def alias(self, alias: str) -> Self:
        """The same rows with their columns qualified by ``alias`` (``col("alias.x")``).

        Raises:
            PlanningError: DataFusion rejects the alias.
        """
        return self._transformed("alias", lambda: self.df.alias(alias))

    # ------------------------------------------------------------ row filters
    def filter(self, *predicates: Expr | str) -> Self:
        """Rows for which every predicate (expression or SQL text) is true.

        Raises:
            PlanningError: an unknown column or a predicate that is not boolean.
        """
        return self._transformed("filter", lambda: self.df.filter(*predicates))

    def limit(self, count: int, offset: int = 0) -> Self:
        """At most ``count`` rows after skipping ``offset`` (in order only after :meth:`sort`).

        Raises:
            PlanningError: DataFusion rejects the numbers.
        """
        return self._transformed("limit", lambda: self.df.limit(count, offset))

    def head(self, n: int = 5) -> Self:
        """The first ``n`` rows: ``limit(n)``."""
        return self.limit(n)

    def tail(self, n: int = 5) -> Self:
        """The last ``n`` rows: runs a distributed :meth:`count` now, then ``limit(n, count - n)``.

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream`` (the count).
        """
        return self.limit(n, max(0, self.count() - n))

    def distinct(self) -> Self:
        """The distinct rows."""
        return self._transformed("distinct", lambda: self.df.distinct())

    def distinct_on(
        self, on_expr: list[Expr], select_expr: list[Expr], sort_expr: list[Any] | None = None
    ) -> Self:
        """One row per distinct ``on_expr``: the first by ``sort_expr``, as ``select_expr``.

        Raises:
            PlanningError: an unknown column or an invalid expression.
        """
        return self._transformed(
            "distinct_on", lambda: self.df.distinct_on(on_expr, select_expr, sort_expr)
        )

    # ----------------------------------------------------- aggregates, sorts
    def aggregate(
        self,
        group_by: Sequence[Expr | str] | Expr | str | None,
        aggs: Sequence[Expr] | Expr,
    ) -> Self:
        """Aggregate ``aggs`` per distinct ``group_by`` (None or ``[]``: one row over all).

        Distributed as a SQL ``GROUP BY``: partial aggregates where the rows
        are, a shuffle by the keys, final aggregates after it. ``group_by``
        may hold a ``GroupingSet`` (rollup, cube, grouping sets).

        Args:
            group_by: column names or expressions to group by.
            aggs: aggregate expressions (``F.sum(col("x")).alias("total")``).

        Raises:
            PlanningError: an unknown column, or an expression of ``aggs``
                that is not an aggregate.
        """
        return self._transformed("aggregate", lambda: self.df.aggregate(group_by, aggs))

    def sort(self, *exprs: Any) -> Self:
        """Sort by ``exprs``: column names, expressions, or ``expr.sort(ascending, nulls_first)``.

        Raises:
            PlanningError: an unknown column.
        """
        return self._transformed("sort", lambda: self.df.sort(*exprs))

    def sort_by(self, *exprs: Expr | str) -> Self:
        """Sort ascending, NULLs last, by ``exprs``.

        Raises:
            PlanningError: an unknown column.
        """
        return self._transformed("sort_by", lambda: self.df.sort_by(*exprs))

    # ------------------------------------------------------------------ joins
    def join(
        self,
        right: Any,
        on: str | Sequence[str] | tuple[list[str], list[str]] | None = None,
        how: JoinHow = "inner",
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        join_keys: tuple[list[str], list[str]] | None = None,
        coalesce_duplicate_keys: bool = True,
    ) -> Self:
        """Equi-join with ``right`` on columns (``on``, or ``left_on`` with ``right_on``).

        Distributed as a SQL join: the smaller side broadcast when small
        enough, else both sides shuffled by the keys.

        Args:
            right: a DataFrame of the same context (distributed, or a
                ``datafusion.DataFrame`` made on ``context.ctx``).
            on: key column names of both sides.
            how: ``"inner"``, ``"left"``, ``"right"``, ``"full"``, ``"semi"``, ``"anti"``.
            left_on: key columns of this side.
            right_on: key columns of ``right``.
            join_keys: deprecated in DataFusion: ``(left_on, right_on)``.
            coalesce_duplicate_keys: keep one column for a key named alike on
                both sides (``on``).

        Raises:
            ValueError: neither ``on`` nor both ``left_on`` and ``right_on``
                (a :class:`~distfusion.errors.PlanningError`).
            PlanningError: an unknown column; ``right`` belongs to another context.
            TypeError: ``right`` is no DataFrame.
        """
        other = self._other(right, "join")
        join: Callable[..., DataFrame] = self.df.join  # its overloads split what is forwarded
        return self._transformed(
            "join",
            lambda: join(
                other,
                on,
                how,
                left_on=left_on,
                right_on=right_on,
                join_keys=join_keys,
                coalesce_duplicate_keys=coalesce_duplicate_keys,
            ),
        )

    def join_on(self, right: Any, *on_exprs: Expr, how: JoinHow = "inner") -> Self:
        """Join with ``right`` on predicates (equalities become join keys, others a filter).

        Use :meth:`col` of each side to tell apart columns of the same name.

        Raises:
            PlanningError: an unknown column; ``right`` belongs to another context.
            TypeError: ``right`` is no DataFrame.
        """
        other = self._other(right, "join_on")
        return self._transformed("join_on", lambda: self.df.join_on(other, *on_exprs, how=how))

    # ------------------------------------------------------------- set algebra
    def union(self, other: Any, distinct: bool = False) -> Self:
        """The rows of both DataFrames (same columns by position); ``distinct`` drops duplicates.

        Raises:
            PlanningError: the schemas differ; ``other`` belongs to another context.
            TypeError: ``other`` is no DataFrame.
        """
        df = self._other(other, "union")
        return self._transformed("union", lambda: self.df.union(df, distinct))

    def union_distinct(self, other: Any) -> Self:
        """The distinct rows of both DataFrames (deprecated in DataFusion: ``union(other, True)``).

        Raises:
            As :meth:`union`.
        """
        warnings.warn(
            "union_distinct() is deprecated. Use union(other, distinct=True) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.union(other, distinct=True)

    def union_by_name(self, other: Any, distinct: bool = False) -> Self:
        """The rows of both DataFrames, columns matched by name.

        Raises:
            PlanningError: the columns do not match; ``other`` belongs to another context.
            TypeError: ``other`` is no DataFrame.
        """
        df = self._other(other, "union_by_name")
        return self._transformed("union_by_name", lambda: self.df.union_by_name(df, distinct))

    def intersect(self, other: Any, distinct: bool = False) -> Self:
        """The rows also in ``other`` (SQL's ``INTERSECT [ALL]``: ``distinct`` for the former).

        Raises:
            PlanningError: the schemas differ; ``other`` belongs to another context.
            TypeError: ``other`` is no DataFrame.
        """
        df = self._other(other, "intersect")
        return self._transformed("intersect", lambda: self.df.intersect(df, distinct))

    def except_all(self, other: Any, distinct: bool = False) -> Self:
        """The rows not in ``other`` (SQL's ``EXCEPT [ALL]``: ``distinct`` for the former).

        Raises:
            PlanningError: the schemas differ; ``other`` belongs to another context.
            TypeError: ``other`` is no DataFrame.
        """
        df = self._other(other, "except_all")
        return self._transformed("except_all", lambda: self.df.except_all(df, distinct))

    # ------------------------------------------------------------ partitioning
    def repartition(self, num: int) -> Self:
        """The same rows; the planner decides the partitioning (DataFusion's is round robin).

        DataFusion's ``Repartition`` node would be a plan node the
        distributed planner does not cut (it would gather every row into one
        task there): the argument is checked by DataFusion, and the query is
        returned as it is. Rows come in no defined order either way.

        Raises:
            PlanningError: ``num`` is not a positive partition count (DataFusion's message).
        """
        self._transformed("repartition", lambda: self.df.repartition(num))
        return self._derive(self.df)

    def repartition_by_hash(self, *exprs: Expr | str, num: int) -> Self:
        """The same rows; the planner decides the partitioning (as :meth:`repartition`).

        The stages that need rows of one key together (aggregates, joins,
        windows) are shuffled by their keys anyway; the expressions are
        checked by DataFusion and the query is returned as it is.

        Raises:
            PlanningError: an unknown column or an invalid expression or ``num``.
        """

        def check() -> DataFrame:
            keys = [self.df.parse_sql_expr(e) if isinstance(e, str) else e for e in exprs]
            self.df.select(*keys)  # DataFusion resolves them only when it plans physically
            return self.df.repartition_by_hash(*keys, num=num)

        self._transformed("repartition_by_hash", check)
        return self._derive(self.df)

    # ----------------------------------------------------------------- plans
    def logical_plan(self) -> LogicalPlan:
        """DataFusion's unoptimized logical plan of the query (made on the coordinator)."""
        return self.df.logical_plan()

    def optimized_logical_plan(self) -> LogicalPlan:
        """DataFusion's optimized logical plan: what goes through Substrait to the planner."""
        return self.df.optimized_logical_plan()

    def execution_plan(self) -> ExecutionPlan:
        """DataFusion's single-node physical plan of the query on the coordinator.

        Not what runs: the distributed plan is ``explain()`` /
        ``stage_graph()``, each stage's fragment planned by its tasks.

        Raises:
            PlanningError: DataFusion cannot plan the query physically.
        """
        try:
            return self.df.execution_plan()
        except Exception as exc:  # DataFusion's bare Exception
            raise PlanningError(f"execution_plan: {exc}") from exc

    def into_view(self, temporary: bool = False) -> Table:
        """The query as a DataFusion view (``datafusion.catalog.Table``), as DataFusion's.

        Register it in this DataFrame's context
        (``ctx.register_table(name, view)``, or ``ctx.register_view(name,
        df)``): the view's plan is inlined into every query that reads it,
        so those queries are distributed over the view's tables. In another
        context it reads tables that context does not know.
        """
        return self.df.into_view(temporary)

    @staticmethod
    def default_str_repr(
        batches: list[pa.RecordBatch],
        schema: pa.Schema,
        has_more: bool,
        table_uuid: str | None = None,
    ) -> str:
        """DataFusion's text of ``batches`` (its ``DataFrame.default_str_repr``, run nothing)."""
        return DataFrame.default_str_repr(batches, schema, has_more, table_uuid)

    # ------------------------------------------------------------------ misc
    def transform(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(self, *args)``: chain a function of a DataFrame as a method."""
        return func(self, *args)

    def count(self) -> int:
        """Run the query distributed and count its rows (a ``count(*)`` over it).

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        counted = self._transformed(
            "count", lambda: self.df.aggregate([], [F.count_star().alias("count")])
        )
        return counted.to_arrow_table().column(0)[0].as_py()

    def to_pydict(self) -> dict[str, list[Any]]:
        """Run the query; the result as ``{column: [values]}``.

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        return self.to_arrow_table().to_pydict()

    def cache(self) -> Self:
        """Run the query now (distributed) and keep the result as an in-memory table.

        Returns:
            A DataFrame reading that table (split across tasks as
            ``from_arrow``'s); the table stays registered in the context.

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        return self._derive(self.context.from_arrow(self.to_arrow_table()).df)

    def describe(self) -> Self:
        """Statistics of every column, as DataFusion 55's ``describe()``, computed distributed.

        Rows ``count``, ``null_count``, ``mean``, ``std``, ``min``, ``max``,
        ``median`` (column ``describe``); then one column per column of the
        query: float64 for a numeric one, else string (``"null"`` where a
        statistic does not apply). Runs the query now, as two distributed
        aggregates (:func:`~distfusion.dataframe.actions.describe_table`).

        Returns:
            A DataFrame over the 7 rows, an in-memory table of the context
            (as :meth:`cache`'s).

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        table = describe_table(self.df, lambda df: self._derive(df).to_arrow_table())
        return self._derive(self.context.from_arrow(table).df)

    def to_polars(self) -> Any:
        """Run the query; the result as a ``polars.DataFrame``.

        Raises:
            ImportError: polars is not installed (no dependency of
                distfusion's; ``pip install polars``); checked before the query runs.
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        try:  # optional dependency
            import polars
        except ImportError as exc:
            msg = "to_polars() needs polars: pip install polars (or use to_arrow_table())"
            raise ImportError(msg) from exc
        return polars.from_arrow(self.to_arrow_table())

    def collect_column(self, column_name: str) -> pa.Array | pa.ChunkedArray:
        """Run the query for column ``column_name`` alone; its values as one ``pyarrow.Array``.

        Raises:
            PlanningError: no column ``column_name``; as ``execute_stream``.
            TaskError, TransportError: as ``execute_stream``.
        """
        table = self._transformed("collect_column", lambda: self.df[column_name]).to_arrow_table()
        return table.column(0).combine_chunks()

    def collect_partitioned(self) -> list[list[pa.RecordBatch]]:
        """All result batches, as one partition: ``[collect()]``.

        The result comes out of the head stage, one task on the coordinator:
        one partition (DataFusion's are its single-node plan's).

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        return [self.collect()]

    def execute_stream_partitioned(self) -> list[Any]:
        """A stream per result partition: ``[execute_stream()]`` (as :meth:`collect_partitioned`).

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        return [self.execute_stream()]

    def write_table(self, table_name: str, write_options: Any = None) -> None:
        """Run the query distributed and insert its rows into the in-memory table ``table_name``.

        The rows come to the coordinator, where DataFusion inserts them as
        ``INSERT INTO table_name`` does (cast to the table's column types, by
        position); queries after it read the table's new rows.

        Args:
            table_name: a table of this context that takes rows (``CREATE
                TABLE``, ``register_table``, ``from_arrow``).
            write_options: None only (DataFusion's ``DataFrameWriteOptions``).

        Raises:
            ValueError: ``write_options`` is given.
            PlanningError: ``table_name`` is read from files (only memory
                tables take rows here), or DataFusion refuses the insert
                (an unknown table, columns that do not match).
            TaskError, TransportError: as ``execute_stream``.
        """
        if write_options is not None:
            msg = "write_table: write_options are not supported (rows are appended)"
            raise ValueError(msg)
        source = self.context.sources.get(sql_table_name(table_name))
        if source is not None and source.format != "memory":
            msg = (
                f"cannot write into table {table_name!r}: it is read from {source.format} "
                "files; write_table takes memory tables (CREATE TABLE, register_table, from_arrow)"
            )
            raise PlanningError(msg)
        ctx = self.context.ctx
        with registered(ctx, self.to_arrow_table()) as result:
            self.context._written = True  # memory tables are read again before the next query
            try:  # SQL's INSERT casts to the table's types (DataFusion's write_table does not)
                ctx.sql(f"INSERT INTO {table_name} SELECT * FROM {result}").collect()
            except Exception as exc:  # DataFusion's bare Exception
                raise PlanningError(f"write_table: {exc}") from exc

    def write_parquet_with_options(
        self, path: Any, options: Any, write_options: Any = None
    ) -> None:
        """Run the query distributed; DataFusion writes the result here, with ``options``.

        Every option of DataFusion's ``ParquetWriterOptions`` (compression,
        row group size, bloom filters, ...) and ``DataFrameWriteOptions``
        applies, as DataFusion's writer itself writes: one writer, on the
        coordinator, which holds the whole result. :meth:`write_parquet`
        writes in the tasks, one file each, with pyarrow's defaults.

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
            Exception: DataFusion's, when it cannot write ``path``.
        """
        ctx = self.context.ctx
        with registered(ctx, self.to_arrow_table()) as result:
            ctx.table(result).write_parquet_with_options(path, options, write_options)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """Run the query; its result as an Arrow PyCapsule stream (``pa.table(df)``, polars, ...).

        The query runs distributed and its batches stream through pyarrow's
        export as they come (:func:`~distfusion.dataframe.actions.arrow_stream`).

        Args:
            requested_schema: a ``pyarrow.Schema`` or a C schema capsule to
                cast the stream to, as DataFusion's.

        Raises:
            PlanningError, TaskError, TransportError: as ``execute_stream``.
        """
        return arrow_stream(self.schema(), self.execute_stream().batches, requested_schema)

    def __iter__(self) -> Iterator[Any]:
        """Run the query; iterate its batches (``execute_stream()``), as DataFusion's."""
        return iter(self.execute_stream())

    def __aiter__(self) -> AsyncIterator[Any]:
        """Run the query; iterate its batches asynchronously (``execute_stream()``)."""
        return self.execute_stream().__aiter__()
