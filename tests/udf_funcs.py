"""Python UDFs the UDF tests register, and Flight workers load (``--udf tests.udf_funcs:UDFS``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

import distfusion


def _price_band(prices: pa.Array) -> pa.Array:
    """``low`` / ``mid`` / ``high`` by total price (a decimal), null stays null."""
    values = pc.cast(prices, pa.float64())
    low, high = pc.less(values, 50000.0), pc.greater_equal(values, 200000.0)
    return pc.if_else(low, "low", pc.if_else(high, "high", "mid"))


def _digit_sum(keys: pa.Array) -> pa.Array:
    return pa.array(
        [None if k is None else sum(int(c) for c in str(abs(k))) for k in keys.to_pylist()],
        pa.int64(),
    )


price_band = distfusion.udf(
    _price_band, [pa.decimal128(15, 2)], pa.string(), "immutable", name="price_band"
)
digit_sum = distfusion.udf(_digit_sum, [pa.int64()], pa.int64(), "immutable", name="digit_sum")
UDFS = [price_band, digit_sum]
