"""Python UDFs the UDF tests register, and Flight workers load (``--udf tests.udf_funcs:UDFS``)."""

from __future__ import annotations

import os
import time

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


# ------------------------------------------------------------------ a producer that pauses
GATE_TIMEOUT_S = 60.0
"""Longest a gated call waits for its gate file before it goes on (and says so)."""
FREE_BELOW = 8192
"""Values below this pass :func:`gated` at once (a first row group of 8192 keys)."""


def _gated(values: pa.Array, gates: pa.Array) -> pa.Array:
    """``values`` unchanged; a batch holding a value >= :data:`FREE_BELOW` waits for the gate.

    ``gates`` holds one path (a literal): a batch of small values passes at
    once (the producer's first batch goes out), the others wait until the
    file exists. A call that waited :data:`GATE_TIMEOUT_S` in vain writes
    ``<path>.timeout`` and goes on, so a test fails rather than hangs.
    """
    gate = gates[0].as_py()
    if len(values) and pc.max(values).as_py() >= FREE_BELOW:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                with open(f"{gate}.timeout", "w") as f:
                    f.write("the gate never opened\n")
                break
            time.sleep(0.02)
    return values


gated = distfusion.udf(_gated, [pa.int64(), pa.string()], pa.int64(), "volatile", name="gated")
STREAMING_UDFS = [gated]
