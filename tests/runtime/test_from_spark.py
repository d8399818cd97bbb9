"""distfusion.spark.from_spark: a Spark DataFrame as the input of a distfusion DataFrame.

Built with DataFusion's DataFrame API, run on the Spark runtime of the
session, back in Spark with ``to_spark()``; each result equals single-node
DataFusion running the same DataFrame code over the same TPC-H files. Every
test runs on the classic session and on a Spark Connect one (``any_spark``).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import col, lit
from datafusion import functions as F

import distfusion.spark
from distfusion import DistributedConfig, DistributedContext
from distfusion.errors import PlanningError
from distfusion.spark import SparkDataFrame, from_spark, to_spark_compatible
from tests.compare import assert_same_result
from tests.dataframe_queries import q5


@pytest.fixture(scope="module")
def spark(any_spark):
    """The TPC-H views on a classic session, then on a Spark Connect one."""
    return any_spark


def _big_quantities(df):
    return df.filter(col("l_quantity") > lit(45)).aggregate(
        [col("l_returnflag")],
        [F.sum(col("l_extendedprice")).alias("total"), F.count_star().alias("n")],
    )


def _from_spark(sdf) -> pa.Table:
    return to_spark_compatible(sdf.toArrow())


def test_round_trip_of_a_native_scan(spark, oracle):
    df = _big_quantities(from_spark(spark.table("lineitem")))
    assert isinstance(df, SparkDataFrame)
    assert "scan spark_df_" in df.explain()  # a plain Parquet scan: read natively
    sdf = df.to_spark()
    assert type(sdf).__module__.startswith("pyspark.sql")
    expected = to_spark_compatible(_big_quantities(oracle.table("lineitem")).to_arrow_table())
    assert_same_result(_from_spark(sdf), expected, ordered=False)
    # the pipeline goes on in Spark
    assert sdf.filter("l_returnflag = 'R'").count() == 1


def test_a_dataframe_spark_computes_is_read_through_spark(spark, oracle):
    shipped = spark.table("orders").filter("o_orderstatus = 'F'")
    df = from_spark(shipped).aggregate(
        [col("o_orderpriority")], [F.sum(col("o_totalprice")).alias("total")]
    )
    assert "spark scan" in df.explain()
    expected = (
        oracle.table("orders")
        .filter(col("o_orderstatus") == lit("F"))
        .aggregate([col("o_orderpriority")], [F.sum(col("o_totalprice")).alias("total")])
    )
    expected = to_spark_compatible(expected.to_arrow_table())
    assert_same_result(to_spark_compatible(df.to_arrow_table()), expected, ordered=False)
    assert_same_result(_from_spark(df.to_spark()), expected, ordered=False)


class _SparkTables:
    """``table(name)``: the Spark table ``name`` through from_spark (one shared context)."""

    def __init__(self, spark, context=None) -> None:
        self.spark = spark
        self.context = context

    def table(self, name: str):
        return from_spark(self.spark.table(name), context=self.context)


def test_tpch_q5_over_spark_tables_distributed(spark, oracle):
    context = DistributedContext(
        runtime=distfusion.spark._runtime_for(spark), config=DistributedConfig(tasks_per_stage=2)
    )
    df = q5(_SparkTables(spark, context))
    assert isinstance(df, SparkDataFrame) and df.coordinator_only() is None
    assert "shuffle" in df.explain() or "broadcast" in df.explain()
    # Spark's schema types the columns (utf8 where DataFusion reads utf8view from the files)
    expected = to_spark_compatible(q5(oracle).to_arrow_table())
    assert_same_result(to_spark_compatible(df.to_arrow_table()), expected, ordered=True)
    assert_same_result(_from_spark(df.to_spark()), expected, ordered=True)


def test_frames_of_one_session_share_a_context(spark):
    nation, region = from_spark(spark.table("nation")), from_spark(spark.table("region"))
    assert nation.context is region.context
    joined = nation.join(region, left_on="n_regionkey", right_on="r_regionkey")
    assert joined.count() == 25
    named = from_spark(spark.table("region"), name="Regions_Here")
    assert named.context.sql("SELECT count(*) AS n FROM regions_here").to_pydict() == {"n": [5]}
    with pytest.raises(PlanningError, match="exists already"):
        from_spark(spark.table("region"), name="regions_here")
    named.context.deregister_table("regions_here")


def test_from_spark_refuses_what_is_no_spark_dataframe(spark):
    with pytest.raises(TypeError, match="takes a pyspark.sql.DataFrame"):
        from_spark(pa.table({"a": [1]}))
