"""Which ``SessionContext`` a DataFusion DataFrame was made on, and a short name of its query.

A :class:`~distfusion.context.DistributedContext` marks its ``SessionContext``
when it is made (:func:`mark_session`); :func:`check_session` refuses a
DataFrame made on another context, whose tables this one does not know.
"""

from __future__ import annotations

import re
import uuid

import pyarrow as pa
from datafusion import DataFrame, SessionContext, udf

from distfusion.errors import PlanningError

__all__ = ["check_session", "mark_session", "plan_label"]

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
