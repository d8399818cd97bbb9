"""The PySpark drop-in answers what Spark answers: names, types and values, or Spark runs it.

Oracle: ``spark.sql(query)`` on the same session. Every case of
tests/spark_sql_cases.py runs on a classic and a Spark Connect session; the
TPC-H queries in Spark's dialect too. A case marked ``native`` must run
without fallback, one marked ``spark`` must run on Spark SQL with a reason.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import distfusion.spark
from distfusion import tpch
from distfusion.errors import SparkSemanticsError
from tests.compare import assert_same_result, is_ordered
from tests.spark_sql_cases import CASES, DST_ROWS, SEM_ROWS, compatibility_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sem(any_spark, tmp_path_factory):
    """``any_spark`` with views ``sem`` and ``dst`` over Parquet files of its rows (native)."""
    folder = tmp_path_factory.mktemp("sem")
    for name, rows in (("sem", SEM_ROWS), ("dst", DST_ROWS)):
        pq.write_table(rows, folder / f"{name}.parquet")
        any_spark.read.parquet(str(folder / f"{name}.parquet")).createOrReplaceTempView(name)
    yield any_spark
    any_spark.catalog.dropTempView("sem")
    any_spark.catalog.dropTempView("dst")


@contextlib.contextmanager
def _session_zone(spark, zone: str):
    """``spark.sql.session.timeZone`` set to ``zone`` (unchanged if empty) while it runs."""
    if not zone:
        yield
        return
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def _same_as_spark(spark, sql: str, **kwargs) -> distfusion.spark.SparkDataFrame:
    """Run ``sql`` both ways; assert equal names, types and values; return distfusion's."""
    expected = spark.sql(sql).toArrow()
    df = distfusion.spark.sql(spark, sql, **kwargs)
    got = df.to_arrow_table()
    assert got.column_names == expected.column_names
    assert got.schema.types == expected.schema.types, (got.schema, expected.schema)
    assert_same_result(got, expected, ordered=is_ordered(sql))
    spark_frame = df.to_spark()
    assert [(f.name, f.dataType) for f in spark_frame.schema] == [
        (f.name, f.dataType) for f in spark.sql(sql).schema
    ]
    return df


@pytest.mark.parametrize("case", CASES, ids=[c.construct for c in CASES])
def test_construct_answers_as_spark(sem, case):
    with _session_zone(sem, case.zone):
        df = _same_as_spark(sem, case.sql)
    if case.mode == "native":
        assert df.fallback is None
    else:
        assert df.fallback, "expected to run on Spark SQL"
        assert df.explain().startswith(f"runs on Spark SQL: {df.fallback}")


@pytest.mark.slow
@pytest.mark.parametrize("q", [q for q in range(1, 23) if q != 15])
def test_tpch_in_spark_dialect_runs_natively_as_spark(any_spark, q):
    df = _same_as_spark(any_spark, tpch.query(q))
    assert df.fallback is None


def test_fallback_error_raises_with_the_reason(sem):
    with pytest.raises(SparkSemanticsError, match="percentile_approx"):
        distfusion.spark.sql(sem, "SELECT percentile_approx(i, 0.5) FROM sem", fallback="error")
    with pytest.raises(ValueError, match="fallback"):
        distfusion.spark.sql(sem, "SELECT 1", fallback="maybe")


def test_statements_spark_owns_run_on_spark(sem):
    df = distfusion.spark.sql(
        sem, "CREATE OR REPLACE TEMP VIEW sem_big AS SELECT * FROM sem WHERE i > 2"
    )
    assert "not a query" in df.fallback
    try:
        got = distfusion.spark.sql(sem, "SELECT count(*) AS n FROM sem_big")
        assert got.fallback is None
        assert got.to_pylist() == [{"n": 2}]
    finally:
        sem.catalog.dropTempView("sem_big")


def test_syntax_error_is_sparks(sem):
    with pytest.raises(Exception, match="PARSE_SYNTAX_ERROR|Syntax error"):
        distfusion.spark.sql(sem, "SELECT i FROM sem WHERE i >")


