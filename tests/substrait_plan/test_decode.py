"""Decoding a Substrait plan (:mod:`distfusion.substrait_plan.decode`), deep ones included.

DataFusion's decoder stops at 100 nesting levels (about 18 joins): a chain of
24 joins does not fit it and is consumed in pieces, to the same rows.
"""

from __future__ import annotations

import pyarrow as pa
from datafusion import SessionContext
from datafusion.substrait import Producer

from distfusion.substrait_plan.decode import consume_plan, fits_decoder, parse_plan

JOINS = 24


def _deep_ctx() -> tuple[SessionContext, str]:
    ctx = SessionContext()
    for i in range(JOINS + 1):
        batch = pa.record_batch({f"k{i}": pa.array([1, 2, 3], pa.int64())})
        ctx.register_record_batches(f"t{i}", [[batch]])
    joins = " ".join(f"JOIN t{i} ON t{i - 1}.k{i - 1} = t{i}.k{i}" for i in range(1, JOINS + 1))
    return ctx, f"SELECT t0.k0, t{JOINS}.k{JOINS} FROM t0 {joins}"


def test_a_small_plan_fits_and_is_consumed_whole(ctx):
    data = Producer.to_substrait_plan(ctx.sql("SELECT k FROM t").logical_plan(), ctx).encode()
    assert fits_decoder(data)
    assert parse_plan(data).relations[0].root.names == ["k"]
    lp = consume_plan(ctx, data)
    assert (
        ctx.create_dataframe_from_logical_plan(lp).to_pylist()
        == ctx.sql("SELECT k FROM t").to_pylist()
    )


def test_a_deep_plan_is_consumed_in_pieces_to_the_same_rows():
    ctx, sql = _deep_ctx()
    data = Producer.to_substrait_plan(ctx.sql(sql).optimized_logical_plan(), ctx).encode()
    assert not fits_decoder(data)
    lp = consume_plan(ctx, data)
    views = [n for n in ctx.catalog().schema().names() if n.startswith("__deep_")]
    assert views, "the pieces are registered as views"
    got = sorted(ctx.create_dataframe_from_logical_plan(lp).to_pylist(), key=str)
    assert got == sorted(ctx.sql(sql).to_pylist(), key=str) and len(got) == 3
