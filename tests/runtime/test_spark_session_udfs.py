"""A SparkSession's own Python UDFs run in distfusion's tasks and answer what Spark answers.

Oracle: ``spark.sql(query)`` on the same session, with the same registered
function. On a classic session the functions run natively (no fallback); a
Spark Connect session keeps its functions on the server, so the query runs
on Spark SQL there, with the reason (one test).
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import distfusion.spark
from tests.compare import assert_same_result, is_ordered
from tests.spark_sql_cases import SEM_ROWS


def _register(spark, folder) -> None:
    """The view ``sem`` (NULLs in every column) and the UDFs of these tests, in ``spark``."""
    from pyspark.sql.functions import arrow_udf, pandas_udf, udf

    pq.write_table(SEM_ROWS, folder / "sem.parquet")
    spark.read.parquet(str(folder / "sem.parquet")).createOrReplaceTempView("sem")
    register = spark.udf.register
    register("triple", lambda x: None if x is None else 3 * x, "int")
    # what Python receives, exactly: every argument's type and value
    register("seen", lambda *args: repr(args), "string")
    register("day_after", lambda d: None if d is None else d + datetime.timedelta(days=1), "date")
    register("same_decimal", lambda d: d, "decimal(7,2)")
    register("initial", lambda s: None if s is None else s[:1], "string")
    register("as_double", lambda x: x, "double")  # an int for a double: Spark's own conversion
    register("ratio", lambda a, b: a // b, "bigint")  # ZeroDivisionError on b = 0
    register("coin", udf(lambda x: x, "int").asNondeterministic())

    @pandas_udf("double")
    def halve(s):  # an INT column with NULLs arrives as float64 with NaN, as in Spark
        return s / 2

    @arrow_udf("bigint")
    def plus_one(a):
        return pc.add(a, 1)

    register("halve", halve)
    register("plus_one", plus_one)


@pytest.fixture(scope="module")
def udfs(spark_session, tmp_path_factory):
    """The classic session with :func:`_register`'s view and UDFs."""
    _register(spark_session, tmp_path_factory.mktemp("session_udfs"))
    yield spark_session
    spark_session.catalog.dropTempView("sem")


def _same_as_spark(spark, sql: str) -> distfusion.spark.SparkDataFrame:
    expected = spark.sql(sql).toArrow()
    df = distfusion.spark.sql(spark, sql)
    got = df.to_arrow_table()
    assert got.schema == expected.schema, (got.schema, expected.schema)
    assert_same_result(got, expected, ordered=is_ordered(sql))
    return df


NATIVE = [
    "SELECT i, triple(i) AS t FROM sem ORDER BY i",
    "SELECT seen(i, b, d, s, dt, f) AS args FROM sem ORDER BY args",
    "SELECT seen(CAST(i AS TINYINT), CAST(i AS SMALLINT), CAST(f AS FLOAT), s = 'apple') "
    "AS args FROM sem ORDER BY args",
    "SELECT day_after(dt) AS n, same_decimal(d) AS d FROM sem ORDER BY n, d",
    "SELECT initial(s) AS k, count(*) AS n, sum(triple(i)) AS t FROM sem "
    "GROUP BY initial(s) ORDER BY k",
    "SELECT s FROM sem WHERE triple(i) > 5 AND i IN (SELECT i FROM sem WHERE triple(i) < 30) "
    "ORDER BY s",
    "SELECT triple(triple(i)) + 1 AS t, halve(i) AS h, plus_one(b) AS p FROM sem ORDER BY t",
    "SELECT coin(i) AS c FROM sem ORDER BY c",
]


@pytest.mark.parametrize("sql", NATIVE)
def test_session_udf_runs_in_the_tasks_with_sparks_values(udfs, sql):
    df = _same_as_spark(udfs, sql)
    assert df.fallback is None, df.fallback


def test_a_returned_value_spark_converts_its_own_way_runs_on_spark_sql(udfs):
    # as_double returns Python ints for a DOUBLE result: Spark gives its own answer
    df = _same_as_spark(udfs, "SELECT i, as_double(i) AS x FROM sem ORDER BY i")
    assert df.fallback and "as_double returned int" in df.fallback


def test_a_udf_that_raises_gives_sparks_own_error(udfs):
    sql = "SELECT ratio(b, CAST(i - 1 AS BIGINT)) AS r FROM sem"  # i = 1: division by zero
    with pytest.raises(Exception, match="ZeroDivisionError") as spark_error:
        udfs.sql(sql).toArrow()
    df = distfusion.spark.sql(udfs, sql)
    with pytest.raises(type(spark_error.value), match="ZeroDivisionError"):
        df.to_arrow_table()


def test_a_udf_of_a_type_without_spark_equal_conversion_runs_on_spark_sql(udfs):
    df = _same_as_spark(udfs, "SELECT seen(ts) AS args FROM sem ORDER BY args")
    assert df.fallback and "argument 1 of seen is of Spark type" in df.fallback


def test_a_spark_connect_sessions_udf_runs_on_spark_sql_with_the_reason(
    connect_session, tmp_path_factory
):
    _register(connect_session, tmp_path_factory.mktemp("connect_udfs"))
    try:
        df = _same_as_spark(connect_session, NATIVE[0])  # its function is on the server
        assert df.fallback and "Spark Connect session's Python UDF" in df.fallback
        with pytest.raises(distfusion.spark.SparkSemanticsError, match="triple"):
            distfusion.spark.sql(connect_session, NATIVE[0], fallback="error")
    finally:
        connect_session.catalog.dropTempView("sem")


def test_fallback_error_is_not_raised_for_a_udf_that_runs_natively(udfs):
    df = distfusion.spark.sql(udfs, "SELECT triple(i) AS t FROM sem", fallback="error")
    assert df.to_arrow_table().column("t").type == pa.int32()
