"""The Spark SQL dialect without a SparkSession: DistributedConfig(sql_dialect="spark").

Spark's answers here are the ones Spark 4 gives for the same query (checked
against Spark itself in tests/runtime/test_spark_sql_semantics.py); these
tests run the translation on the local runtime and need no JVM.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import SparkSettings, translate
from distfusion.spark_sql import types as st
from distfusion.spark_sql.datetime import to_chrono


@pytest.fixture
def ctx():
    context = DistributedContext(
        runtime=LocalRuntime(workers=2), config=DistributedConfig(sql_dialect="spark")
    )
    context.from_pydict(
        {
            "i": pa.array([1, 2, 3, None], pa.int32()),
            "d": pa.array(
                [Decimal("1.00"), Decimal("2.00"), Decimal("2.00"), None], pa.decimal128(7, 2)
            ),
        },
        name="t",
    )
    yield context
    context.close()


def test_spark_order_division_and_decimal_average(ctx):
    assert ctx.sql("SELECT i FROM t ORDER BY i").to_pydict() == {"i": [None, 1, 2, 3]}
    assert ctx.sql("SELECT i FROM t ORDER BY i DESC").to_pydict() == {"i": [3, 2, 1, None]}
    assert ctx.sql("SELECT i / 2 AS h FROM t ORDER BY i").to_pydict() == {
        "h": [None, 0.5, 1.0, 1.5]
    }
    # Spark: decimal(11,6), 5/3 = 1.666666... rounded half up (DataFusion alone truncates)
    table = ctx.sql("SELECT avg(d) AS a FROM t").to_arrow_table()
    assert table.schema.field("a").type == pa.decimal128(11, 6)
    assert table.to_pydict() == {"a": [Decimal("1.666667")]}
    # Spark: decimal(7,2) / 3 (the literal as decimal(1,0)) is decimal(11,6), rounded half up
    table = ctx.sql("SELECT d / 3 AS q FROM t ORDER BY i").to_arrow_table()
    assert table.schema.field("q").type == pa.decimal128(11, 6)
    assert table.column("q").to_pylist()[1:] == [
        Decimal("0.333333"),
        Decimal("0.666667"),
        Decimal("0.666667"),
    ]


def test_untranslatable_names_the_function(ctx):
    with pytest.raises(SparkSemanticsError, match=r"percentile_approx\(\)"):
        ctx.sql("SELECT percentile_approx(i, 0.5) AS p FROM t")


def test_unknown_constructs_stop_the_translation():
    schemas = {"t": pa.schema([("i", pa.int32()), ("f", pa.float64()), ("s", pa.string())])}
    for sql, reason in (
        ("SELECT round(CAST(f AS FLOAT), 1) FROM t", "binary value"),
        ("SELECT i FROM t WHERE s = 1", "implicit casts"),
        ("SELECT explode(sequence(1, i)) FROM t", "explode|sequence"),
        ("CREATE TABLE u AS SELECT 1", "not a query"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("SELECT FROM WHERE", "parser"),
    ):
        with pytest.raises(SparkSemanticsError, match=reason):
            translate(sql, schemas.get)


def test_ansi_mode_decides_overflow_and_division_by_zero():
    schemas = {"t": pa.schema([("i", pa.int32()), ("b", pa.int64())])}
    on = translate("SELECT b * 2, i / 0 FROM t", schemas.get, SparkSettings(ansi=True))
    off = translate("SELECT b * 2, i / 0 FROM t", schemas.get, SparkSettings(ansi=False))
    assert "DECIMAL(20, 0)" in on  # computed wide, cast back: an overflow fails
    assert "NULLIF" in off and "DECIMAL(20, 0)" not in off


def test_spark_decimal_rules():
    a, b = st.Decimal(7, 2), st.Decimal(7, 2)
    assert st.divide_type(a, b) == st.Decimal(17, 10)
    assert st.multiply_type(st.Decimal(32, 4), st.Decimal(16, 2)) == st.Decimal(38, 6)
    assert st.add_type(st.Decimal(1, 0), st.Decimal(15, 2)) == st.Decimal(16, 2)
    assert st.avg_type(st.Decimal(15, 2)) == st.Decimal(19, 6)
    assert st.sum_type(st.Decimal(35, 2)) == st.Decimal(38, 2)
    # TPC-H Q14: 100.00 * sum(...) / sum(...) loses precision to scale 6
    assert st.divide_type(st.Decimal(38, 6), st.Decimal(38, 4)) == st.Decimal(38, 6)


def test_sql_dialect_is_checked():
    with pytest.raises(ValueError, match="sql_dialect"):
        DistributedConfig(sql_dialect="hive")


@pytest.mark.parametrize(
    ("java", "chrono"),
    [
        ("yyyy-MM-dd", "%Y-%m-%d"),
        ("d/M/yy", "%-d/%-m/%y"),
        ("EEE, MMMM D", "%a, %B %-j"),
        ("yyyy'T'MM '%' ''", "%YT%m %% '"),
    ],
)
def test_java_date_patterns_become_chrono(java, chrono):
    assert to_chrono(java) == chrono


@pytest.mark.parametrize("java", ["yyyy-MM-dd HH:mm", "yyy", "QQ", "yyyy 'open"])
def test_java_patterns_without_an_equal_are_refused(java):
    with pytest.raises(SparkSemanticsError, match="datetime pattern"):
        to_chrono(java)


def test_explicit_null_order_is_kept(ctx):
    # Found by tests/runtime/test_spark_sql_inputs.py: sqlglot dropped an explicit
    # NULLS LAST / DESC NULLS FIRST, and DataFusion sorted NULLs by its own default.
    assert ctx.sql("SELECT i FROM t ORDER BY i NULLS LAST").to_pydict() == {"i": [1, 2, 3, None]}
    assert ctx.sql("SELECT i FROM t ORDER BY i DESC NULLS FIRST").to_pydict() == {
        "i": [None, 3, 2, 1]
    }
    rows = ctx.sql(
        "SELECT i, row_number() OVER (ORDER BY i NULLS LAST) AS r FROM t ORDER BY i"
    ).to_pydict()
    assert rows == {"i": [None, 1, 2, 3], "r": [4, 1, 2, 3]}


def test_trailing_cube_rollup_and_grouping_sets_group_as_spark(ctx):
    def groups(sql):
        rows = ctx.sql(sql).to_pylist()
        return sorted(repr(tuple(r.values())) for r in rows)

    cube = groups("SELECT i, d, count(*) AS n FROM t GROUP BY i, d WITH CUBE")
    assert cube == groups("SELECT i, d, count(*) AS n FROM t GROUP BY CUBE (i, d)")
    assert len(cube) == 4 + 3 + 4 + 1  # (i, d), (d), (i), ()
    rollup = groups("SELECT i, d, count(*) AS n FROM t GROUP BY i, d WITH ROLLUP")
    assert rollup == groups("SELECT i, d, count(*) AS n FROM t GROUP BY ROLLUP (i, d)")
    sets = groups("SELECT i, d, count(*) AS n FROM t GROUP BY i, d GROUPING SETS (i, (i, d), ())")
    assert sets == groups(
        "SELECT i, d, count(*) AS n FROM t GROUP BY GROUPING SETS (i, (i, d), ())"
    )
    assert len(sets) == 4 + 4 + 1


def test_what_spark_rejects_or_datafusion_answers_otherwise_is_not_translated():
    schemas = {"t": pa.schema([("i", pa.int32()), ("s", pa.string())])}
    for sql, reason in (
        ("SELECT i, grouping(i) FROM t GROUP BY i", "grouping"),
        ("SELECT count(DISTINCT i, s) FROM t", "several columns"),
        ("SELECT i + 1, s FROM t GROUP BY i + 1, s GROUPING SETS (s)", "no grouping set"),
        # DataFusion 55 moves the filter below the aggregate: one row where Spark has none
        ("SELECT * FROM (SELECT 1 AS z, count(*) AS n FROM t) WHERE z <> 1", "constant"),
    ):
        with pytest.raises(SparkSemanticsError, match=reason):
            translate(sql, schemas.get)
