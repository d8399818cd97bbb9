"""Python UDFs the UDF tests register, and Flight workers load (``--udf tests.udf_funcs:ALL``)."""

from __future__ import annotations

import math
import os
import statistics
import time

import pyarrow as pa
import pyarrow.compute as pc
from datafusion import Accumulator
from datafusion.user_defined import WindowEvaluator

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


class GeoMean(Accumulator):
    """Geometric mean of the positive values (null when none): merges its states exactly."""

    def __init__(self) -> None:
        self.log_sum = 0.0
        self.count = 0

    def update(self, values: pa.Array) -> None:
        positive = pc.filter(values, pc.greater(values, 0.0))
        self.log_sum += pc.sum(pc.ln(positive)).as_py() or 0.0
        self.count += len(positive)

    def merge(self, states: list[pa.Array]) -> None:
        self.log_sum += pc.sum(states[0]).as_py() or 0.0
        self.count += pc.sum(states[1]).as_py() or 0

    def state(self) -> list[pa.Scalar]:
        return [pa.scalar(self.log_sum), pa.scalar(self.count)]

    def evaluate(self) -> pa.Scalar:
        value = math.exp(self.log_sum / self.count) if self.count else None
        return pa.scalar(value, pa.float64())


class Median(Accumulator):
    """Exact median of int64 values (null when none): keeps every value."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def update(self, values: pa.Array) -> None:
        self.values.extend(values.drop_null().to_pylist())

    def merge(self, states: list[pa.Array]) -> None:
        for kept in states[0].to_pylist():
            self.values.extend(kept or [])

    def state(self) -> list[pa.Scalar]:
        return [pa.scalar(self.values, pa.list_(pa.int64()))]

    def evaluate(self) -> pa.Scalar:
        return pa.scalar(statistics.median(self.values) if self.values else None, pa.float64())


class RunningMax(WindowEvaluator):
    """The largest value so far in the window's order (over the whole partition)."""

    def evaluate_all(self, values: list[pa.Array], num_rows: int) -> pa.Array:
        out, best = [], None
        for v in values[0].to_pylist():
            if v is not None and (best is None or v > best):
                best = v
            out.append(best)
        return pa.array(out, pa.float64())


# Mergeable: partial states cross the shuffle. Not mergeable: raw rows cross it.
geo_mean = distfusion.udaf(
    GeoMean,
    [pa.float64()],
    pa.float64(),
    [pa.float64(), pa.int64()],
    "immutable",
    name="geo_mean",
    mergeable=True,
)
median_key = distfusion.udaf(
    Median, [pa.int64()], pa.float64(), [pa.list_(pa.int64())], "immutable", name="median_key"
)
running_max = distfusion.udwf(
    RunningMax, [pa.float64()], pa.float64(), "immutable", name="running_max"
)
UDAFS = [geo_mean, median_key]
UDWFS = [running_max]
# What Flight workers load (--udf tests.udf_funcs:ALL).
ALL = [*UDFS, *UDAFS, *UDWFS]


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


# ------------------------------------------------------------------ a native panic
POISON = -1
"""The value :func:`native_panic` panics DataFusion's native code on."""
SLOW_S = 0.5
"""Seconds :func:`native_panic` takes over a batch without :data:`POISON`."""


def _native_panic(values: pa.Array) -> pa.Array:
    """``values`` (int64) unchanged, after :data:`SLOW_S` seconds; a panic for :data:`POISON`.

    A batch holding :data:`POISON` comes back at once as strings although the
    function declares int64: DataFusion takes the declared type on trust, and
    an aggregate over it (``sum``) panics in Rust (``primitive array``, from
    arrow's ``as_primitive``), which reaches Python as pyo3's
    ``PanicException``, a ``BaseException``. A real panic in native code,
    no mock: tests check that such a task fails its query with a TaskError.
    """
    if len(values) and pc.any(pc.equal(values, POISON)).as_py():
        return pa.array(["not an int64"] * len(values))
    time.sleep(SLOW_S)
    return values


native_panic = distfusion.udf(
    _native_panic, [pa.int64()], pa.int64(), "volatile", name="native_panic"
)
# What the session's Flight workers load (tests/conftest.py): tests that need a
# UDF the workers lack use other names.
FAULTS = [native_panic]
