"""Spark's reading of strings as dates and timestamps, as DataFusion SQL.

``to_date(s, pattern)``, ``to_timestamp(s, pattern)`` and
``unix_timestamp(s, pattern)`` read ``s`` with ``java.time``'s
``DateTimeFormatter`` (Spark 4, ``spark.sql.legacy.timeParserPolicy``
``CORRECTED`` or ``EXCEPTION``); ``CAST(s AS DATE)`` and ``to_date(s)`` with
Spark's own reader (``SparkDateTimeUtils.stringToDate``). Each is written
here as the subset of the strings Spark reads whose answer is certain:

- an anchored regular expression (Rust's ``regex``, ASCII digits) built
  from the pattern: each letter of :data:`FIELDS` with exactly the digits
  and range ``java.time`` reads for it (``MM``: two digits, 01..12; ``M``:
  one or two), literals as written (``-``, ``/``, ``:``, ``'T'``);
- a matching string rewritten (``regexp_replace``) to the ISO text of its
  date and time of day, which DataFusion's cast reads as the same values;
  the DATE cast fails on a day its month lacks (``2024-02-30``);
- any other string made a text no cast reads (``'not yyyy-MM-dd: ' || s``),
  so the native run fails with Arrow's ``Cast error`` and the query runs
  again as ``spark.sql(q)`` (``distfusion.spark.SparkDataFrame.collect``):
  Spark's NULL, or its error in ANSI mode. NULL stays NULL.

What Spark reads outside the subset (``'2024-1-5'`` with ``M``'s one
digit written ``M``, a fraction shorter than its ``S`` letters, a year
before 1000) thus gets Spark's answer too, more slowly. A pattern letter
outside :data:`FIELDS` (a zone, ``a``, the week-based ``Y``, ``y`` alone)
stops the translation. Spark 4.3's answers, checked on a session (and by
tests/runtime/test_spark_sql_semantics.py): ``yyyy-MM-dd`` rejects
``2024-1-5``, `` 2024-01-05`` and ``2024-01-05 ``; ``M`` and ``d`` read one
or two digits (and more: ``001``); ``SSS`` reads one to three digits as a
fraction; ``yy`` is 2000..2099; ``HH`` 24, a minute or second 60 is no
time; the week-based ``YYYY`` is an error.

A pattern names a wall time in the session's time zone: ``to_timestamp``
and ``unix_timestamp`` give its instant, ``to_date`` the local date of that
instant (Spark casts ``to_timestamp``'s answer to a DATE), which is the
wall time's own date in UTC and at a fixed offset. In a zone with DST
changes a wall time in a gap moves: in ``Pacific/Apia``, whose 2011-12-30
never was, Spark's ``to_date('2011-12-30', 'yyyy-MM-dd')`` is 2011-12-31
(:mod:`~distfusion.spark_sql.time_rules` translates these in UTC and at
fixed offsets only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.spark import Spark

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql.nodes import cast_to

__all__ = ["FIELDS", "JavaPatterns", "Layout", "lenient_date", "parsed_date", "parsed_wall"]

FIELDS = {
    ("y", 4): ("year", "[1-9][0-9]{3}"),  # java.time reads 4..19 digits; years 1000..9999 here
    ("y", 2): ("year", "[0-9]{2}"),  # 2000..2099
    ("M", 2): ("month", "0[1-9]|1[0-2]"),
    ("M", 1): ("month", "0?[1-9]|1[0-2]"),
    ("d", 2): ("day", "0[1-9]|[12][0-9]|3[01]"),
    ("d", 1): ("day", "0?[1-9]|[12][0-9]|3[01]"),
    ("H", 2): ("hour", "[01][0-9]|2[0-3]"),
    ("m", 2): ("minute", "[0-5][0-9]"),
    ("s", 2): ("second", "[0-5][0-9]"),
    **{("S", n): ("fraction", f"[0-9]{{{n}}}") for n in range(1, 7)},
}
"""(Java letter, count) -> (field, the digits java.time reads for it here, as a regex)."""

# each field needs the one before it: a pattern names a date, then a time of day to its end
_NEEDS = {
    "month": "year",
    "day": "month",
    "minute": "hour",
    "second": "minute",
    "fraction": "second",
}
_LITERALS = frozenset("-/:., _")  # unquoted characters read as themselves
# quoted text read natively; no quote or backslash: Spark's SQL writer escapes them with one
_QUOTED = re.compile(r"[A-Za-z0-9 \-/:.,_]+")
_TIMESTAMP = "Timestamp(Microsecond, None)"
# Spark's stringToDate, trimmed aside: yyyy, yyyy-[m]m, yyyy-[m]m-[d]d followed by ' ' or 'T' and
# anything; a sign, a year of 5 to 7 digits or before 1000, and blanks around are Spark's
_YEAR = "[1-9][0-9]{3}"
_LENIENT = (
    (f"^{_YEAR}$", "-01-01"),
    (f"^{_YEAR}-[0-9]{{1,2}}$", "-01"),
)
_LENIENT_DAY = f"(?s)^({_YEAR}-[0-9]{{1,2}}-[0-9]{{1,2}})(?:[ T].*)?$"


class JavaPatterns(Spark):
    """Spark's SQL dialect for reading, with datetime patterns kept as written.

    sqlglot's Spark dialect turns a pattern into ``strftime`` letters when it
    parses, and several Java letters become one (``YYYY``, ``y`` and
    ``yyyy`` are all ``%Y``): reading with this dialect keeps the pattern's
    own text in the ``format`` of ``to_date``, ``date_format``, ...
    """

    @classmethod
    def format_time(cls, expression):  # noqa: D102 (sqlglot's)
        if isinstance(expression, str):  # a default pattern, quoted
            return exp.Literal.string(expression[1:-1])
        return expression


@dataclass(frozen=True)
class Layout:
    """A Java datetime pattern as the strings it reads here and their ISO text.

    Attributes:
        pattern: the Java pattern, as written.
        regex: anchored; matches only strings ``java.time`` reads with the pattern.
        date: ``regexp_replace`` template of a match's date (``yyyy-m-d``).
        time: template of its time of day (``HH:mm:ss[.f]``), or None (midnight).
    """

    pattern: str
    regex: str
    date: str
    time: str | None

    @classmethod
    def of(cls, pattern: str) -> Layout:
        """The layout of Java ``pattern``.

        Raises:
            SparkSemanticsError: a letter or count outside :data:`FIELDS`, a
                field twice or without the one it needs (a day without a
                month, minutes without hours), a one-digit-or-more field
                next to another field (java.time's adjacent value parsing),
                a literal outside ``- / : . , _`` and quoted letters.
        """
        tokens = _tokens(pattern)
        groups: dict[str, tuple[int, int]] = {}  # field -> (group number, letter count)
        parts = []
        for i, (letter, count) in enumerate(tokens):
            if count == 0:
                parts.append(letter.replace(".", "[.]"))  # the one metacharacter of _LITERALS
                continue
            field, digits = FIELDS.get((letter, count), (None, None))
            if field is None or field in groups:
                msg = f"datetime pattern {pattern!r}: {letter * count!r} is not parsed natively"
                raise SparkSemanticsError(msg)
            variable = count == 1 or letter == "S"
            neighbours = [tokens[j] for j in (i - 1, i + 1) if 0 <= j < len(tokens)]
            if variable and any(n[1] for n in neighbours):
                msg = f"datetime pattern {pattern!r}: {letter * count!r} next to another field"
                raise SparkSemanticsError(msg)
            groups[field] = (len(groups) + 1, count)
            parts.append(f"({digits})")
        for field, needed in _NEEDS.items():
            if field in groups and needed not in groups:
                msg = f"datetime pattern {pattern!r}: a {field} without a {needed}"
                raise SparkSemanticsError(msg)
        if "year" not in groups:
            raise SparkSemanticsError(f"datetime pattern {pattern!r}: no year")

        def value(field: str, default: str) -> str:
            if field not in groups:
                return default
            number, count = groups[field]
            return ("20" if field == "year" and count == 2 else "") + f"${{{number}}}"

        date = f"{value('year', '')}-{value('month', '1')}-{value('day', '1')}"
        time = None
        if "hour" in groups:
            time = f"{value('hour', '')}:{value('minute', '00')}:{value('second', '00')}"
            if "fraction" in groups:
                time += "." + value("fraction", "")
        return cls(pattern, "^" + "".join(parts) + "$", date, time)


def _tokens(pattern: str) -> list[tuple[str, int]]:
    """``pattern`` as (letter, count) runs and (literal text, 0).

    Raises:
        SparkSemanticsError: an unterminated quote, a character outside
            the literals read natively.
    """
    out: list[tuple[str, int]] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "'":
            end = pattern.find("'", i + 1)
            text = pattern[i + 1 : end]
            if end < 0 or not _QUOTED.fullmatch(text):
                msg = f"datetime pattern {pattern!r}: a quote not parsed natively"
                raise SparkSemanticsError(msg)
            out.append((text, 0))
            i = end + 1
        elif ch.isascii() and ch.isalpha():
            run = 1
            while i + run < n and pattern[i + run] == ch:
                run += 1
            out.append((ch, run))
            i += run
        elif ch in _LITERALS:
            out.append((ch, 0))
            i += 1
        else:
            msg = f"datetime pattern {pattern!r}: {ch!r} is not parsed natively"
            raise SparkSemanticsError(msg)
    return out


def _call(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=[a.copy() for a in args])


def _text(value: str) -> exp.Expr:
    return exp.Literal.string(value)


def _unreadable(s: exp.Expr, what: str) -> exp.Expr:
    """``'not <what>: ' || s``: no cast reads it (it fails the run); NULL for NULL."""
    shown = what.replace("'", "")
    return exp.DPipe(this=_text(f"not {shown}: "), expression=s.copy())


def _date_text(s: exp.Expr, layout: Layout) -> exp.Expr:
    regex = _text(layout.regex)
    return exp.Case(
        ifs=[
            exp.If(
                this=_call("regexp_like", s, regex),
                true=_call("regexp_replace", s, regex, _text(layout.date)),
            )
        ],
        default=_unreadable(s, layout.pattern),
    )


def parsed_date(s: exp.Expr, layout: Layout) -> exp.Expr:
    """The DATE of string ``s`` read with ``layout`` (its time of day checked, then dropped).

    A string ``layout`` does not read, or a day its month lacks, fails the
    run with a ``Cast error`` (Spark decides: module docstring).
    """
    return cast_to(_date_text(s, layout), "DATE")


def parsed_wall(s: exp.Expr, layout: Layout) -> exp.Expr:
    """The wall time (a timestamp without zone, microseconds) of string ``s`` read with ``layout``.

    Fails the run as :func:`parsed_date` does.
    """
    date = parsed_date(s, layout)
    if layout.time is None:
        return _call("arrow_cast", date, _text(_TIMESTAMP))
    iso = exp.DPipe(
        this=exp.DPipe(this=cast_to(date, "VARCHAR"), expression=_text("T")),
        expression=_call("regexp_replace", s, _text(layout.regex), _text(layout.time)),
    )
    return _call("arrow_cast", iso, _text(_TIMESTAMP))


def lenient_date(s: exp.Expr) -> exp.Expr:
    """Spark's ``CAST(s AS DATE)`` of a string: ``yyyy``, ``yyyy-[m]m``, ``yyyy-[m]m-[d]d[( |T)*]``.

    What else Spark reads (blanks around, a sign, a longer year) and what
    it does not fail the run with a ``Cast error`` (Spark decides).
    """
    ifs = [
        exp.If(
            this=_call("regexp_like", s, _text(regex)),
            true=exp.DPipe(this=s.copy(), expression=_text(suffix)),
        )
        for regex, suffix in _LENIENT
    ]
    ifs.append(
        exp.If(
            this=_call("regexp_like", s, _text(_LENIENT_DAY)),
            true=_call("regexp_replace", s, _text(_LENIENT_DAY), _text("${1}")),
        )
    )
    return cast_to(exp.Case(ifs=ifs, default=_unreadable(s, "a date")), "DATE")
