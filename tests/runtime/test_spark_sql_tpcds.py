"""TPC-DS in Spark's dialect through the PySpark drop-in: Spark's answers, natively.

Oracle: ``spark.sql(query)`` on the same session, over TPC-DS at scale factor
0.01 (``tpcgen-cli``). Every one of the 103 queries must give Spark's names,
types and values, or fail where Spark fails; all but :data:`ON_SPARK_SQL` run
natively (no fallback). benchmarks/spark_sql_dropin.py checks the same at SF1.
"""

from __future__ import annotations

import pytest

import distfusion.spark
from distfusion import tpcds
from tests.compare import assert_same_answer

ON_SPARK_SQL: dict[str, str] = {}
"""The queries distfusion hands to Spark SQL, and why (the start of the fallback reason)."""


@pytest.fixture(scope="module")
def tpcds_spark(spark_session, tmp_path_factory):
    """The classic session with the 24 TPC-DS tables (SF 0.01) as temp views over Parquet."""
    out = tmp_path_factory.mktemp("tpcds")
    try:
        tpcds.generate(0.01, out)
    except RuntimeError as exc:
        pytest.skip(str(exc))  # tpcgen-cli missing: the datagen extra
    tpcds.spark_views(spark_session, out)
    yield spark_session
    for table in tpcds.TABLES:
        spark_session.catalog.dropTempView(table)


QUICK = {"q3", "q7", "q19", "q42", "q52", "q78"}
"""The queries of the default test run; the rest are marked ``slow`` (``make test-slow``)."""


@pytest.mark.parametrize(
    "name",
    [q if q in QUICK else pytest.param(q, marks=pytest.mark.slow) for q in tpcds.QUERIES],
)
def test_tpcds_in_spark_dialect_answers_as_spark(tpcds_spark, name):
    sql = tpcds.query(name)
    try:
        expected = tpcds_spark.sql(sql).toArrow()
    except Exception as spark_error:  # Spark's own: distfusion must not answer either
        with pytest.raises(Exception) as ours:  # noqa: PT011 (Spark's or DataFusion's class)
            distfusion.spark.sql(tpcds_spark, sql).to_arrow_table()
        assert type(ours.value) is not AssertionError, spark_error
        return
    df = distfusion.spark.sql(tpcds_spark, sql)
    if name in ON_SPARK_SQL:
        assert df.fallback and df.fallback.startswith(ON_SPARK_SQL[name]), df.fallback
    else:
        assert df.fallback is None, df.fallback
    got = df.to_arrow_table()
    assert got.column_names == expected.column_names
    assert got.schema.types == expected.schema.types, (got.schema, expected.schema)
    assert_same_answer(got, expected, sql)