def test_ansi_off_wraps_and_divides_by_zero_to_null(sem):
    previous = sem.conf.get("spark.sql.ansi.enabled")
    sem.conf.set("spark.sql.ansi.enabled", "false")
    try:
        df = _same_as_spark(
            sem, "SELECT i / (i - 1) AS q, b * 9000000 AS w, i div 0 AS z FROM sem ORDER BY i"
        )
        assert df.fallback is None
        rows = distfusion.spark.sql(sem, "SELECT i, i / (i - 1) AS q FROM sem").to_pylist()
        assert {"i": 1, "q": None} in rows  # a division by zero is NULL
        df = _same_as_spark(sem, "SELECT i, size(ai) AS n FROM sem ORDER BY i")
        assert df.fallback is None
        assert {"i": 3, "n": -1} in df.to_pylist()  # the size of a NULL array
    finally:
        sem.conf.set("spark.sql.ansi.enabled", previous)


def test_ansi_on_fails_on_overflow_and_division_by_zero(sem):
    # DataFusion fails on the value; the query runs again on Spark SQL, which raises its own.
    for sql in (
        "SELECT i / (i - 1) FROM sem",
        "SELECT b * 9000000 FROM sem",
        "SELECT CAST(2147483647 AS INT) + i FROM sem",
    ):
        with pytest.raises(Exception, match="(?i)overflow|divide|cast"):  # Spark's own error
            sem.sql(sql).collect()
        df = distfusion.spark.sql(sem, sql)
        assert df.fallback is None
        with pytest.raises(
            Exception, match=r"\[(ARITHMETIC_OVERFLOW|DIVIDE_BY_ZERO|CAST_OVERFLOW)"
        ):
            df.to_arrow_table()
        assert df.fallback.startswith("DataFusion failed on a value")


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_a_string_datafusion_does_not_read_as_a_number_answers_as_spark(sem, ansi):
    # Spark reads '7.5' as the INT 7 without ANSI mode and fails with it; DataFusion's
    # cast fails, so the query runs again on Spark SQL.
    sql = "SELECT i, CAST(concat(CAST(i AS STRING), '.5') AS INT) AS n FROM sem ORDER BY i"
    previous = sem.conf.get("spark.sql.ansi.enabled")
    sem.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        if ansi == "true":
            with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
                sem.sql(sql).collect()
            df = distfusion.spark.sql(sem, sql)
            assert df.fallback is None  # translated: the failure comes when it runs
            with pytest.raises(Exception, match="CAST_INVALID_INPUT"):  # Spark's own
                df.to_arrow_table()
        else:
            df = _same_as_spark(sem, sql)
        assert df.fallback.startswith("DataFusion failed on a value")
        assert "Cannot cast" in df.fallback
    finally:
        sem.conf.set("spark.sql.ansi.enabled", previous)


def test_compatibility_table_in_docs_is_the_cases():
    text = (ROOT / "docs" / "spark.md").read_text()
    match = re.search(
        r"<!-- compatibility:start -->\n(.*?)\n<!-- compatibility:end -->", text, re.S
    )
    assert match, "docs/spark.md lacks the compatibility table markers"
    assert match.group(1).strip() == compatibility_table(), (
        "docs/spark.md's table differs from tests/spark_sql_cases.py: paste compatibility_table()"
    )


def test_sum_of_floats_is_close(sem):
    # Not exact in either engine: a distributed sum adds in another order.
    got = distfusion.spark.sql(sem, "SELECT sum(f) AS s FROM sem").to_pylist()[0]["s"]
    assert math.isclose(got, sem.sql("SELECT sum(f) AS s FROM sem").collect()[0]["s"])


