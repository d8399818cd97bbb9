"""The DataFrame API: DataFusion's transformations, distributed when an action runs.

A :class:`~distfusion.context.DistributedDataFrame` wraps a DataFusion
``DataFrame`` built on the coordinator's ``SessionContext``
(``DistributedContext.ctx``). Each transformation of :class:`Transformations`
is DataFusion's own, applied to that DataFrame: it builds a new logical plan on
the coordinator (checked there: an unknown column fails at once, with
DataFusion's message) and returns a new distributed DataFrame around it.
Nothing runs until an action (``collect``, ``to_arrow_table``, ``count``,
``write_parquet``, ...): then the optimized plan goes through Substrait and
the distributed planner, as a SQL query does::

    from datafusion import col, lit, functions as F
    from distfusion import DistributedContext, LocalRuntime

    ctx = DistributedContext(runtime=LocalRuntime(workers=4))
    lineitem = ctx.read_parquet("data/tpch-sf1/lineitem/")
    df = (
        lineitem.filter(col("l_quantity") > lit(45))
        .aggregate([col("l_returnflag")], [F.sum(col("l_extendedprice")).alias("total")])
        .sort(col("l_returnflag"))
    )
    df.explain()                  # the stages, as for ctx.sql(...)
    df.to_arrow_table()

Expressions are DataFusion's (``datafusion.col``, ``lit``,
``datafusion.functions``, window functions included), and the names and
signatures are those of datafusion-python 55's ``DataFrame``, so code written
for DataFusion runs distributed by changing where its first DataFrame comes
from. :class:`Readers` gives :class:`~distfusion.context.DistributedContext`
those first DataFrames: ``table``, ``read_parquet``, ``read_csv``,
``from_arrow``, ``from_pydict``, ``from_pylist``, ``from_pandas`` and
``from_datafusion``.

A DataFrame built on another ``SessionContext`` reads tables this context
does not know, so it is refused (:func:`check_session`). The coordinator's
context carries a marker function, registered when the
:class:`~distfusion.context.DistributedContext` is made
(:func:`mark_session`); DataFusion copies a context's functions into every
DataFrame made on it, so a DataFrame that cannot resolve the marker was made
elsewhere. docs/dataframe.md has the details.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Self

import pyarrow as pa
from datafusion import DataFrame, Expr, SessionContext, udf
from datafusion import functions as F

from distfusion.errors import DistfusionError, PlanningError

__all__ = ["Readers", "Transformations", "check_session", "mark_session", "plan_label"]

JoinHow = Literal["inner", "left", "right", "full", "semi", "anti"]

_SCANNED = re.compile(r"TableScan: ([^\s]+)")


def mark_session(ctx: SessionContext) -> str:
    """Register a marker function on ``ctx``; its name tells ``ctx``'s DataFrames apart.

    DataFusion copies a context's functions into each DataFrame made on it
    (``SessionContext.table``, ``sql``, ``from_arrow``, and every DataFrame
    derived from those), so ``df.parse_sql_expr("<marker>()")`` resolves only
    for DataFrames made on ``ctx`` after this call. The function is never
    called: it takes no argument, returns a boolean, and no plan uses it.
    Called once by :class:`~distfusion.context.DistributedContext`'s
    constructor, before any DataFrame is made on its context.

    Returns:
        The marker's name, ``distfusion_session_<32 hex digits>``.
    """
    name = f"distfusion_session_{uuid.uuid4().hex}"
    ctx.register_udf(udf(_marker, [], pa.bool_(), "volatile", name=name))
    return name


def _marker() -> pa.Array:  # pragma: no cover - never called
    return pa.array([True])


def check_session(ctx: SessionContext, marker: str, df: DataFrame) -> None:
    """Raise unless ``df`` was made on ``ctx`` (marked by :func:`mark_session` as ``marker``).

    Two checks: ``df``'s own session is ``ctx`` (the marker resolves in it),
    and every table its plan scans is registered in ``ctx`` (DataFusion lets a
    DataFrame join one from another context; its tables are unknown here).
    A table of another context that has a name and schema of this one cannot
    be told apart by the second check: the distributed run reads this
    context's table of that name.

    Raises:
        TypeError: ``df`` is not a ``datafusion.DataFrame``.
        PlanningError: ``df`` was made on another ``SessionContext``, or
            scans a table ``ctx`` does not know (the message names it).
    """
    if not isinstance(df, DataFrame):
        msg = f"expected a datafusion.DataFrame, got {type(df).__name__}"
        raise TypeError(msg)
    try:
        df.parse_sql_expr(f"{marker}()")
    except Exception as exc:  # DataFusion's: "Invalid function ..."
        msg = (
            "the DataFrame was made on another SessionContext, whose tables this "
            "DistributedContext does not know: build it from this context (ctx.table(name), "
            "ctx.read_parquet(path), ctx.ctx.sql(query), ...) or register its tables here"
        )
        raise PlanningError(msg) from exc
    text = df.logical_plan().display_indent()
    for name in dict.fromkeys(_SCANNED.findall(text)):
        if not _table_exists(ctx, name):
            msg = (
                f"the DataFrame scans table {name!r}, which this DistributedContext does not "
                "know (it comes from a DataFrame of another SessionContext); register it here"
            )
            raise PlanningError(msg)


def _table_exists(ctx: SessionContext, shown: str) -> bool:
    """Whether ``ctx`` has the table a plan shows as ``shown`` (``t``, ``T1``, ``cat.schema.t``).

    A plan shows names as registered, case kept and unquoted; DataFusion's
    ``table_exist`` parses its argument as SQL, folding unquoted parts to lower
    case, so each part is also tried double-quoted (and the whole name, for a
    table whose name holds a dot).
    """

    def quoted(part: str) -> str:
        return '"' + part.replace('"', '""') + '"'

    for candidate in (shown, ".".join(quoted(p) for p in shown.split(".")), quoted(shown)):
        try:
            if ctx.table_exist(candidate):
                return True
        except Exception:  # DataFusion's: not a name it can parse
            continue
    return False


def plan_label(df: DataFrame) -> str:
    """A short name of ``df``'s query (its top plan node, on one line), shown in Spark's UI."""
    try:
        top = df.logical_plan().display()
    except Exception:  # DataFusion's: a label is not worth failing for
        return "DataFrame"
    text = " ".join(top.split())
    return f"DataFrame {text}"[:80]


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


class Transformations:
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
        return self._transformed(
            "join",
            lambda: self.df.join(
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


class Readers:
    """The first DataFrames of a :class:`~distfusion.context.DistributedContext` (a mixin).

    The class using it has ``ctx`` (its DataFusion ``SessionContext``),
    ``_marker`` (:func:`mark_session`'s name), the ``register_*`` methods, and
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

        Raises:
            PlanningError: no table ``name`` (DataFusion's message).
        """
        self._reread_memory_tables()
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
