"""TPC-H queries written with DataFusion's DataFrame API (no SQL), for any context.

Each function takes a context with ``table(name)`` -- a plain DataFusion
``SessionContext`` (the oracle) or a distfusion ``DistributedContext`` -- and
builds the query with the same code on either, so single-node DataFusion's
answer and the distributed one come from one definition.
"""

from __future__ import annotations

import datetime

from datafusion import col, lit
from datafusion import functions as F


def q5(ctx):
    """TPC-H Q5 (local supplier volume): revenue per nation of Asia in 1994."""
    orders = ctx.table("orders").filter(
        col("o_orderdate") >= lit(datetime.date(1994, 1, 1)),
        col("o_orderdate") < lit(datetime.date(1995, 1, 1)),
    )
    asia = ctx.table("region").filter(col("r_name") == lit("ASIA"))
    return (
        ctx.table("customer")
        .join(orders, left_on="c_custkey", right_on="o_custkey")
        .join(ctx.table("lineitem"), left_on="o_orderkey", right_on="l_orderkey")
        .join(
            ctx.table("supplier"),
            left_on=["l_suppkey", "c_nationkey"],
            right_on=["s_suppkey", "s_nationkey"],
        )
        .join(ctx.table("nation"), left_on="s_nationkey", right_on="n_nationkey")
        .join(asia, left_on="n_regionkey", right_on="r_regionkey")
        .aggregate(
            [col("n_name")],
            [F.sum(col("l_extendedprice") * (lit(1) - col("l_discount"))).alias("revenue")],
        )
        .sort(col("revenue").sort(ascending=False))
    )


def q18(ctx):
    """TPC-H Q18 (large volume customer): the 100 largest orders of more than 300 units."""
    large = (
        ctx.table("lineitem")
        .aggregate([col("l_orderkey")], [F.sum(col("l_quantity")).alias("total_quantity")])
        .filter(col("total_quantity") > lit(300))
        .select(col("l_orderkey").alias("large_orderkey"))
    )
    keys = ["c_name", "c_custkey", "o_orderkey", "o_orderdate", "o_totalprice"]
    return (
        ctx.table("customer")
        .join(ctx.table("orders"), left_on="c_custkey", right_on="o_custkey")
        .join(large, left_on="o_orderkey", right_on="large_orderkey", how="semi")
        .join(ctx.table("lineitem"), left_on="o_orderkey", right_on="l_orderkey")
        .aggregate([col(k) for k in keys], [F.sum(col("l_quantity")).alias("sum_quantity")])
        .sort(col("o_totalprice").sort(ascending=False), col("o_orderdate").sort())
        .limit(100)
    )


QUERIES = {5: q5, 18: q18}
