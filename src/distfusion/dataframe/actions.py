"""DataFusion's DataFrame actions, built on a distributed run of the query.

:class:`~distfusion.dataframe.Transformations` and
:class:`~distfusion.context.DistributedDataFrame` call these for the
methods of datafusion-python 55's ``DataFrame`` whose DataFusion
implementation runs the plan single node: the query runs distributed, and
what DataFusion does with the result (its statistics, its text, its Arrow
export, its writers) is done here, with DataFusion's own code where it has
one, so the answer is DataFusion's:

- :func:`describe_table`: ``describe()``'s statistics from two distributed
  aggregates (DataFusion runs seven single-node ones);
- :func:`arrow_stream`: the Arrow PyCapsule stream of ``pa.table(df)``;
- :func:`datafusion_repr`: ``repr(df)`` as DataFusion's, from the first rows;
- :func:`registered`: a result registered on the coordinator's context for
  DataFusion's writers (``write_table``, ``write_parquet_with_options``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from datafusion import DataFrame, Expr, SessionContext, col, lit
from datafusion import functions as F
from datafusion.dataframe_formatter import get_formatter

__all__ = ["DESCRIBE_STATS", "arrow_stream", "datafusion_repr", "describe_table", "registered"]

DESCRIBE_STATS = ("count", "null_count", "mean", "std", "min", "max", "median")
"""The rows of ``describe()``, in DataFusion 55's order (``DataFrame::describe``)."""


