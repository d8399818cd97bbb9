"""Strings read as dates and timestamps as Spark reads them, or a failure on the value.

``distfusion.spark_sql.parsing`` on the local runtime, no JVM. The answers are
Spark 4.3's for the same strings (tests/runtime/test_spark_sql_semantics.py
checks them against Spark); a string Spark may read otherwise fails the run
with a ``Cast error``, on which ``distfusion.spark.sql`` runs the query on Spark SQL.
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import SparkSettings, translate
from distfusion.spark_sql.parsing import Layout

UTC = datetime.UTC
D = datetime.date
T = datetime.datetime


def _context(zone: str = "UTC") -> DistributedContext:
    config = DistributedConfig(sql_dialect="spark", spark=SparkSettings(time_zone=zone))
    return DistributedContext(runtime=LocalRuntime(workers=1), config=config)


def _read(sql: str, texts: list[str | None], zone: str = "UTC") -> list:
    """The first column of ``sql`` over table ``t`` of strings ``x`` (ordered by ``k``)."""
    ctx = _context(zone)
    try:
        ctx.from_pydict(
            {"k": pa.array(range(len(texts)), pa.int32()), "x": pa.array(texts, pa.string())},
            name="t",
        )
        return ctx.sql(f"{sql} FROM t ORDER BY k").to_pydict()["v"]
    finally:
        ctx.close()


@pytest.mark.parametrize(
    ("pattern", "regex", "date", "time"),
    [
        (
            "dd/MM/yyyy",
            "^(0[1-9]|[12][0-9]|3[01])/(0[1-9]|1[0-2])/([1-9][0-9]{3})$",
            "${3}-${2}-${1}",
            None,
        ),
        (
            "yyyyMMdd",
            "^([1-9][0-9]{3})(0[1-9]|1[0-2])(0[1-9]|[12][0-9]|3[01])$",
            "${1}-${2}-${3}",
            None,
        ),
        (
            "M/d/yy",
            "^(0?[1-9]|1[0-2])/(0?[1-9]|[12][0-9]|3[01])/([0-9]{2})$",
            "20${3}-${1}-${2}",
            None,
        ),
        ("yyyy-MM", "^([1-9][0-9]{3})-(0[1-9]|1[0-2])$", "${1}-${2}-1", None),
        (
            "yyyy-MM-dd'T'HH:mm:ss.SSS",
            "^([1-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):"
            "([0-5][0-9]):([0-5][0-9])[.]([0-9]{3})$",
            "${1}-${2}-${3}",
            "${4}:${5}:${6}.${7}",
        ),
        (
            "yyyy.MM.dd HH",
            "^([1-9][0-9]{3})[.](0[1-9]|1[0-2])[.](0[1-9]|[12][0-9]|3[01]) ([01][0-9]|2[0-3])$",
            "${1}-${2}-${3}",
            "${4}:00:00",
        ),
    ],
)
def test_java_patterns_become_a_regex_and_iso_templates(pattern, regex, date, time):
    assert Layout.of(pattern) == Layout(pattern, regex, date, time)


@pytest.mark.parametrize(
    "pattern",
    [
        "YYYY-MM-dd",  # week-based: an error in Spark
        "y-MM-dd",  # 'y' alone: any number of digits
        "yyyy-MM-dd HH:mm a",  # am/pm
        "yyyy-MM-dd H:m:s",  # one-digit hours: not padded here
        "yyyyMd",  # one-or-two-digit fields side by side
        "yyyy-MM-dd HH:mm:ss.SSSSSSSSS",  # nanoseconds
        "yyyy-dd",  # a day without a month
        "MM-dd",  # no year
        "yyyy-MM-dd HH:ss",  # seconds without minutes
        "yyyy-MM-dd VV",  # a zone
        "yyyy-MM-dd''",  # a quote
        "yyyy-MM-dd[ HH]",  # an optional section
        "yyyy-MM-dd'T",  # unterminated
        "yyyy-MM-dd-yyyy",  # a field twice
    ],
)
def test_patterns_outside_the_subset_are_refused(pattern):
    with pytest.raises(SparkSemanticsError, match="datetime pattern"):
        Layout.of(pattern)


def test_to_date_reads_what_spark_reads():
    texts = ["31/01/2024", "29/02/2024", None, "01/12/1999"]
    got = _read("SELECT to_date(x, 'dd/MM/yyyy') AS v", texts)
    assert got == [D(2024, 1, 31), D(2024, 2, 29), None, D(1999, 12, 1)]
    got = _read("SELECT to_date(x, 'M/d/yy') AS v", ["1/5/24", "01/05/99", "12/31/00"])
    assert got == [D(2024, 1, 5), D(2099, 1, 5), D(2000, 12, 31)]
    got = _read("SELECT to_date(x, 'yyyyMMdd') AS v", ["20240105"])
    assert got == [D(2024, 1, 5)]
    got = _read("SELECT to_date(x, 'yyyy-MM-dd HH:mm:ss') AS v", ["2024-01-05 23:59:59"])
    assert got == [D(2024, 1, 5)]


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("yyyy-MM-dd", "2024-1-5"),  # widths: Spark's NULL (its error with ANSI mode)
        ("yyyy-MM-dd", " 2024-01-05"),
        ("yyyy-MM-dd", "2024-01-05 "),
        ("yyyy-MM-dd", "12024-01-05"),
        ("yyyy-MM-dd", "0999-01-05"),  # Spark reads it: Spark answers
        ("yyyy-MM-dd", "2024-02-30"),  # no such day
        ("yyyy-MM-dd", "2023-02-29"),
        ("yyyy-MM-dd", "2024-13-01"),
        ("yyyy-MM-dd", "banana"),
        ("yyyy-MM-dd", "２０２４-01-05"),  # not ASCII digits
        ("yyyy-MM-dd HH:mm:ss", "2024-01-05 24:00:00"),
        ("yyyy-MM-dd HH:mm:ss", "2024-01-05 23:59:60"),
        ("yyyy-MM-dd HH:mm:ss.SSS", "2024-01-05 10:11:12.5"),  # Spark reads it: Spark answers
    ],
)
def test_strings_spark_may_read_otherwise_fail_with_a_cast_error(pattern, text):
    for sql in (
        f"SELECT to_date(x, '{pattern}') AS v",
        f"SELECT to_timestamp(x, '{pattern}') AS v",
        f"SELECT unix_timestamp(x, '{pattern}') AS v",
    ):
        with pytest.raises(Exception, match="Cast error"):  # distfusion.spark's _VALUE_ERROR
            _read(sql, [text, "2024-01-05"])


def test_to_timestamp_and_unix_timestamp_in_utc():
    texts = ["2024-01-05 10:11:12.5", None, "1969-12-31 23:59:59.5"]
    got = _read("SELECT to_timestamp(x, 'yyyy-MM-dd HH:mm:ss.S') AS v", texts)
    assert got == [
        T(2024, 1, 5, 10, 11, 12, 500000, UTC),
        None,
        T(1969, 12, 31, 23, 59, 59, 500000, UTC),
    ]
    got = _read("SELECT unix_timestamp(x, 'yyyy-MM-dd HH:mm:ss.S') AS v", texts)
    assert got == [1704449472, None, 0]  # toward zero, as Spark
    got = _read("SELECT unix_timestamp(x) AS v", ["2024-01-05 10:11:12"])
    assert got == [1704449472]
    got = _read("SELECT to_timestamp(x, 'dd/MM/yyyy') AS v", ["05/01/2024"])
    assert got == [T(2024, 1, 5, tzinfo=UTC)]


def test_wall_times_at_a_fixed_offset():
    texts = ["2024-03-10 02:30:00", "2024-01-01 01:00:00"]
    got = _read("SELECT to_timestamp(x, 'yyyy-MM-dd HH:mm:ss') AS v", texts, "-03:30")
    assert got == [T(2024, 3, 10, 6, tzinfo=UTC), T(2024, 1, 1, 4, 30, tzinfo=UTC)]
    got = _read("SELECT unix_timestamp(x) AS v", texts[1:], "+05:30")
    assert got == [1704051000]
    got = _read("SELECT to_date(x, 'yyyy-MM-dd HH:mm:ss') AS v", texts, "+05:30")
    assert got == [D(2024, 3, 10), D(2024, 1, 1)]


def test_wall_times_in_a_zone_with_dst_changes_are_not_translated():
    # Spark: in Pacific/Apia to_date('2011-12-30', 'yyyy-MM-dd') is 2011-12-31 (a day skipped)
    schema = {"t": pa.schema([("x", pa.string())])}
    for zone in ("America/Los_Angeles", "Pacific/Apia"):
        for sql in (
            "SELECT to_date(x, 'yyyy-MM-dd') FROM t",
            "SELECT to_timestamp(x, 'yyyy-MM-dd HH:mm') FROM t",
            "SELECT unix_timestamp(x) FROM t",
        ):
            with pytest.raises(SparkSemanticsError, match="DST changes"):
                translate(sql, schema.get, SparkSettings(time_zone=zone))
    got = _read("SELECT CAST(x AS DATE) AS v", ["2011-12-30"], "Pacific/Apia")
    assert got == [D(2011, 12, 30)]  # Spark's cast of a string to a DATE has no zone


def test_cast_to_date_reads_what_spark_reads():
    texts = [
        "2024",
        "2024-1",
        "2024-1-5",
        "2024-01-05 garbage",
        "2024-01-05T",
        None,
        "2024-02-29T10:00",
    ]
    expected = [
        D(2024, 1, 1),
        D(2024, 1, 1),
        D(2024, 1, 5),
        D(2024, 1, 5),
        D(2024, 1, 5),
        None,
        D(2024, 2, 29),
    ]
    assert _read("SELECT CAST(x AS DATE) AS v", texts) == expected
    assert _read("SELECT to_date(x) AS v", texts) == expected
    for text in (" 2024-01-05", "2024 ", "2024-01-05x", "2024-02-30", "2024-001-05", "+2024-01-05"):
        with pytest.raises(Exception, match="Cast error"):
            _read("SELECT CAST(x AS DATE) AS v", [text])


def test_settings_that_change_the_reading_are_not_translated():
    schema = {"t": pa.schema([("x", pa.string())])}
    legacy = SparkSettings(time_parser_policy="LEGACY")
    for sql in ("SELECT to_date(x, 'yyyy-MM-dd') FROM t", "SELECT CAST(x AS DATE) FROM t"):
        with pytest.raises(SparkSemanticsError, match="LEGACY"):
            translate(sql, schema.get, legacy)
    ntz = SparkSettings(timestamp_ntz=True)
    with pytest.raises(SparkSemanticsError, match="TIMESTAMP_NTZ"):
        translate("SELECT to_timestamp(x, 'yyyy-MM-dd') FROM t", schema.get, ntz)
    assert translate("SELECT to_date(x, 'yyyy-MM-dd') FROM t", schema.get, ntz)
    with pytest.raises(SparkSemanticsError, match="short zone"):
        translate(
            "SELECT to_timestamp(x, 'yyyy-MM-dd') FROM t",
            schema.get,
            SparkSettings(time_zone="PST"),
        )


def test_a_pattern_is_read_as_written():
    # sqlglot's Spark reader makes YYYY, y and yyyy one strftime letter; Spark fails on YYYY
    schema = {"t": pa.schema([("x", pa.string()), ("d", pa.date32())])}
    for sql in ("SELECT to_date(x, 'YYYY-MM-dd') FROM t", "SELECT date_format(d, 'YYYY') FROM t"):
        with pytest.raises(SparkSemanticsError, match="'YYYY'"):
            translate(sql, schema.get)


def test_date_functions_of_strings_cast_them_as_spark():
    # Spark casts the string to a DATE first (its implicit cast), with no zone
    texts = ["2024-1-5 garbage", None, "2024-02-29"]
    assert _read("SELECT year(x) AS v", texts) == [2024, None, 2024]
    assert _read("SELECT datediff(x, '2024-01-01') AS v", texts) == [4, None, 59]
    assert _read("SELECT dayofmonth(x) AS v", ["2011-12-30"], "Pacific/Apia") == [30]
