"""Rules for dates and timestamps: Spark's calendar, time zones and datetime patterns.

Spark's ``TIMESTAMP`` is an instant shown in the session time zone
(``spark.sql.session.timeZone``); ``TIMESTAMP_NTZ`` a wall-clock time. The
plan carries instants as UTC; what depends on the local time of an instant
(``hour``, ``to_date``, ``date_trunc``, ``date_format``, ``from_unixtime``)
reads it with datafusion-spark's native ``from_utc_timestamp`` and the zone
as a literal, the one form of a zone that survives Substrait, in any tz
database zone or fixed offset (:mod:`distfusion.spark_sql.zones`, which
also gives ``java.time``'s answers past 2099 and across a gap or overlap).
A string literal compared with or cast to a timestamp is read as Spark
reads it (its wall time in the session's zone, the gap and overlap of a
DST change resolved as ``java.time`` resolves them) and written as the
instant, in every zone. A string read as a date or timestamp
(``to_date``, ``to_timestamp``, ``unix_timestamp``, ``CAST AS DATE``) is
read as Spark reads it, or the query runs on Spark SQL
(:mod:`distfusion.spark_sql.parsing`).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any, TypeGuard

from sqlglot import exp

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.datetime import to_chrono
from distfusion.spark_sql.nodes import T, Translation, cast_to, is_iso_date, unsupported
from distfusion.spark_sql.parsing import Layout, lenient_date, parsed_date, parsed_wall
from distfusion.spark_sql.zones import (
    UTC_ZONES,
    instant_of,
    local_time,
    python_zone,
    session_zone,
    truncated_instant,
)

__all__ = [
    "TIME_RULES",
    "UTC_ZONES",
    "compared",
    "instant_literal",
    "is_instant",
    "rule_cast",
    "shifted_date",
]

_INSTANTS = (T.TIMESTAMP, T.TIMESTAMPTZ, T.TIMESTAMPLTZ)
_STRINGS = (T.VARCHAR, T.TEXT)
_TIMESTAMP_TEXT = re.compile(
    r"^\s*(\d{4})-(\d{1,2})-(\d{1,2})"
    r"(?:[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,6}))?)?)?\s*$"
)
_ARROW_TYPES = {
    True: 'Timestamp(Microsecond, Some("UTC"))',
    False: "Timestamp(Microsecond, None)",
}


def is_instant(t: exp.DataType | None) -> bool:
    """Whether ``t`` is Spark's ``TIMESTAMP`` (an instant), not ``TIMESTAMP_NTZ``."""
    return t is not None and t.this in _INSTANTS


def _is_time(t: exp.DataType | None) -> TypeGuard[exp.DataType]:
    return t is not None and (t.this in _INSTANTS or t.this == T.TIMESTAMPNTZ)


def instant_literal(text: str, zone: str, instant: bool = True) -> exp.Expr | None:
    """Spark's cast of the string ``text`` to a timestamp, as a DataFusion literal; None if unsure.

    ``yyyy-[m]m-[d]d[( |T)[h]h:[m]m[:[s]s[.ffffff]]]``: a wall time in
    session zone ``zone`` (``instant``, Spark's ``TIMESTAMP``: written as the
    UTC instant) or no zone (``TIMESTAMP_NTZ``). Other forms (a zone suffix,
    a year alone) are left to Spark.
    """
    m = _TIMESTAMP_TEXT.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = [int(g) if g else 0 for g in m.groups()[:6]]
    micros = int((m.group(7) or "").ljust(6, "0") or 0)
    try:
        wall = datetime.datetime(year, month, day, hour, minute, second, micros)
    except ValueError:  # Spark: NULL, or an error with ANSI mode
        return None
    if instant:
        try:
            tz = python_zone(session_zone(zone))
        except SparkSemanticsError:  # a zone without a translation (session_zone says why)
            return None
        # fold=0: the earlier offset of an overlap, a gap's time shifted forward (java.time's)
        wall = wall.replace(tzinfo=tz).astimezone(datetime.UTC).replace(tzinfo=None)
    shown = wall.strftime("%Y-%m-%dT%H:%M:%S.%f") + ("Z" if instant else "")
    return exp.Anonymous(
        this="arrow_cast",
        expressions=[exp.Literal.string(shown), exp.Literal.string(_ARROW_TYPES[instant])],
    )