ZONED = [
    "SELECT i FROM sem WHERE ts >= '2024-03-10 02:30' ORDER BY i",  # in NY's gap
    "SELECT i FROM sem WHERE ts < '2024-11-03 01:30:00' ORDER BY i",  # NY's overlap
    "SELECT i FROM sem WHERE ts = TIMESTAMP '2024-03-10 03:30:00' ORDER BY i",
    "SELECT hour(ts), to_date(ts), date_trunc('day', ts) FROM sem ORDER BY ts",
    "SELECT hour(tn), date_format(tn, 'HH:mm') FROM sem ORDER BY tn",
    "SELECT date_format(ts, 'yyyy-MM-dd HH:mm'), from_unixtime(i) FROM sem ORDER BY ts",
]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_timestamps_across_dst_changes_in_two_session_zones(sem, zone):
    with _session_zone(sem, zone):
        for sql in ZONED:
            df = _same_as_spark(sem, sql)
            assert df.fallback is None, (sql, df.fallback)
        sql = "SELECT ts, tn FROM sem ORDER BY i"
        got = distfusion.spark.sql(sem, sql).to_pandas()  # naive times in the session's zone
        assert got.equals(sem.sql(sql).toPandas()), (got, sem.sql(sql).toPandas())


# Local times of instants around DST changes (DST_ROWS): every function at once
DST_QUERIES = [
    "SELECT k, hour(ts) AS h, minute(ts) AS m, second(ts) AS s, to_date(ts) AS d, "
    "CAST(ts AS DATE) AS c, date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSS EEE') AS f, "
    "from_unixtime(b) AS u, from_unixtime(b, 'h:mm a') AS v, hour(tn) AS nh, "
    "date_format(tn, 'yyyy-MM-dd HH:mm') AS nf FROM dst ORDER BY k",
    "SELECT k, date_trunc('MINUTE', ts) AS mi, date_trunc('HOUR', ts) AS h, "
    "date_trunc('DAY', ts) AS d, date_trunc('WEEK', ts) AS w, date_trunc('MONTH', ts) AS mo, "
    "date_trunc('QUARTER', ts) AS q, date_trunc('YEAR', ts) AS y FROM dst ORDER BY k",
    "SELECT hour(ts) AS h, count(*) AS n FROM dst GROUP BY hour(ts) ORDER BY h",
]


@pytest.mark.parametrize(
    "zone", ["America/Los_Angeles", "Europe/Berlin", "Australia/Sydney", "Asia/Kolkata", "+05:30"]
)
def test_local_times_across_dst_changes_run_natively_in_any_zone(sem, zone):
    with _session_zone(sem, zone):
        for sql in DST_QUERIES:
            df = _same_as_spark(sem, sql)
            assert df.fallback is None, (sql, df.fallback)


def test_a_given_python_udf_runs_natively(sem):
    # The session's own Python UDFs: tests/runtime/test_spark_session_udfs.py
    import pyarrow as pa
    import pyarrow.compute as pc
    from datafusion import udf

    sem.udf.register("triple", lambda x: None if x is None else 3 * x, "int")
    sql = "SELECT i, triple(i) AS t FROM sem ORDER BY i"
    native = udf(
        lambda a: pc.multiply(a, pa.scalar(3, pa.int32())),
        [pa.int32()],
        pa.int32(),
        "immutable",
        name="triple",
    )
    ours = distfusion.spark.sql(sem, sql, udfs=[native])  # the same, as a DataFusion UDF
    assert ours.fallback is None
    assert ours.to_arrow_table().equals(sem.sql(sql).toArrow())


def test_a_decimal_product_past_38_digits_answers_as_spark(sem):
    # Spark rounds the exact product to decimal(38, 6); DataFusion's decimal128
    # product of the unscaled values overflows, so the query runs on Spark SQL.
    sql = (
        "SELECT i, CAST(i AS DECIMAL(38,18)) * CAST(123456789.123456789012345678 AS "
        "DECIMAL(38,18)) AS p FROM sem ORDER BY i"
    )
    df = _same_as_spark(sem, sql)
    assert df.fallback and "overflow" in df.fallback


