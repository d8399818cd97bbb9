"""Spark SQL constructs, each run by ``distfusion.spark.sql`` and by Spark on one session.

Every case names a construct, its query over the table ``sem`` (:data:`SEM_ROWS`,
NULLs in every column) or ``dst`` (:data:`DST_ROWS`, times around DST changes),
the session time zone it runs in if not the session's own, and how distfusion
runs it: ``native`` (translated with Spark's semantics, no fallback) or
``spark`` (handed to Spark SQL, with the reason). tests/runtime/test_spark_sql_semantics.py checks both the
answer (names, types and values equal Spark's) and the mode, and the
compatibility table of docs/spark.md is rendered from this list
(:func:`compatibility_table`), so it cannot drift.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass

import pyarrow as pa

D = decimal.Decimal

SEM_ROWS = pa.table(
    {
        "i": pa.array([1, 2, 3, None, 7, -4], pa.int32()),
        "b": pa.array([10, None, 30, 40, 2**40, -5], pa.int64()),
        "d": pa.array(
            [D("1.25"), D("2.50"), None, D("-3.35"), D("12345.67"), D("0.05")], pa.decimal128(7, 2)
        ),
        "s": pa.array(["apple", "banana", None, "avocado", "cherry", "apple"], pa.string()),
        "dt": pa.array(
            [
                datetime.date(2024, 1, 31),
                datetime.date(2024, 2, 29),
                None,
                datetime.date(2023, 12, 1),
                datetime.date(2024, 1, 15),
                datetime.date(2024, 3, 1),
            ],
            pa.date32(),
        ),
        "f": pa.array([0.5, 2.675, None, -1.5, 3.0, 1e10], pa.float64()),
        # instants around New York's DST changes of 2024 (01:30 EST, 03:30 EDT; 01:30
        # twice in November), and half a second before the epoch
        "ts": pa.array(
            [
                datetime.datetime(2024, 3, 10, 6, 30),
                datetime.datetime(2024, 3, 10, 7, 30),
                None,
                datetime.datetime(2024, 11, 3, 5, 30, 15, 250000),
                datetime.datetime(2024, 11, 3, 6, 30),
                datetime.datetime(1969, 12, 31, 23, 59, 59, 500000),
            ],
            pa.timestamp("us", tz="UTC"),
        ),
        "tn": pa.array(
            [
                datetime.datetime(2024, 3, 10, 2, 30),
                None,
                datetime.datetime(2024, 1, 1),
                datetime.datetime(2024, 11, 3, 1, 30),
                datetime.datetime(2023, 12, 31, 23, 59, 59),
                datetime.datetime(2024, 6, 1, 12),
            ],
            pa.timestamp("us"),
        ),
        "ai": pa.array([[1, 2], [3, None], None, [], [2, 2, 1], [5]], pa.list_(pa.int32())),
        "st": pa.array(
            [
                {"a": 1, "b": "x"},
                None,
                {"a": None, "b": "z"},
                {"a": 4, "b": None},
                {"a": 7, "b": "q"},
                {"a": -4, "b": "x"},
            ],
            pa.struct([("a", pa.int32()), ("b", pa.string())]),
        ),
        "m": pa.array(
            [[("k", 1)], None, [], [("k", None), ("j", 2)], [("j", 7)], [("k", -4), ("z", 0)]],
            pa.map_(pa.string(), pa.int32()),
        ),
    }
)


# UTC instants of DST changes of 2024: Los Angeles (02:00 PST -> 03:00 PDT, 02:00 PDT
# -> 01:00 PST), Berlin (02:00 CET -> 03:00 CEST, 03:00 CEST -> 02:00 CET), Sydney
# (03:00 AEDT -> 02:00 AEST, 02:00 AEST -> 03:00 AEDT)
DST_CHANGES = [
    datetime.datetime(2024, 3, 10, 10),
    datetime.datetime(2024, 11, 3, 9),
    datetime.datetime(2024, 3, 31, 1),
    datetime.datetime(2024, 10, 27, 1),
    datetime.datetime(2024, 4, 6, 16),
    datetime.datetime(2024, 10, 5, 16),
]
# wall times in those zones' gaps and overlaps, and next to them
DST_WALLS = [
    datetime.datetime(2024, 3, 10, 2, 30),
    datetime.datetime(2024, 11, 3, 1, 30),
    datetime.datetime(2024, 3, 31, 2, 30),
    datetime.datetime(2024, 10, 27, 2, 30),
    datetime.datetime(2024, 10, 6, 2, 30),
    datetime.datetime(2024, 4, 7, 2, 30),
]
_AROUND = [-90, -61, -30, -1, 0, 1, 30, 59, 61, 90]  # minutes
# past 2099 (java.time goes on with a zone's last rule), and a zone's first changes
_FAR = [
    datetime.datetime(2099, 12, 31, 23, 30),
    datetime.datetime(2100, 1, 1, 0, 30),
    datetime.datetime(2150, 1, 15, 12),
    datetime.datetime(2150, 7, 4, 12),
    datetime.datetime(2200, 6, 1, 0, 15),
    datetime.datetime(2261, 8, 1, 12),
    datetime.datetime(1883, 11, 18, 20, 30),
    datetime.datetime(1893, 4, 1, 0, 30),
    datetime.datetime(1700, 1, 1, 0, 0, 1),
]
_DST_TIMES = [
    change + datetime.timedelta(minutes=m, seconds=(7 * n) % 60, microseconds=250000 * (n % 3))
    for change in DST_CHANGES
    for n, m in enumerate(_AROUND)
] + _FAR
DST_ROWS = pa.table(
    {
        "k": pa.array(range(len(_DST_TIMES) + 1), pa.int32()),
        "ts": pa.array([*_DST_TIMES, None], pa.timestamp("us", tz="UTC")),
        "tn": pa.array(
            [w + datetime.timedelta(minutes=m) for w in DST_WALLS for m in _AROUND]
            + [t + datetime.timedelta(minutes=30) for t in _FAR]
            + [None],
            pa.timestamp("us"),
        ),
        "b": pa.array(
            [
                int(t.replace(tzinfo=datetime.UTC).timestamp()) - 3600 * (n % 2)
                for n, t in enumerate(_DST_TIMES)
            ]
            + [None],
            pa.int64(),
        ),
    }
)
"""Instants around the DST changes of 2024 in three zones and from 1700 to 2261 (``ts``),
wall times in and next to their gaps and overlaps (``tn``), seconds since the epoch
near them (``b``)."""


@dataclass(frozen=True)
class Case:
    """One construct: its name, a query showing it, ``native`` or ``spark``, the session zone."""

    construct: str
    sql: str
    mode: str
    note: str = ""
    zone: str = ""


CASES = [
    Case("ORDER BY (NULLs first ascending)", "SELECT i FROM sem ORDER BY i", "native"),
    Case("ORDER BY DESC (NULLs last)", "SELECT s FROM sem ORDER BY s DESC, i", "native"),
    Case(
        "ORDER BY ... LIMIT over a nullable key", "SELECT d FROM sem ORDER BY d LIMIT 2", "native"
    ),
    Case(
        "ORDER BY ... NULLS LAST / DESC NULLS FIRST",
        "SELECT i, s, sum(i) OVER (ORDER BY i NULLS LAST, s ROWS 1 PRECEDING) AS w "
        "FROM sem ORDER BY s DESC NULLS FIRST, i NULLS LAST",
        "native",
    ),
    Case(
        "`/` on integers", "SELECT i, i / 2 AS h, b / i FROM sem ORDER BY i", "native", "a double"
    ),
    Case(
        "`/` on decimals",
        "SELECT d / 3.00 AS q, d / i FROM sem ORDER BY d",
        "native",
        "Spark's precision and scale, rounded half up",
    ),
    Case("`div`, `%` on integers", "SELECT b div 3, b % 3 FROM sem ORDER BY b", "native"),
    Case(
        "decimal `*`, `+`, `-`",
        "SELECT d * d, d + 1, 1 - d, d * 1.5 FROM sem ORDER BY d",
        "native",
        "Spark's result types",
    ),
    Case(
        "integer `+ - *`",
        "SELECT i + 1, i * i, b - i FROM sem ORDER BY i",
        "native",
        "Spark's widths; overflow fails with ANSI mode",
    ),
    Case(
        "number literals",
        "SELECT 1, 1.5, 100.00, 1e3, 3000000000",
        "native",
        "`1.5` a decimal, `1e3` a double",
    ),
    Case(
        "sum, count, min, max",
        "SELECT sum(d), sum(i), count(*), count(s), min(s), max(dt) FROM sem",
        "native",
    ),
    Case(
        "avg of decimals",
        "SELECT avg(d), avg(d * 3) FROM sem",
        "native",
        "decimal(p+4,s+4), half up",
    ),
    Case("avg of integers and doubles", "SELECT avg(i), avg(f) FROM sem", "native"),
    Case("COUNT(DISTINCT)", "SELECT count(DISTINCT s) FROM sem", "native"),
    Case(
        "GROUP BY, HAVING",
        "SELECT s, sum(d) AS t FROM sem GROUP BY s HAVING count(*) > 0 ORDER BY s",
        "native",
    ),
    Case("ROLLUP", "SELECT s, sum(i) FROM sem GROUP BY ROLLUP(s) ORDER BY s, 2", "native"),
    Case(
        "CUBE, GROUPING SETS, WITH ROLLUP, grouping()",
        "SELECT s, i, sum(b), grouping(s) FROM sem GROUP BY s, i GROUPING SETS ((s), (s, i), ()) "
        "UNION ALL SELECT s, i, sum(b), grouping(i) FROM sem GROUP BY s, i WITH ROLLUP",
        "native",
    ),
    Case(
        "round of a decimal",
        "SELECT round(d, 1), round(d) FROM sem ORDER BY d",
        "native",
        "half up",
    ),
    Case(
        "CASE mixing a decimal and an integer",
        "SELECT CASE WHEN i > 1 THEN d ELSE 0 END AS c FROM sem ORDER BY i",
        "native",
    ),
    Case("if()", "SELECT if(i > 1, 'big', 'small') AS c FROM sem ORDER BY i", "native"),
    Case("coalesce", "SELECT coalesce(i, 0), coalesce(d, 0) FROM sem ORDER BY i", "native"),
    Case("LIKE", "SELECT s FROM sem WHERE s LIKE 'a%' ORDER BY s", "native"),
    Case("RLIKE / REGEXP", "SELECT s FROM sem WHERE s RLIKE '^a.*e$' ORDER BY s", "native"),
    Case(
        "concat with a NULL",
        "SELECT concat(s, '-', i) AS c FROM sem ORDER BY i",
        "native",
        "NULL when an argument is",
    ),
    Case(
        "upper, lower, length, substring",
        "SELECT upper(s), lower(s), length(s), substring(s, 2, 3) FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "year(), month(), EXTRACT",
        "SELECT year(dt), month(dt), EXTRACT(DAY FROM dt) FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "date +/- INTERVAL",
        "SELECT dt + INTERVAL '1' MONTH, dt - INTERVAL '3' DAY, dt + interval 30 days, "
        "dt - interval 2 years FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "date compared with a string literal",
        "SELECT count(*) FROM sem WHERE dt >= '2024-01-15'",
        "native",
    ),
    Case(
        "CAST of numbers and dates",
        "SELECT CAST(i AS BIGINT), CAST(d AS DOUBLE), CAST(dt AS STRING) FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "window rank, row_number",
        "SELECT i, rank() OVER (ORDER BY d) AS r, "
        "row_number() OVER (PARTITION BY s ORDER BY i) AS n FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "window avg of decimals",
        "SELECT i, avg(d) OVER (PARTITION BY s) AS a FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "IN and EXISTS subqueries",
        "SELECT i FROM sem a WHERE i IN (SELECT i FROM sem WHERE i > 1) "
        "AND EXISTS (SELECT 1 FROM sem b WHERE b.i = a.i) ORDER BY i",
        "native",
    ),
    Case(
        "scalar subquery", "SELECT i, (SELECT max(i) FROM sem) AS m FROM sem ORDER BY i", "native"
    ),
    Case(
        "UNION ALL, INTERSECT, EXCEPT",
        "SELECT i FROM sem UNION ALL SELECT i FROM sem EXCEPT SELECT 7 ORDER BY i",
        "native",
    ),
    Case(
        "INTERSECT ALL, EXCEPT ALL",
        "SELECT i FROM sem UNION ALL SELECT i FROM sem EXCEPT ALL SELECT i FROM sem",
        "spark",
        "DataFusion answers them as a semi / anti join",
    ),
    Case(
        "LEFT SEMI / ANTI JOIN",
        "SELECT a.i FROM sem a LEFT SEMI JOIN sem b ON a.i = b.i + 1 ORDER BY 1",
        "native",
    ),
    Case(
        "WITH (CTE)",
        "WITH x AS (SELECT s, d * 2 AS dd FROM sem) SELECT s, sum(dd) FROM x GROUP BY s ORDER BY s",
        "native",
    ),
    Case(
        "join hints (BROADCAST, MERGE, SHUFFLE_HASH, SHUFFLE_REPLICATE_NL)",
        "SELECT /*+ BROADCAST(b), MERGE(c) */ count(*) FROM sem a JOIN sem b ON a.i = b.i "
        "JOIN sem c ON a.s = c.s",
        "native",
        "followed where the join type allows, by Spark's rules (alias or table name in the "
        "hint's query block, BROADCAST > MERGE > SHUFFLE_HASH); SHUFFLE_REPLICATE_NL changes "
        "nothing",
    ),
    Case(
        "partitioning hints (REPARTITION, COALESCE, REBALANCE)",
        "SELECT /*+ REPARTITION(3, s), COALESCE(2), REBALANCE */ s, count(*) FROM sem "
        "GROUP BY s ORDER BY s",
        "native",
        "accepted, not followed: the planner sizes the stages",
    ),
    Case(
        "date_format of a DATE",
        "SELECT date_format(dt, 'yyyy-MM-dd'), date_format(dt, 'd/M/yy EEE MMM'), "
        "date_format(dt, 'EEEE, MMMM dd yyyy \\'at\\' D') FROM sem ORDER BY dt",
        "native",
        "Java pattern letters of a date: y M L d D E",
    ),
    Case(
        "date_format of a DATE with a time of day",
        "SELECT date_format(dt, 'yyyy-MM-dd HH:mm') FROM sem",
        "spark",
    ),
    Case(
        "TIMESTAMP and TIMESTAMP_NTZ columns",
        "SELECT ts, tn, max(ts) OVER () AS m FROM sem ORDER BY ts",
        "native",
        "`toArrow()`'s UTC; `to_pandas()` in the session time zone, as `toPandas()`",
    ),
    Case(
        "timestamp compared with a string, BETWEEN, IN, TIMESTAMP literal",
        "SELECT i FROM sem WHERE ts >= '2024-03-10 07:00' OR tn < '2024-01-01' "
        "OR ts BETWEEN '1969-12-31' AND TIMESTAMP '1970-01-01 00:00:00.25' "
        "OR ts IN ('2024-11-03 06:30:00') ORDER BY i",
        "native",
        "the text is a wall time in the session time zone, as Spark reads it",
    ),
    Case(
        "hour, minute, second, to_date, CAST AS DATE of timestamps",
        "SELECT hour(ts), minute(ts), second(ts), to_date(ts), CAST(ts AS DATE), year(ts), "
        "hour(tn), CAST(tn AS DATE) FROM sem ORDER BY ts",
        "native",
        "a TIMESTAMP's local time in the session time zone, a TIMESTAMP_NTZ's own",
    ),
    Case(
        "hour, minute, second, to_date, CAST AS DATE across DST changes, in Los Angeles",
        "SELECT k, hour(ts), minute(ts), second(ts), to_date(ts), CAST(ts AS DATE), "
        "hour(tn), minute(tn), CAST(tn AS DATE) FROM dst ORDER BY k",
        "native",
        "any tz database zone or fixed offset (java.time's rules past 2099 too)",
        "America/Los_Angeles",
    ),
    Case(
        "local times across DST changes, in Berlin",
        "SELECT k, hour(ts), minute(ts), second(ts), to_date(ts), CAST(ts AS DATE) "
        "FROM dst ORDER BY k",
        "native",
        "",
        "Europe/Berlin",
    ),
    Case(
        "local times across DST changes, in Sydney",
        "SELECT k, hour(ts), to_date(ts), CAST(tn AS DATE) FROM dst ORDER BY k",
        "native",
        "",
        "Australia/Sydney",
    ),
    Case(
        "local times in Kolkata (a half-hour offset)",
        "SELECT k, hour(ts), minute(ts), to_date(ts) FROM dst ORDER BY k",
        "native",
        "",
        "Asia/Kolkata",
    ),
    Case(
        "local times at a fixed offset (-03:30)",
        "SELECT k, hour(ts), minute(ts), to_date(ts) FROM dst ORDER BY k",
        "native",
        "`+05:30`, `-08:00`, `GMT+5` as java.time reads them",
        "-03:30",
    ),
    Case(
        "local times in a short zone ID (PST)",
        "SELECT k, hour(ts) FROM dst ORDER BY k",
        "spark",
        "java.time's `SHORT_IDS` (`PST`, `EST`)",
        "PST",
    ),
    Case(
        "date_trunc",
        "SELECT date_trunc('DAY', ts), date_trunc('hour', ts), date_trunc('week', ts), "
        "date_trunc('MM', ts) FROM sem ORDER BY ts",
        "native",
        "in the session time zone",
    ),
    Case(
        "date_trunc across DST changes, in Los Angeles",
        "SELECT k, date_trunc('SECOND', ts), date_trunc('MINUTE', ts), date_trunc('HOUR', ts), "
        "date_trunc('DAY', ts), date_trunc('WEEK', ts), date_trunc('MONTH', ts), "
        "date_trunc('QUARTER', ts), date_trunc('YEAR', ts) FROM dst ORDER BY k",
        "native",
        "a gap or overlap resolved as `java.time` resolves it",
        "America/Los_Angeles",
    ),
    Case(
        "date_trunc across DST changes, in Berlin",
        "SELECT k, date_trunc('MINUTE', ts), date_trunc('HOUR', ts), date_trunc('DAY', ts), "
        "date_trunc('WEEK', ts), date_trunc('MONTH', ts) FROM dst ORDER BY k",
        "native",
        "",
        "Europe/Berlin",
    ),
    Case(
        "date_trunc across DST changes, in Sydney",
        "SELECT k, date_trunc('HOUR', ts), date_trunc('DAY', ts), date_trunc('YEAR', ts) "
        "FROM dst ORDER BY k",
        "native",
        "",
        "Australia/Sydney",
    ),
    Case(
        "date_trunc in Kolkata",
        "SELECT k, date_trunc('HOUR', ts), date_trunc('DAY', ts), date_trunc('QUARTER', ts) "
        "FROM dst ORDER BY k",
        "native",
        "",
        "Asia/Kolkata",
    ),
    Case(
        "date_format of a timestamp",
        "SELECT date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSS'), date_format(tn, 'h:mm a') "
        "FROM sem ORDER BY ts",
        "native",
        "letters y M L d D E H h m s S a; in the session time zone",
    ),
    Case(
        "date_format, from_unixtime across DST changes, in Los Angeles",
        "SELECT k, date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSS'), date_format(tn, 'yyyy-MM-dd HH:mm'), "
        "from_unixtime(b), from_unixtime(b, 'yyyy/MM/dd h:mm a') FROM dst ORDER BY k",
        "native",
        "a TIMESTAMP_NTZ formatted as the TIMESTAMP Spark casts it to (a gap's time moves on)",
        "America/Los_Angeles",
    ),
    Case(
        "date_format, from_unixtime across DST changes, in Berlin",
        "SELECT k, date_format(ts, 'yyyy-MM-dd HH:mm:ss'), date_format(tn, 'HH:mm'), "
        "from_unixtime(b) FROM dst ORDER BY k",
        "native",
        "",
        "Europe/Berlin",
    ),
    Case(
        "date_format, from_unixtime across DST changes, in Sydney",
        "SELECT k, date_format(ts, 'yyyy-MM-dd HH:mm'), date_format(tn, 'yyyy-MM-dd HH:mm'), "
        "from_unixtime(b, 'yyyy-MM-dd HH') FROM dst ORDER BY k",
        "native",
        "",
        "Australia/Sydney",
    ),
    Case(
        "unix_timestamp, from_unixtime",
        "SELECT unix_timestamp(ts), from_unixtime(b), from_unixtime(i, 'yyyy/MM/dd HH') "
        "FROM sem ORDER BY ts",
        "native",
        "in the session time zone",
    ),
    Case(
        "to_timestamp, unix_timestamp of a string",
        "SELECT i, to_timestamp(date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSS'), "
        "'yyyy-MM-dd HH:mm:ss.SSS'), unix_timestamp(date_format(ts, 'yyyy-MM-dd HH:mm:ss')), "
        "unix_timestamp(date_format(ts, 'dd/MM/yy HH:mm'), 'dd/MM/yy HH:mm'), "
        "to_timestamp('2024-02-29 23:59', 'yyyy-MM-dd HH:mm') FROM sem ORDER BY i",
        "native",
        "pattern letters yyyy yy MM M dd d HH mm ss S..S; another string runs the query on Spark SQL",
    ),
    Case(
        "to_timestamp, unix_timestamp, to_date of strings at a fixed offset (-03:30)",
        "SELECT i, to_timestamp(date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSS'), "
        "'yyyy-MM-dd HH:mm:ss.SSS'), unix_timestamp(date_format(ts, 'yyyyMMddHHmm'), "
        "'yyyyMMddHHmm'), to_date(date_format(ts, 'dd/MM/yyyy HH'), 'dd/MM/yyyy HH') "
        "FROM sem ORDER BY i",
        "native",
        "a wall time in the session time zone: UTC or a fixed offset",
        "-03:30",
    ),
    Case(
        "to_timestamp, to_date of strings in a zone with DST changes (Apia, a day skipped)",
        "SELECT to_date('2011-12-30', 'yyyy-MM-dd'), to_timestamp('2011-12-30 10:00', "
        "'yyyy-MM-dd HH:mm'), CAST('2011-12-30' AS DATE)",
        "spark",
        "a wall time in a gap moves: Spark's `to_date('2011-12-30', 'yyyy-MM-dd')` is 2011-12-31",
        "Pacific/Apia",
    ),
    Case(
        "to_timestamp with a pattern letter outside those",
        "SELECT to_timestamp('2024-01-05 10:00 PM', 'yyyy-MM-dd hh:mm a')",
        "spark",
    ),
    Case(
        "date_add, date_sub, datediff",
        "SELECT date_add(dt, 30), date_sub(dt, i), datediff(dt, '2024-01-01'), "
        "datediff(date_add(dt, i), dt) FROM sem ORDER BY dt",
        "native",
    ),
    Case(
        "DATE + / - an integer",
        "SELECT dt + 5, dt - i FROM sem WHERE dt + 1 > '2024-01-20' ORDER BY dt",
        "native",
        "date_add / date_sub",
    ),
    Case(
        "stddev, variance (samp, pop)",
        "SELECT s, stddev_samp(d), stddev(i), variance(d), var_pop(b), stddev_pop(f) "
        "FROM sem GROUP BY s ORDER BY s",
        "native",
        "over doubles; one row's sample deviation is NULL",
    ),
    Case(
        "dayofweek, dayofmonth, dayofyear, weekofyear",
        "SELECT dayofweek(dt), dayofmonth(dt), dayofyear(dt), weekofyear(dt) FROM sem ORDER BY dt",
        "native",
    ),
    Case(
        "to_date with a pattern",
        "SELECT i, to_date(date_format(dt, 'dd/MM/yyyy'), 'dd/MM/yyyy'), "
        "to_date(date_format(dt, 'yyyyMMdd'), 'yyyyMMdd'), to_date(date_format(dt, 'M/d/yy'), "
        "'M/d/yy'), to_date(concat(CAST(dt AS STRING), ' 23:59:59'), 'yyyy-MM-dd HH:mm:ss'), "
        "to_date('2024-02-29', 'yyyy-MM-dd'), to_date('2024-01', 'yyyy-MM') FROM sem ORDER BY i",
        "native",
        "a string the pattern does not read (or an invalid date) runs the query on Spark SQL",
    ),
    Case(
        "CAST of a string to a DATE, to_date of a string",
        "SELECT i, CAST(CAST(dt AS STRING) AS DATE), to_date(concat(CAST(dt AS STRING), 'T10:00')), "
        "CAST('2024-2' AS DATE), to_date('2024') FROM sem ORDER BY i",
        "native",
        "`yyyy`, `yyyy-[m]m`, `yyyy-[m]m-[d]d` then a space or `T` and anything; "
        "other strings run the query on Spark SQL",
    ),
    Case(
        "round of a double",
        "SELECT f, round(f, 2), round(f), round(-f, 1), round(f / 3, 12), round(avg(f) OVER (), 3) "
        "FROM sem ORDER BY f",
        "native",
        "Spark rounds the decimal text (2.675 to 2.68): the shortest text, half up; "
        "digits 0..21; a value the translation cannot round exactly runs the query on Spark SQL",
    ),
    Case(
        "bround of a double",
        "SELECT f, bround(f, 2), bround(f), bround(-f), bround(f / 3, 12), bround(f * 10, 0) "
        "FROM sem ORDER BY f",
        "native",
        "HALF_EVEN of the decimal text (2.675 to 2.68, 0.5 to 0), as round",
    ),
    Case(
        "bround of a decimal, of an integer",
        "SELECT d, bround(d, 1), bround(d), bround(d * 10, 0), bround(-d, 1), bround(d, 3), "
        "bround(i, 2) FROM sem ORDER BY d",
        "native",
        "half even",
    ),
    Case(
        "round, bround of integers to negative digits",
        "SELECT i, round(i * 5, -1), bround(i * 5, -1), bround(-5 * i, -1), round(b, -2), "
        "bround(b * 5, -2), round(b, -12), bround(CAST(i * 15 AS SMALLINT), -1), "
        "round(CAST(i * 15 AS TINYINT), -1), round(i, -11), round(1234, -2), bround(-1250, -2) "
        "FROM sem ORDER BY i",
        "native",
        "the input's type; a value past it fails with ANSI mode, wraps without (Spark SQL answers)",
    ),
    Case(
        "round, bround of decimals to negative digits",
        "SELECT d, round(d, -2), bround(d, -2), round(-d, -1), bround(d * 2, -1), round(d, -6), "
        "bround(d, -4) FROM sem ORDER BY d",
        "native",
        "decimal(max(p - s + 1, 1 - d), 0)",
    ),
    Case(
        "round of a FLOAT, of a double to negative digits",
        "SELECT round(CAST(f AS FLOAT), 2), bround(CAST(f AS FLOAT)), round(f, -1) FROM sem",
        "spark",
        "Spark rounds JDK 17's Float.toString, not always the shortest text",
    ),
    Case(
        "ARRAY columns, array(), size, sort_array",
        "SELECT i, ai, array(i, 2), array(1.5, i), size(ai), sort_array(ai), "
        "sort_array(ai, false) FROM sem ORDER BY i",
        "native",
        "size of a NULL array: NULL with ANSI mode, -1 without",
    ),
    Case(
        "collect_list, collect_set",
        "SELECT s, sort_array(collect_list(i)), size(collect_set(dt)), collect_list(d) "
        "FROM sem WHERE i IS NULL OR i < 7 GROUP BY s ORDER BY s",
        "native",
        "NULLs skipped, `[]` for none; the order of elements is undefined in both engines",
    ),
    Case("explode in a select list", "SELECT i, explode(ai) AS x FROM sem ORDER BY i, x", "native"),
    Case(
        "LATERAL VIEW explode over one table",
        "SELECT s, v.x, y FROM sem LATERAL VIEW explode(ai) v AS x "
        "LATERAL VIEW explode(array(x, 0)) w AS y WHERE y >= 0 ORDER BY s, x, y",
        "native",
        "a subquery with explode in its select list",
    ),
    Case(
        "LATERAL VIEW OUTER explode over one table",
        "SELECT i, x FROM sem LATERAL VIEW OUTER explode(ai) v AS x",
        "native",
        "a NULL or empty array gives one row with a NULL",
    ),
    Case(
        "posexplode, posexplode_outer, explode_outer",
        "SELECT i, posexplode_outer(ai) FROM sem ORDER BY i, pos",
        "native",
        "positions from 0 (INT); `_outer`: one row of NULLs for a NULL or empty array",
    ),
    Case(
        "LATERAL VIEW [OUTER] posexplode, posexplode(a) AS (p, x)",
        "SELECT i, p, x FROM sem LATERAL VIEW OUTER posexplode(ai) v AS p, x "
        "UNION ALL SELECT i, posexplode(ai) AS (p, x) FROM sem ORDER BY i, p, x",
        "native",
    ),
    Case(
        "named_struct, struct",
        "SELECT i, named_struct('a', i, 'b', s) AS x, struct(i, s), struct(i AS p, d), "
        "struct(i + 1, 'q') FROM sem ORDER BY i",
        "native",
        "Spark's field names (the columns', else `col1`, `col2`, ...)",
    ),
    Case(
        "struct fields: `s.a`, `s['a']`, of an expression or a column",
        "SELECT i, named_struct('a', i, 'b', s).b AS x, st, st.a, st['b'], sem.st.a + 1 AS y "
        "FROM sem WHERE st.a IS NOT NULL OR st IS NULL ORDER BY i",
        "native",
    ),
    Case(
        "structs in arrays, arrays in structs",
        "SELECT i, array(named_struct('a', i), named_struct('a', 2)) AS x, "
        "named_struct('x', ai, 'y', st) AS y, size(array(st, st)) AS n FROM sem ORDER BY i",
        "native",
    ),
    Case(
        "map(), `m[k]`, element_at of a map",
        "SELECT i, map('k', s, 'j', 'z') AS m1, map('k', i)['k'] AS x, m['k'] AS y, "
        "element_at(m, 'j') AS z, m['none'] AS w, map(s, d) AS m2 FROM sem "
        "WHERE s IS NOT NULL ORDER BY i",
        "native",
        "a missing key: NULL (Spark 4.3, ANSI mode on or off); a NULL or repeated key fails "
        "the query with Spark's error (`NULL_MAP_KEY`, `DUPLICATED_MAP_KEY`)",
    ),
    Case(
        "map_keys, map_values, size and cardinality of a map, map_contains_key",
        "SELECT i, m, map_keys(m), map_values(m), size(m), cardinality(m), "
        "map_contains_key(m, 'k') FROM sem ORDER BY i",
        "native",
        "NULL and empty maps; size of a NULL map: NULL with ANSI mode, -1 without",
    ),
    Case(
        "map_from_arrays",
        "SELECT i, map_from_arrays(array(i, 10), array(s, 'x')) AS x, map_from_arrays(ai, ai) AS y "
        "FROM sem WHERE i IN (1, 3, -4) ORDER BY i",
        "native",
        "arrays of two lengths, a NULL or repeated key: Spark's error",
    ),
    Case(
        "structs in GROUP BY and ORDER BY",
        "SELECT st, count(*) AS n FROM sem GROUP BY st ORDER BY st",
        "native",
        "a struct as a sort key in the default NULL order",
    ),
    Case(
        "structs or maps compared, a struct sorted NULLS LAST, maps grouped",
        "SELECT i FROM sem WHERE st = named_struct('a', 1, 'b', 'x') ORDER BY st NULLS LAST",
        "spark",
        "Spark sorts a struct's NULL fields first whatever the key's NULL order, "
        "groups a map by its sorted entries",
    ),
    Case(
        "explode of a map",
        "SELECT i, explode(m) FROM sem",
        "native",
        "`key` and `value` columns; no row for a NULL or empty map",
    ),
    Case(
        "map_from_entries, explode_outer of a map",
        "SELECT i, map_from_entries(array(struct(1, s))), explode_outer(m) FROM sem",
        "spark",
    ),
    Case(
        "concat_ws of an array",
        "SELECT concat_ws(',', s, 'x'), concat_ws('-', ai) FROM sem",
        "spark",
        "Spark joins the elements",
    ),
    Case(
        "percentile (exact)",
        "SELECT s, percentile(i, 0.5), percentile(d, array(0.25, 1)), percentile(f, 0.3) "
        "FROM sem GROUP BY s ORDER BY s",
        "native",
        "Spark's interpolation, its double operations in order; a literal percentage or array",
    ),
    Case("percentile_approx", "SELECT percentile_approx(i, 0.5) FROM sem", "spark"),
    Case(
        "comparison of a string with a number",
        "SELECT i FROM sem WHERE i = '1'",
        "spark",
        "Spark's implicit casts",
    ),
    Case(
        "CAST of a string to an integer or a DOUBLE",
        "SELECT CAST('12' AS INT) + i, CAST(' 7 ' AS BIGINT) * b, "
        "CAST(CAST(i AS STRING) AS DOUBLE) / 4, CAST('-2.5e1' AS DOUBLE) FROM sem ORDER BY i",
        "native",
        "a string DataFusion does not read as a number runs the query on Spark SQL",
    ),
    Case(
        "CAST of a string to a DECIMAL, FLOAT or BOOLEAN",
        "SELECT CAST('1.25' AS DECIMAL(5,1)), CAST('0.1' AS FLOAT), CAST('yes' AS BOOLEAN) "
        "FROM sem",
        "spark",
    ),
]


def compatibility_table() -> str:
    """The Markdown table of docs/spark.md: construct, how it runs, the note."""
    lines = ["| construct | runs | note |", "|---|---|---|"]
    for case in CASES:
        runs = "natively" if case.mode == "native" else "on Spark SQL"
        lines.append(f"| {case.construct} | {runs} | {case.note} |")
    return "\n".join(lines)