def compared(t: Translation, node: exp.Expr, other: exp.DataType) -> exp.Expr | None:
    """``node`` (compared with a value of type ``other``) as Spark casts it, or None.

    A string literal compared with a timestamp is that timestamp's literal;
    an ISO date literal compared with a DATE passes.
    """
    if other.this == T.DATE and is_iso_date(node):
        return node
    if _is_time(other) and isinstance(node, exp.Literal) and node.is_string:
        return instant_literal(node.this, t.settings.time_zone, is_instant(other))
    return None


def _zone(t: Translation, what: str) -> str | None:
    """The session's zone for :func:`~distfusion.spark_sql.zones.local_time`; None for UTC.

    Raises:
        SparkSemanticsError: a zone without a translation (the reason names it).
    """
    try:
        return session_zone(t.settings.time_zone)
    except SparkSemanticsError as exc:
        raise SparkSemanticsError(f"{what}() of a timestamp: {exc}") from exc


def _local(t: Translation, node: exp.Expr, what: str, ntz: bool = True) -> exp.Expr:
    """``node``, a timestamp, as one whose UTC fields are its local time in Spark, or raise.

    A ``TIMESTAMP``'s wall time in the session's zone; a ``TIMESTAMP_NTZ``
    as it is where Spark reads its fields without a zone (``ntz``), else the
    wall time of the ``TIMESTAMP`` Spark casts it to first (a time in a
    DST gap moves forward).
    """
    at = t.type_of(node)
    if not _is_time(at):
        shown = at.sql("spark") if at is not None else "an unknown type"
        raise SparkSemanticsError(f"{what}() of {shown} has no Spark-equal translation here")
    zone = _zone(t, what)
    if zone is None or (ntz and at.this == T.TIMESTAMPNTZ):
        return node
    if at.this == T.TIMESTAMPNTZ:
        return local_time(instant_of(node, zone), zone)
    return local_time(node, zone)


def rule_cast(t: Translation, node: exp.Cast) -> exp.Expr | None:
    """A cast to or from a timestamp Spark's way, or None when it is no such cast.

    ``CAST('...' AS TIMESTAMP)`` (and ``TIMESTAMP '...'``) of a literal; a
    timestamp to a DATE (its local date).

    Raises:
        SparkSemanticsError: a timestamp cast without a Spark-equal translation.
    """
    to, arg = node.to, node.this
    src = t.type_of(arg)
    if _is_time(to):
        if isinstance(arg, exp.Literal) and arg.is_string:
            out = instant_literal(arg.this, t.settings.time_zone, is_instant(to))
            if out is not None:
                return out
        if src is not None and src.this == to.this:
            return arg
        raise SparkSemanticsError(f"CAST of {arg.sql('spark')!r} to a timestamp: the casts differ")
    if to.this == T.DATE and src is not None and src.this in _STRINGS:
        _check_parser(t, "CAST AS DATE")
        return lenient_date(arg)
    if _is_time(src):
        if to.this == T.DATE:
            return cast_to(_local(t, arg, "CAST AS DATE"), "DATE")
        raise SparkSemanticsError(f"CAST of a timestamp to {to.sql('spark')}: the casts differ")
    return None


def _check_parser(t: Translation, what: str) -> None:
    """Raise unless Spark reads strings as dates with ``java.time`` (not ``LEGACY``)."""
    if t.settings.time_parser_policy.upper() == "LEGACY":
        msg = f"{what} of a string with spark.sql.legacy.timeParserPolicy LEGACY: not translated"
        raise SparkSemanticsError(msg)


def _fixed_zone(t: Translation, what: str) -> str | None:
    """The session's zone if it is UTC (None) or a fixed offset (``+hh:mm``), or raise.

    A wall time read from a string is an instant there without a gap or an
    overlap. In a zone with DST changes :func:`instant_of` would resolve
    them, but over a parsed string its SQL grows past a hundred kilobytes
    (it repeats the wall time), so the query runs on Spark SQL.
    """
    zone = _zone(t, what)
    if zone is not None and zone[0] not in "+-":
        msg = f"{what}() of a string in session time zone {zone!r} (a zone with DST changes)"
        raise SparkSemanticsError(f"{msg}: not translated")
    return zone