def test_local_times_of_a_view_spark_computes_in_a_dst_zone(sem):
    # Not a plain file scan: Spark computes the view and hands its rows over
    # (their TIMESTAMP labeled with the session's zone); the local times are the same.
    sem.sql("CREATE OR REPLACE TEMP VIEW dst_kept AS SELECT k, ts FROM dst WHERE k % 2 = 0")
    try:
        with _session_zone(sem, "America/Los_Angeles"):
            sql = (
                "SELECT k, hour(ts) AS h, date_trunc('DAY', ts) AS d, "
                "date_format(ts, 'yyyy-MM-dd HH:mm') AS f FROM dst_kept ORDER BY k"
            )
            df = _same_as_spark(sem, sql)
            assert df.fallback is None, df.fallback
            assert "spark scan dst_kept" in df.explain()
    finally:
        sem.catalog.dropTempView("dst_kept")


TEXTS = [
    ("2024-02-29", "29/02/2024", "2024-02-29 23:59:59"),  # a leap day
    (None, None, None),
    ("2024-1-5", "5/1/2024", "2024-01-05 1:00:00"),  # widths java.time does not read
    ("2024-02-30", "30/02/2024", "2023-02-29 10:00:00"),  # no such day
    (" 2024-01-05", "31/01/2024 ", "2024-01-05 24:00:00"),  # blanks, hour 24
    ("banana", "2024-01-05", "2024-01-05T10:00:00"),
]


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_strings_a_pattern_does_not_read_answer_as_spark(sem, tmp_path, ansi):
    # Spark: NULL without ANSI mode, CANNOT_PARSE_TIMESTAMP / CAST_INVALID_INPUT with it;
    # DataFusion's cast fails on them, so the query runs again on Spark SQL.
    import pyarrow as pa

    names = ("a", "b", "c")
    table = pa.table(
        {n: pa.array([row[j] for row in TEXTS], pa.string()) for j, n in enumerate(names)}
    )
    pq.write_table(
        table.append_column("k", pa.array(range(len(TEXTS)), pa.int32())), tmp_path / "t.parquet"
    )
    sem.read.parquet(str(tmp_path / "t.parquet")).createOrReplaceTempView("texts")
    previous = sem.conf.get("spark.sql.ansi.enabled")
    sem.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        for sql in (
            "SELECT k, to_date(a, 'yyyy-MM-dd') AS d FROM texts ORDER BY k",
            "SELECT k, to_date(b, 'dd/MM/yyyy') AS d FROM texts ORDER BY k",
            "SELECT k, to_timestamp(c, 'yyyy-MM-dd HH:mm:ss') AS t FROM texts ORDER BY k",
            "SELECT k, unix_timestamp(c) AS u FROM texts ORDER BY k",
            "SELECT k, CAST(a AS DATE) AS d, to_date(b) AS e FROM texts ORDER BY k",
        ):
            if ansi == "true":
                with pytest.raises(Exception, match="CANNOT_PARSE_TIMESTAMP|CAST_INVALID_INPUT"):
                    sem.sql(sql).collect()
                df = distfusion.spark.sql(sem, sql)
                assert df.fallback is None, (sql, df.fallback)  # it fails when it runs
                with pytest.raises(Exception, match="CANNOT_PARSE_TIMESTAMP|CAST_INVALID_INPUT"):
                    df.to_arrow_table()  # Spark's own error
            else:
                df = _same_as_spark(sem, sql)
            assert df.fallback.startswith("DataFusion failed on a value"), (sql, df.fallback)
            assert "Cast error" in df.fallback
        first = distfusion.spark.sql(
            sem, "SELECT to_date(a, 'yyyy-MM-dd') AS d FROM texts WHERE k < 2 ORDER BY k"
        )
        assert first.to_pylist() == [{"d": datetime.date(2024, 2, 29)}, {"d": None}]
        assert first.fallback is None
    finally:
        sem.conf.set("spark.sql.ansi.enabled", previous)
        sem.catalog.dropTempView("texts")