def _is_numeric(t: pa.DataType) -> bool:
    """arrow-rs's ``DataType::is_numeric``: integers, floats and decimals."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _stat(name: str, column: Expr, t: pa.DataType) -> Expr | None:
    """DataFusion's ``describe`` aggregate ``name`` of one column, or None where it has none.

    As ``DataFrame::describe`` in DataFusion 55: count and null count of
    every column; mean, std and median of numeric ones; min and max of all
    but binary and boolean ones. A Null-typed column has no min or max
    either (DataFusion shows its Null-typed result as ``"null"``).
    """
    numeric = _is_numeric(t)
    if name == "count":
        return F.count(column)
    if name == "null_count":
        return F.sum(F.when(column.is_null(), lit(1)).otherwise(lit(0)))
    if name in ("mean", "std", "median") and numeric:
        numeric_stats: dict[str, Callable[..., Expr]] = {
            "mean": F.avg,
            "std": F.stddev,
            "median": F.median,
        }
        return numeric_stats[name](column)
    if name in ("min", "max") and not (
        pa.types.is_binary(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
    ):
        return (F.min if name == "min" else F.max)(column)
    return None


def describe_table(df: DataFrame, run: Callable[[DataFrame], pa.Table]) -> pa.Table:
    """What DataFusion 55's ``df.describe()`` answers, computed by ``run`` (a distributed run).

    The statistics of :data:`DESCRIBE_STATS` for every column of ``df``,
    each cast in the query as DataFusion casts it (numeric columns to
    float64, others to string, so that a date or timestamp reads as
    DataFusion's cast writes it), a statistic a column has none of as the
    string ``"null"``. ``median`` does not decompose over tasks (the
    planner sends all rows to one task for it), so it is a second query,
    run only for numeric columns; the other statistics are one aggregate.

    Args:
        df: the query, on the coordinator's context.
        run: runs a DataFusion DataFrame of that context (distributed) and
            returns its result, one row here.

    Returns:
        One row per statistic: ``describe`` (string, not null), then one
        column per column of ``df``, float64 for a numeric one, else string.

    Raises:
        PlanningError, TaskError, TransportError: as ``run``.
    """
    schema = df.schema()
    columns = [col('"' + f.name.replace('"', '""') + '"') for f in schema]
    values: dict[tuple[str, int], Any] = {}
    for stats in (DESCRIBE_STATS[:-1], DESCRIBE_STATS[-1:]):
        exprs: list[Expr] = []
        keys: list[tuple[str, int]] = []
        for i, (f, column) in enumerate(zip(schema, columns, strict=True)):
            for name in stats:
                expr = _stat(name, column, f.type)
                if expr is not None:
                    target = pa.float64() if _is_numeric(f.type) else pa.string()
                    exprs.append(expr.cast(target).alias(f"describe_{len(keys)}"))
                    keys.append((name, i))
        if exprs:
            row = run(df.aggregate([], exprs)).to_pylist()[0]
            values.update((key, row[f"describe_{k}"]) for k, key in enumerate(keys))
    arrays = [pa.array(DESCRIBE_STATS, pa.string())]
    fields = [pa.field("describe", pa.string(), nullable=False)]
    for i, f in enumerate(schema):
        numeric = _is_numeric(f.type)
        got = [values.get((name, i), None if numeric else "null") for name in DESCRIBE_STATS]
        arrays.append(pa.array(got, pa.float64() if numeric else pa.string()))
        fields.append(pa.field(f.name, arrays[-1].type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def arrow_stream(
    schema: pa.Schema, batches: Iterator[pa.RecordBatch], requested_schema: Any = None
) -> Any:
    """An Arrow PyCapsule ``ArrowArrayStream`` over ``batches``, exported by pyarrow.

    Batches are pulled as the consumer reads (the query streams, as
    DataFusion's ``__arrow_c_stream__`` does); a consumer that releases the
    stream early drops ``batches`` (closing it cancels the query). The
    stream's schema is the first batch's (the query's: names, types,
    nullability), ``schema`` when there is none.

    Args:
        schema: the query's schema.
        batches: its result batches (``ResultStream.batches``).
        requested_schema: ``None``, a ``pyarrow.Schema`` or an Arrow C schema
            capsule: pyarrow casts the stream to it where it can.

    Raises:
        pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError: pyarrow
            cannot cast to ``requested_schema`` (raised when it is read).
        PlanningError, TaskError, TransportError: the query failed before
            its first batch (later errors come from the stream's reader).
    """
    first = next(batches, None)
    if first is not None:
        schema = first.schema

    def chained() -> Iterator[pa.RecordBatch]:
        try:
            if first is not None:
                yield first
            yield from batches
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    reader = pa.RecordBatchReader.from_batches(schema, chained())
    if requested_schema is not None and hasattr(requested_schema, "__arrow_c_schema__"):
        requested_schema = requested_schema.__arrow_c_schema__()
    return reader.__arrow_c_stream__(requested_schema)


def datafusion_repr(head: Callable[[int], pa.Table]) -> str:
    """``repr`` of a DataFusion DataFrame of the same rows: DataFusion's own text.

    DataFusion's ``repr`` runs the query and shows its first rows, as many
    as its HTML formatter's ``max_rows`` (``datafusion.dataframe_formatter``,
    10 by default; also its memory bound), then ``Data truncated.`` when
    there are more, or ``No data to display``. ``head(n)`` gives the first
    ``n`` rows (the query run with a ``LIMIT``); one more row than shown is
    asked for, so DataFusion sees whether there are more.

    Raises:
        PlanningError, TaskError, TransportError: as ``head``.
    """
    table = head(get_formatter().max_rows + 1)
    if table.num_columns == 0 or table.num_rows == 0:
        return "No data to display"
    return repr(SessionContext().from_arrow(table))


@contextmanager
def registered(ctx: SessionContext, table: pa.Table) -> Iterator[str]:
    """``table`` registered in ``ctx`` under a fresh name while the block runs; yields the name.

    For DataFusion's writers on the coordinator's context (its object
    stores and tables): ``write_table`` inserts into a table of ``ctx``.
    The name is ``__distfusion_result_<32 hex digits>``, deregistered when
    the block ends.
    """
    name = f"__distfusion_result_{uuid.uuid4().hex}"
    batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    ctx.register_record_batches(name, [batches])
    try:
        yield name
    finally:
        ctx.deregister_table(name)