def _parsed_instant(t: Translation, node: exp.Expr, what: str) -> exp.Expr:
    """``node`` (``to_timestamp``, ``unix_timestamp`` of a string) read as Spark: an instant.

    The string's wall time in the session's zone (:func:`_fixed_zone`).
    """
    _check_parser(t, what)
    zone = _fixed_zone(t, what)
    wall = parsed_wall(node.this, Layout.of(_java_pattern(node.args.get("format"), what)))
    instant = exp.Anonymous(
        this="arrow_cast", expressions=[wall, exp.Literal.string(_ARROW_TYPES[True])]
    )
    if zone is None:
        return instant
    hours, minutes = zone[1:].split(":")
    seconds = (-1 if zone[0] == "-" else 1) * (int(hours) * 3600 + int(minutes) * 60)
    offset = exp.Anonymous(
        this="arrow_cast",
        expressions=[exp.Literal.number(seconds), exp.Literal.string("Duration(Second)")],
    )
    return exp.Paren(this=exp.Sub(this=instant, expression=offset))


def _rule_to_timestamp(t: Translation, node: exp.StrToTime) -> exp.Expr:
    """``to_timestamp(s, pattern)`` of a string: a TIMESTAMP (:func:`_parsed_instant`)."""
    at = t.type_of(node.this)
    if at is None or at.this not in _STRINGS or t.settings.timestamp_ntz:
        why = "spark.sql.timestampType TIMESTAMP_NTZ" if t.settings.timestamp_ntz else "a string"
        raise SparkSemanticsError(f"to_timestamp() of anything but {why}: not translated")
    return _parsed_instant(t, node, "to_timestamp")


def _rule_to_date(t: Translation, node: exp.TsOrDsToDate) -> exp.Expr:
    """``to_date(x[, pattern])`` (and a date function's argument as sqlglot reads it).

    A DATE as it is, an ISO date literal, a timestamp's local date; a
    string as Spark reads it: with a pattern, the local date of the
    instant ``to_timestamp`` reads (Spark's ``ParseToDate``), else
    ``CAST(s AS DATE)``.
    """
    if is_iso_date(node.this) and not node.args.get("format"):
        return cast_to(node.this, "DATE")
    at = t.type_of(node.this)
    if at is not None and at.this in _STRINGS:
        _check_parser(t, "to_date")
        if not node.args.get("format"):
            return lenient_date(node.this)
        _fixed_zone(t, "to_date")  # elsewhere a wall time in a gap may move to another day
        return parsed_date(node.this, Layout.of(_java_pattern(node.args["format"], "to_date")))
    if _is_time(at) and not node.args.get("format"):
        return cast_to(_local(t, node.this, "to_date"), "DATE")
    if at is None or at.this != T.DATE or node.args.get("format"):
        raise SparkSemanticsError("to_date() of a string has no Spark-equal translation")
    return node.this


_DATE_PARTS: dict[type[exp.Expr], str] = {
    exp.Year: "YEAR",
    exp.Month: "MONTH",
    exp.Day: "DAY",
    exp.DayOfMonth: "DAY",
    exp.Quarter: "QUARTER",
    exp.DayOfYear: "DOY",
    exp.WeekOfYear: "WEEK",  # ISO 8601 weeks in both
    exp.DayOfWeek: "DOW",  # DataFusion's 0 is Sunday, Spark's 1
}


def _rule_date_part(t: Translation, node: exp.Expr) -> exp.Expr:
    """``year(d)``, ``dayofweek(d)``, ``EXTRACT(... FROM d)`` of a DATE (INT in both)."""
    arg = node.expression if isinstance(node, exp.Extract) else node.this
    at = t.type_of(arg)
    if at is None or at.this != T.DATE:
        raise SparkSemanticsError(f"{unsupported(node)} over a non-DATE argument")
    if isinstance(node, exp.Extract):
        unit = node.this.name.upper()
        if unit not in ("YEAR", "MONTH", "DAY", "QUARTER"):
            raise SparkSemanticsError(f"EXTRACT({unit} ...) has no Spark-equal translation")
        return cast_to(node, "INT")
    unit = _DATE_PARTS[type(node)]
    part = cast_to(exp.Extract(this=exp.var(unit), expression=arg), "INT")
    return exp.Add(this=part, expression=exp.Literal.number(1)) if unit == "DOW" else part


def _days(node: exp.Expr) -> exp.Expr:
    """A DATE as its days since 1970-01-01 (INT)."""
    return exp.Anonymous(this="arrow_cast", expressions=[node, exp.Literal.string("Int32")])


