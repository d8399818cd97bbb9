"""Whether a unit's column statistics allow a row to pass a read's filter: file skipping.

A table format that records, per data file, each column's minimum, maximum and
null count (Delta's log, Iceberg's manifests, Parquet footers) lets a reader
skip the files none of whose rows can pass the query's filter -- Delta's data
skipping, Iceberg's metrics evaluator, Spark's and Trino's min/max pruning.
:func:`might_match` is that test over the plain predicates of
:mod:`distfusion.work_unit_feed.filters`, for any source: the planner skips
the units of a file source whose ``unit_stats`` rule them out
(:mod:`distfusion.planner.skip_units`); a feed provider may call it on what
its catalog tells it.

Statistics of one unit: ``{column: (min, max, null_count)}``, each of them
None when unknown, a column absent when nothing is known of it. ``min`` and
``max`` must bound every non-null value of the column in the unit (a NaN
included: leave a float column's bounds out when it may hold NaN, which
Parquet statistics do not count); ``null_count`` must be the exact number of
NULLs, or None. The test is conservative: anything it cannot decide (an
unknown statistic, values of types Python does not order together) might
match, so a unit is skipped only when no row of it can pass.

Example:
    >>> from distfusion.work_unit_feed.filters import Comparison, IsNull
    >>> stats = {"x": (10, 20, 0)}
    >>> might_match((Comparison(">", "x", 25),), stats)
    False
    >>> might_match((Comparison(">=", "x", 20),), stats)
    True
    >>> might_match((IsNull("x"),), stats)
    False
"""

from __future__ import annotations

import datetime
from typing import Any

from distfusion.work_unit_feed.filters import And, Comparison, Filter, In, IsNull, Not, Or

__all__ = ["ColumnStats", "might_match"]

ColumnStats = tuple[Any, Any, int | None]
"""``(min, max, null_count)`` of one column in one unit; each None when unknown."""

_NEGATED = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def might_match(
    filters: tuple[Filter, ...],
    stats: dict[str, ColumnStats] | None,
    num_rows: int | None = None,
) -> bool:
    """Whether a row of a unit with ``stats`` might pass every predicate of ``filters``.

    Args:
        filters: a conjunction of predicates (``FeedContext.filters``,
            :func:`distfusion.planner.scan_filters.scan_filters`).
        stats: the unit's statistics, ``{column: (min, max, null_count)}``;
            None or empty: nothing known, so the unit might match.
        num_rows: the unit's row count when known: a column whose
            ``null_count`` equals it holds only NULLs.

    Returns:
        False only when the statistics prove that no row passes; True otherwise.
    """
    if not stats:
        return True
    return all(_can_be(f, True, stats, num_rows) for f in filters)


def _can_be(f: Filter, truth: bool, stats: dict[str, ColumnStats], rows: int | None) -> bool:
    """Whether ``f`` might be ``truth`` (not NULL) for some row of the unit."""
    if isinstance(f, And):
        parts = (_can_be(c, truth, stats, rows) for c in f.children)
        return all(parts) if truth else any(parts)
    if isinstance(f, Or):
        parts = (_can_be(c, truth, stats, rows) for c in f.children)
        return any(parts) if truth else all(parts)
    if isinstance(f, Not):
        return _can_be(f.child, not truth, stats, rows)
    if isinstance(f, IsNull):
        return _is_null_can_be(f.column, f.negated != truth, stats, rows)
    if isinstance(f, In):
        if truth:
            return any(_compare_can_be(f.column, "=", v, stats, rows) for v in f.values)
        return all(_compare_can_be(f.column, "!=", v, stats, rows) for v in f.values)
    if isinstance(f, Comparison):
        op = f.op if truth else _NEGATED.get(f.op)
        if op is None:
            return True
        return _compare_can_be(f.column, op, f.value, stats, rows)
    return True  # a predicate this module does not know: might be anything


def _is_null_can_be(column: str, null: bool, stats: dict[str, ColumnStats], rows) -> bool:
    """Whether some row's ``column`` might be NULL (``null``) or not NULL."""
    s = stats.get(column)
    if s is None or s[2] is None:
        return True
    nulls = s[2]
    if null:
        return nulls > 0
    return rows is None or nulls < rows


def _compare_can_be(column: str, op: str, value, stats: dict[str, ColumnStats], rows) -> bool:
    """Whether ``column op value`` might be true for some row (a NULL never makes it true)."""
    s = stats.get(column)
    if s is None or value is None:
        return True
    low, high, nulls = s
    if nulls is not None and rows is not None and nulls >= rows:
        return False  # only NULLs: no comparison is true
    low, value_low = _comparable(low, value)
    high, value_high = _comparable(high, value)
    try:
        if op == "=":
            return (low is None or low <= value_low) and (high is None or value_high <= high)
        if op == "!=":
            return not (low is not None and high is not None and low == value_low == high)
        if op == "<":
            return low is None or low < value_low
        if op == "<=":
            return low is None or low <= value_low
        if op == ">":
            return high is None or high > value_high
        if op == ">=":
            return high is None or high >= value_high
    except TypeError:  # values Python does not order together: undecided
        return True
    return True


def _comparable(stat, value) -> tuple[Any, Any]:
    """``(stat, value)`` made comparable: zoned date-times as naive UTC (filters' convention).

    A filter's ``datetime`` value is naive (UTC for a zoned column); a
    statistic may carry its zone.
    """
    if isinstance(stat, datetime.datetime) and isinstance(value, datetime.datetime):
        if stat.tzinfo is not None and value.tzinfo is None:
            stat = stat.astimezone(datetime.UTC).replace(tzinfo=None)
        elif value.tzinfo is not None and stat.tzinfo is None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return stat, value
