"""The checks before a query is planned, or run on the coordinator alone.

Whether the query's context is still open (:func:`check_open`), what the
Substrait plan lost (:func:`lost_in_substrait`), whether the runtime can read
the Spark DataFrames a stage graph reads (:func:`check_spark_reads`), and
whether a query run whole on the coordinator reads a table only tasks can
read (:func:`check_coordinator_reads`). A failed check is a
:class:`~distfusion.errors.PlanningError` (a closed context's a
:class:`~distfusion.errors.ContextClosedError`) raised before any task
starts, or the reason a query runs on the coordinator only.
"""

from __future__ import annotations

import re

from datafusion import DataFrame, SessionContext

from distfusion.coordinator.query_run import Runtime, RuntimeProfile
from distfusion.errors import ContextClosedError, PlanningError
from distfusion.io.sources import TableSource, sql_name
from distfusion.planner.detect_substrait_losses import substrait_losses
from distfusion.stages import StageGraph
from distfusion.substrait_plan.decode import consume_plan, fits_decoder, parse_plan


def lost_in_substrait(ctx: SessionContext, logical, plan_bytes: bytes) -> str | None:
    """What of the optimized plan ``logical`` its Substrait ``plan_bytes`` does not carry.

    Read from the plan's structure, never its text
    (:func:`~distfusion.planner.detect_substrait_losses.substrait_losses`:
    ``IGNORE NULLS``, ``DISTINCT`` and ``FILTER`` of window functions, ``RANGE``
    frames with an offset, casts to a timestamp zone other than UTC; in a
    subquery, what such a property may sit on). A plan
    too deep for DataFusion's decoder even in pieces (an expression nested
    about 30 deep, such as a sum of 40 columns) is not carried either: only
    such plans are consumed again, and the views their pieces need are dropped
    from ``ctx`` afterwards.

    Returns:
        A sentence naming what was lost, or None when nothing known was.

    Raises:
        Exception: DataFusion's error when it rejects ``plan_bytes`` otherwise.
    """
    lost = substrait_losses(logical, ctx, parse_plan(plan_bytes))
    if lost:
        return (
            f"Substrait does not carry {'; '.join(lost)} "
            "(DataFusion's producer drops it without an error)"
        )
    if fits_decoder(plan_bytes):
        return None
    tables = ctx.catalog().schema().names()
    try:
        consume_plan(ctx, plan_bytes)
    except Exception as exc:  # DataFusion raises bare Exception
        if "recursion limit" not in str(exc):
            raise
        return "the plan nests deeper than DataFusion's Substrait decoder allows"
    finally:
        for name in ctx.catalog().schema().names() - tables:
            ctx.deregister_table(name)
    return None


def check_open(closed: bool, runtime: object | None) -> None:
    """Refuse to run a query of a :class:`~distfusion.context.DistributedContext` closed.

    Args:
        closed: the context's ``closed``.
        runtime: its runtime, None when it never started.

    Raises:
        ContextClosedError: ``closed``; names the runtime that was stopped.
    """
    if closed:
        stopped = f" (its {type(runtime).__name__} is stopped)" if runtime is not None else ""
        msg = (
            f"this DistributedContext was closed{stopped}: its queries cannot run; "
            "make a new DistributedContext (a `with` block closes it at its end)"
        )
        raise ContextClosedError(msg)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters (for a reason)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"(Unsupported plan type: \w+) \{.*", r"\1", text)  # not the whole plan
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_spark_reads(graph: StageGraph, runtime: Runtime) -> None:
    """Raise unless ``runtime`` can read the Spark DataFrames ``graph`` reads.

    Raises:
        PlanningError: a stage reads a Spark DataFrame and ``runtime`` is not
            the Spark runtime (names the table and the runtime).
    """
    if RuntimeProfile.of(runtime).reads_spark_dataframes:
        return
    for stage in graph.stages:
        for scan in stage.scans:
            if scan.source.is_spark:
                msg = (
                    f"table {scan.source.name!r} is a Spark DataFrame, read by Spark's "
                    "executors: only the Spark runtime (SparkRuntime, distfusion.spark.sql) "
                    f"runs a query reading it, and this context runs on "
                    f"{getattr(runtime, 'name', type(runtime).__name__)!r}; use a "
                    "SparkRuntime, or write the DataFrame to Parquet and register_parquet it"
                )
                raise PlanningError(msg)