def shifted_date(
    date: exp.Expr, days: exp.Expr, subtract: bool = False
) -> exp.Expr:
    """The DATE ``days`` (an integer) after ``date``, or before with ``subtract``."""
    kind = exp.Sub if subtract else exp.Add
    total = kind(this=_days(date), expression=cast_to(days, "INT"))
    return exp.Anonymous(this="arrow_cast", expressions=[total, exp.Literal.string("Date32")])


def _date_arg(t: Translation, node: exp.Expr, what: str) -> exp.Expr:
    """``node`` as a DATE: a DATE, or an ISO date literal cast (Spark casts it the same)."""
    if is_iso_date(node):
        return cast_to(node, "DATE")
    at = t.type_of(node)
    if at is None or at.this != T.DATE:
        shown = at.sql("spark") if at is not None else "an unknown type"
        raise SparkSemanticsError(f"{what}() of {shown} has no Spark-equal translation here")
    return node


def _rule_date_add(t: Translation, node: exp.TsOrDsAdd) -> exp.Expr:
    """``date_add(d, n)`` / ``date_sub(d, n)`` on a DATE: the day number plus ``n``."""
    unit = node.args.get("unit")
    if unit is not None and unit.name.upper() != "DAY":
        raise SparkSemanticsError(f"date_add by {unit.name} has no Spark-equal translation")
    days = node.expression
    dt = t.need(days, "date_add")
    if not st.is_integral(dt) or dt.this == T.BIGINT:
        raise SparkSemanticsError(f"date_add() by a {dt.sql('spark')}: Spark takes an INT")
    return shifted_date(_date_arg(t, node.this, "date_add"), days)


def _rule_datediff(t: Translation, node: exp.DateDiff) -> exp.Expr:
    """``datediff(end, start)`` of DATEs: days from ``start`` to ``end`` (INT)."""
    if node.args.get("unit") is not None:
        raise SparkSemanticsError("datediff() with a unit has no Spark-equal translation")
    end = _date_arg(t, node.this, "datediff")
    start = _date_arg(t, node.expression, "datediff")
    return exp.Paren(this=exp.Sub(this=_days(end), expression=_days(start)))


def _java_pattern(node: exp.Expr | None, what: str) -> str:
    """The Java pattern of a literal ``format`` argument, as written (``JavaPatterns``)."""
    if not (isinstance(node, exp.Literal) and node.is_string):
        raise SparkSemanticsError(f"{what}() with a pattern that is not a literal")
    return node.this


def _rule_date_format(t: Translation, node: exp.TimeToStr) -> exp.Expr:
    """``date_format(x, pattern)`` with a literal pattern: chrono's ``to_char``.

    A DATE with the letters of a date; a timestamp's local time
    (:func:`_local`) with those of a time of day too.
    """
    arg = node.this.this if isinstance(node.this, exp.TimeStrToTime) else node.this
    java = _java_pattern(node.args.get("format"), "date_format")
    if _is_time(t.type_of(arg)):
        chrono = to_chrono(java, times=True)
        arg = _local(t, arg, "date_format", ntz=False)
    else:
        chrono = to_chrono(java)
        arg = _date_arg(t, arg, "date_format")
    return exp.Anonymous(this="to_char", expressions=[arg, exp.Literal.string(chrono)])


def _rule_date_format_arg(t: Translation, node: exp.TimeStrToTime) -> exp.Expr:
    # sqlglot wraps date_format's argument; _rule_date_format reads through it.
    if isinstance(node.parent, exp.TimeToStr) and node.arg_key == "this":
        return node
    raise SparkSemanticsError(unsupported(node))


def _rule_interval(t: Translation, node: exp.Interval) -> exp.Expr:
    """``INTERVAL n DAY[S] | MONTH[S] | YEAR[S]`` added to or subtracted from a DATE."""
    unit = node.unit.name.upper() if node.unit else ""
    singular = unit.removesuffix("S")
    if not isinstance(node.parent, exp.Add | exp.Sub) or singular not in ("DAY", "MONTH", "YEAR"):
        raise SparkSemanticsError(
            f"INTERVAL {unit} outside date +/- has no Spark-equal translation"
        )
    return exp.Interval(this=node.this, unit=exp.var(singular))


_TIME_PARTS: dict[type[exp.Expr], str] = {
    exp.Hour: "HOUR",
    exp.Minute: "MINUTE",
    exp.Second: "SECOND",
}


