"""Spark's datetime patterns (Java ``DateTimeFormatter`` letters) as chrono format strings.

Spark formats and parses dates with the pattern letters of
https://spark.apache.org/docs/latest/sql-ref-datetime-pattern.html;
DataFusion's ``to_char`` takes chrono's ``strftime`` letters
(https://docs.rs/chrono/latest/chrono/format/strftime/). Only the letters
whose text is the same in both (English month and weekday names, zero
padding as Spark pads) are converted; any other letter stops the
translation, so the query runs on Spark SQL.
"""

from __future__ import annotations

from distfusion.errors import SparkSemanticsError

__all__ = ["DATE_LETTERS", "TIME_LETTERS", "to_chrono"]

DATE_LETTERS = {
    ("y", 4): "%Y",  # Spark pads a year to the letter count; years 1000..9999 read alike
    ("y", 2): "%y",
    ("M", 1): "%-m",
    ("M", 2): "%m",
    ("M", 3): "%b",
    ("M", 4): "%B",
    ("L", 1): "%-m",
    ("L", 2): "%m",
    ("d", 1): "%-d",
    ("d", 2): "%d",
    ("D", 1): "%-j",
    ("D", 3): "%j",
    ("E", 1): "%a",
    ("E", 2): "%a",
    ("E", 3): "%a",
    ("E", 4): "%A",
}
"""(Java letter, count) -> chrono specifier, for the fields of a DATE."""

TIME_LETTERS = {
    ("H", 1): "%-H",
    ("H", 2): "%H",
    ("h", 1): "%-I",
    ("h", 2): "%I",
    ("m", 1): "%-M",
    ("m", 2): "%M",
    ("s", 1): "%-S",
    ("s", 2): "%S",
    ("S", 3): "%3f",
    ("S", 6): "%6f",
    ("a", 1): "%p",
}
"""(Java letter, count) -> chrono specifier, for the time of day of a timestamp."""


def to_chrono(pattern: str, times: bool = False) -> str:
    """The chrono format that writes a DATE (``times``: a timestamp) as Spark's ``pattern`` does.

    Quoted text (``'T'``, ``''`` for a quote) and any character that is not
    a letter are copied; ``%`` is escaped.

    Raises:
        SparkSemanticsError: a letter (or letter count) outside
            :data:`DATE_LETTERS` (and with ``times``, :data:`TIME_LETTERS`),
            such as a zone or ``yyy``; an unterminated quote.
    """
    letters = {**DATE_LETTERS, **TIME_LETTERS} if times else DATE_LETTERS
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "'":
            end = pattern.find("'", i + 1)
            if end < 0 or (end > i + 1 and pattern.startswith("'", end + 1)):
                msg = f"datetime pattern {pattern!r}: an unterminated or nested quote"
                raise SparkSemanticsError(msg)
            out.append("'" if end == i + 1 else pattern[i + 1 : end].replace("%", "%%"))
            i = end + 1
            continue
        if ch.isascii() and ch.isalpha():
            run = 1
            while i + run < n and pattern[i + run] == ch:
                run += 1
            spec = letters.get((ch, run))
            if spec is None:
                msg = (
                    f"datetime pattern {pattern!r}: {ch * run!r} has no equal in DataFusion's "
                    "date formatting"
                )
                raise SparkSemanticsError(msg)
            out.append(spec)
            i += run
            continue
        out.append("%%" if ch == "%" else ch)
        i += 1
    return "".join(out)