_SCAN = re.compile(r"TableScan: ([^\s]+)(?: projection=\[([^\]]*)\])?")


def tables_read(df: DataFrame, names) -> list[str]:
    """The tables of ``names`` that ``df``'s plan scans (from its rendered logical plan)."""
    return list(scanned_bytes(df, dict.fromkeys(names)))


def scanned_bytes(df: DataFrame, sources: dict) -> dict[str, int]:
    """Bytes each table of ``sources`` that ``df``'s plan scans reads, in its plan's order.

    ``sources``: table name -> :class:`~distfusion.io.sources.TableSource` (or
    None, to learn only which tables are scanned: 0 bytes each). The bytes
    are the uncompressed bytes of the columns each scan projects
    (:meth:`TableSource.projected_bytes`), summed over the table's scans,
    read from the rendered optimized logical plan (``TableScan: name
    projection=[...]``); a scan without a projection reads every column.
    """
    if not sources:
        return {}
    by_name = {}
    for name in sources:
        by_name[name] = by_name[sql_name(name)] = name
    read: dict[str, int] = {}
    for scan in _SCAN.finditer(df.optimized_logical_plan().display_indent()):
        table, projection = scan.groups()
        name = by_name.get(table)
        if name is None:
            continue
        source = sources[name]
        columns = None
        if projection is not None:
            columns = [c.strip() for c in projection.split(",") if c.strip()]
        read[name] = read.get(name, 0) + (0 if source is None else source.projected_bytes(columns))
    return read


def check_coordinator_reads(
    df: DataFrame,
    sources: dict[str, TableSource],
    reason: str,
    not_on_coordinator: dict[str, str] | None = None,
) -> None:
    """Refuse a coordinator-only query over a table only leaf tasks can read.

    The coordinator's DataFusion context knows a Spark DataFrame or a
    feed-backed table (an Iceberg table, a ``ListingFeed``) as an empty
    table with its schema: single-node DataFusion running the query there
    would read no row of it and answer as if it were empty. Tables in
    ``not_on_coordinator`` (name -> why) cannot be read here either (a Delta
    table whose reader DataFusion lacks a store for).

    Raises:
        PlanningError: the query scans such a table (names it and what to do).
    """
    streamed = tables_read(df, [n for n, s in sources.items() if s.streamed])
    if streamed:
        name = streamed[0]
        if sources[name].is_spark:
            msg = (
                f"table {name!r} is a Spark DataFrame, read only by Spark tasks, but "
                f"this query runs on the coordinator only ({reason}); "
                "use spark.sql for it, or write the table to Parquet first"
            )
        else:
            msg = (
                f"table {name!r} is a feed-backed table (an Iceberg table or a work unit "
                f"feed), read only by distributed tasks, but this query runs on the "
                f"coordinator only ({reason}), where the table has no rows; copy what the "
                f"query needs into a memory table first (CREATE TABLE {name}_copy AS SELECT "
                f"... FROM {name}: that runs distributed) and query the copy, or rewrite the "
                "query so it is distributed"
            )
        raise PlanningError(msg)
    task_only = not_on_coordinator or {}
    unreadable = tables_read(df, task_only)
    if unreadable:
        table = unreadable[0]
        msg = (
            f"table {table!r} is read only by tasks, but this query runs on the "
            f"coordinator only ({reason}): {task_only[table]}; write the query so "
            "that it distributes, or read the table's result first (ctx.sql(...).to_arrow_table())"
        )
        raise PlanningError(msg)