def _rule_time_part(t: Translation, node: exp.Expr) -> exp.Expr:
    """``hour(ts)``, ``minute(ts)``, ``second(ts)``: the local time's field (INT)."""
    arg = _local(t, node.this, _TIME_PARTS[type(node)].lower())
    return cast_to(exp.Extract(this=exp.var(_TIME_PARTS[type(node)]), expression=arg), "INT")


_TRUNC_UNITS = {
    "YEAR": "year",
    "YYYY": "year",
    "YY": "year",
    "QUARTER": "quarter",
    "MONTH": "month",
    "MM": "month",
    "MON": "month",
    "WEEK": "week",
    "DAY": "day",
    "DD": "day",
    "HOUR": "hour",
    "MINUTE": "minute",
    "SECOND": "second",
}


def _rule_timestamp_trunc(t: Translation, node: exp.TimestampTrunc) -> exp.Expr:
    """``date_trunc(unit, ts)``: the local time truncated (weeks start on Monday in both)."""
    unit = _TRUNC_UNITS.get(node.unit.name.upper() if node.unit else "")
    if unit is None:
        shown = node.unit.sql("spark") if node.unit else "no unit"
        raise SparkSemanticsError(f"date_trunc() to {shown}: not translated")
    if not is_instant(t.type_of(node.this)):  # Spark makes a TIMESTAMP_NTZ a TIMESTAMP first
        raise SparkSemanticsError("date_trunc() of anything but a TIMESTAMP: not translated")
    zone = _zone(t, "date_trunc")
    if zone is not None:
        return truncated_instant(unit, node.this, zone)
    return exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit), node.this])


def _rule_unix_timestamp(t: Translation, node: exp.StrToUnix) -> exp.Expr:
    """``unix_timestamp(ts)``: whole seconds since the epoch, truncated toward zero (BIGINT).

    A string (with a pattern, ``yyyy-MM-dd HH:mm:ss`` by default) is read as
    ``to_timestamp`` reads it.
    """
    fmt = node.args.get("format")
    at = t.type_of(node.this) if node.this is not None else None
    if at is not None and at.this in _STRINGS:
        instant = _parsed_instant(t, node, "unix_timestamp")
        return exp.Anonymous(this="to_unixtime", expressions=[instant])
    if not is_instant(at) or (
        fmt is not None and _java_pattern(fmt, "unix_timestamp") != ("yyyy-MM-dd HH:mm:ss")
    ):
        raise SparkSemanticsError("unix_timestamp() of anything but a TIMESTAMP: not translated")
    return exp.Anonymous(this="to_unixtime", expressions=[node.this])


def _rule_from_unixtime(t: Translation, node: exp.UnixToStr) -> exp.Expr:
    """``from_unixtime(seconds[, pattern])``: the local time as text."""
    zone = _zone(t, "from_unixtime")
    at = t.need(node.this, "from_unixtime")
    if not st.is_integral(at):
        raise SparkSemanticsError(f"from_unixtime() of a {at.sql('spark')}: not translated")
    fmt = node.args.get("format")
    java = _java_pattern(fmt, "from_unixtime") if fmt is not None else "yyyy-MM-dd HH:mm:ss"
    seconds: exp.Expr = exp.Anonymous(
        this="to_timestamp_seconds", expressions=[cast_to(node.this, "BIGINT")]
    )
    if zone is not None:
        seconds = local_time(seconds, zone)
    chrono = exp.Literal.string(to_chrono(java, times=True))
    return exp.Anonymous(this="to_char", expressions=[seconds, chrono])


TIME_RULES: dict[type[exp.Expr], Callable[[Translation, Any], exp.Expr]] = {
    exp.TsOrDsToDate: _rule_to_date,
    exp.StrToTime: _rule_to_timestamp,
    exp.Extract: _rule_date_part,
    **{c: _rule_date_part for c in _DATE_PARTS},
    **{c: _rule_time_part for c in _TIME_PARTS},
    exp.TsOrDsAdd: _rule_date_add,
    exp.DateDiff: _rule_datediff,
    exp.TimeToStr: _rule_date_format,
    exp.TimeStrToTime: _rule_date_format_arg,
    exp.TimestampTrunc: _rule_timestamp_trunc,
    exp.StrToUnix: _rule_unix_timestamp,
    exp.UnixToStr: _rule_from_unixtime,
    exp.Interval: _rule_interval,
}
"""The node classes of dates and times -> their rules (part of ``translate.RULES``)."""
