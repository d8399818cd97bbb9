"""``round``, ``bround`` and ``percentile`` run natively with Spark's answers, bit for bit.

Oracle: ``spark.sql(q)`` on one shared session (``spark_session``). Spark rounds
``java.lang.Double.toString(x)`` half up (``RoundBase``), DataFusion's
translation rounds the shortest text (distfusion.spark_sql.number_rules, which
gives the reasoning); the values here are the cases that argument turns on:
ties written with a trailing 5 (2.675), their neighbours, ratios of integers
(TPC-DS q78), every power of two (JDK 17 writes those by another bound), tiny
and huge values, the bounds between the translation's branches, NaN, infinities,
-0.0, NULL. Each double is compared by its bits (``-0.0`` is not ``0.0``).
"""

from __future__ import annotations

import decimal
import math
import random
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import distfusion.spark
from distfusion.spark_sql.number_rules import MAX_ROUND_DIGITS, narrow_bound

DIGITS = [0, 1, 2, 3, 5, 7, 9, 12, 15, 18, MAX_ROUND_DIGITS]


def _next(x: float, steps: int) -> float:
    return math.copysign(float(np.nextafter(abs(x), math.inf if steps > 0 else 0.0)), x)


def _doubles(seed: int = 38, n: int = 1500) -> list[float]:
    """Seeded doubles of every kind the translation distinguishes."""
    rnd = random.Random(seed)
    values = {0.0, -0.0, math.nan, math.inf, -math.inf, 2.675, -2.675, 1.005, 0.125, 0.285, 1.115}
    for k in range(-1074, 1024, 3):  # powers of two and their neighbours
        p = math.ldexp(1.0, k)
        values.update((p, -p, _next(p, 1), _next(p, -1)))
    for _ in range(n):
        values.add(struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0])
        values.add(rnd.randint(-(10**6), 10**6) / rnd.randint(1, 10**4))
        values.add(rnd.randint(1, 200) / (rnd.randint(0, 100) + rnd.randint(1, 100)))
        values.add(rnd.uniform(-1, 1) * 10 ** rnd.uniform(-25, 20))
        tie = float(f"{rnd.randint(0, 10 ** rnd.randint(1, 15))}5e-{rnd.randint(0, 22)}")
        values.update((tie, -tie, _next(tie, 1), _next(tie, -1)))
    for d in DIGITS:  # the bounds between the branches
        for bound in (4 * 10.0 ** -(d + 1), 2.0 ** narrow_bound(d), 2.0**52, 2.0**63):
            for steps in (-2, -1, 0, 1, 2):
                x = bound
                for _ in range(abs(steps)):
                    x = _next(x, steps)
                values.update((x, -x))
    return [v for v in values if not math.isnan(v)] + [math.nan]


def _spark_reruns(x: float, d: int) -> bool:
    """Whether the translation leaves ``round(x, d)`` to Spark SQL (the module's branches)."""
    if not math.isfinite(x) or abs(x) < 2.0 ** narrow_bound(d) or 2.0**52 <= abs(x) < 2.0**63:
        return False
    if abs(x) >= 2.0**63:
        return True
    return -decimal.Decimal(repr(x)).as_tuple().exponent > d


def _bits(column: pa.ChunkedArray) -> list[int | None]:
    """Each double's bits (one NaN for every NaN), None for NULL."""
    out = []
    for v in column.to_pylist():
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(None if v is None else -1)
        else:
            out.append(struct.unpack("<q", struct.pack("<d", v))[0])
    return out


def _integers(seed: int = 38, n: int = 400) -> pa.Table:
    """``ints`` (k, i INT, b BIGINT, d DECIMAL(18,3)): ties at each negative digit, NULL.

    Values stay clear of their type's bounds (rounding up to 10^9 keeps an INT).
    """
    rnd = random.Random(seed)
    ints, bigs, decs = [], [], []
    for _ in range(n):
        k = rnd.randint(1, 8)
        tie = rnd.randint(-(10 ** (9 - k)), 10 ** (9 - k)) * 10**k + 5 * 10 ** (k - 1)
        for v in (tie, -tie, tie + 1, tie - 1, rnd.randint(-(10**9), 10**9)):
            v = max(-(10**9), min(10**9, v))
            ints.append(v)
            bigs.append(v * 10**9 + rnd.choice([0, 5 * 10**8, rnd.randint(0, 10**9)]))
            decs.append(decimal.Decimal(rnd.randint(-(10**15), 10**15)) / 1000)
    ints.append(None)
    bigs.append(None)
    decs.append(None)
    return pa.table(
        {
            "k": range(len(ints)),
            "i": pa.array(ints, pa.int32()),
            "b": pa.array(bigs, pa.int64()),
            "d": pa.array(decs, pa.decimal128(18, 3)),
        }
    )


@pytest.fixture(scope="module")
def numbers(spark_session, tmp_path_factory):
    """``spark_session`` with views of doubles and groups.

    ``dbl`` (k, x): the doubles native for every d, and NULL; ``dbl_rerun``:
    doubles some d leaves to Spark; ``pct`` (g, x, y, z): groups for
    percentile; ``zeros`` (v): 0.0 and -0.0.
    """
    folder = tmp_path_factory.mktemp("numbers")
    values = _doubles()
    native = [v for v in values if not any(_spark_reruns(v, d) for d in DIGITS)] + [None]
    rerun = [v for v in values if any(_spark_reruns(v, d) for d in DIGITS)]
    rnd = random.Random(7)
    groups, xs, ys, zs = [], [], [], []
    for g in range(60):
        size = rnd.choice([0, 1, 1, 2, 3, 4, 7, 10, 25])
        pool = [rnd.uniform(-50, 50), 1 / 3, 0.1, 2.675, float(rnd.randint(-3, 3))]
        for _ in range(size):
            groups.append(g)
            xs.append(None if rnd.random() < 0.15 else rnd.choice(pool))
            ys.append(None if rnd.random() < 0.15 else rnd.randint(-4, 4))
            zs.append(
                None if rnd.random() < 0.15 else decimal.Decimal(rnd.randint(-99999, 99999)) / 100
            )
        if size == 0:  # a group of NULLs only
            groups.append(g)
            xs.append(None)
            ys.append(None)
            zs.append(None)
    groups.append(99)  # NaN and infinities
    xs.append(math.nan)
    ys.append(1)
    zs.append(None)
    groups += [99, 99]
    xs += [math.inf, -math.inf]
    ys += [2, 3]
    zs += [None, None]
    tables = {
        "dbl": pa.table({"k": range(len(native)), "x": pa.array(native, pa.float64())}),
        "dbl_rerun": pa.table({"k": range(len(rerun)), "x": pa.array(rerun, pa.float64())}),
        "zeros": pa.table({"v": pa.array([0.0, -0.0, 1.0], pa.float64())}),
        "ints": _integers(),
        "pct": pa.table(
            {
                "g": pa.array(groups, pa.int32()),
                "x": pa.array(xs, pa.float64()),
                "y": pa.array(ys, pa.int64()),
                "z": pa.array(zs, pa.decimal128(7, 2)),
            }
        ),
    }
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
        spark_session.read.parquet(str(folder / f"{name}.parquet")).createOrReplaceTempView(name)
    yield spark_session
    for name in tables:
        spark_session.catalog.dropTempView(name)


def _bit_equal(spark, sql: str) -> distfusion.spark.SparkDataFrame:
    """Run ``sql`` both ways; every double column bit for bit equal; distfusion's frame."""
    expected = spark.sql(sql).toArrow()
    df = distfusion.spark.sql(spark, sql)
    got = df.to_arrow_table()
    assert got.schema.types == expected.schema.types, (got.schema, expected.schema)
    for name in expected.column_names:
        column, want = got.column(name), expected.column(name)
        if pa.types.is_floating(want.type):
            bad = [
                (i, a, b)
                for i, (a, b) in enumerate(zip(_bits(column), _bits(want), strict=True))
                if a != b
            ]
            assert not bad, (name, bad[:5])
        elif pa.types.is_list(want.type):  # arrays of doubles: their bits, NaN as NaN
            pairs = zip(column.to_pylist(), want.to_pylist(), strict=True)
            for a, b in pairs:
                assert (a is None) == (b is None), name
                if a is not None:
                    assert _bits(pa.chunked_array([a], pa.float64())) == _bits(
                        pa.chunked_array([b], pa.float64())
                    ), (name, a, b)
        else:
            assert column.to_pylist() == want.to_pylist(), name
    return df


def test_round_of_doubles_is_sparks_bit_for_bit(numbers):
    rounds = ", ".join(f"round(x, {d}) AS r{d}" for d in DIGITS)
    df = _bit_equal(numbers, f"SELECT k, x, {rounds}, round(x) AS r FROM dbl ORDER BY k")
    assert df.fallback is None
    assert numbers.table("dbl").count() > 5000


def test_bround_of_doubles_is_sparks_bit_for_bit(numbers):
    # HALF_EVEN of the same decimal text: 2.675 to 2.68, 0.125 to 0.12, 0.5 to 0.0
    rounds = ", ".join(f"bround(x, {d}) AS r{d}" for d in DIGITS)
    df = _bit_equal(numbers, f"SELECT k, x, {rounds}, bround(x) AS r FROM dbl ORDER BY k")
    assert df.fallback is None
    df = _bit_equal(numbers, "SELECT k, bround(x, 2) AS r FROM dbl_rerun ORDER BY k")
    assert "round() of the double" in df.fallback


def test_round_and_bround_to_negative_digits_are_sparks(numbers):
    digits = [-1, -2, -3, -5, -8, -9, -10, -12, -17]
    cols = ", ".join(
        f"{f}(i, {d}) AS i{f}{-d}, {f}(b, {d}) AS b{f}{-d}, {f}(d, {d}) AS d{f}{-d}"
        for f in ("round", "bround")
        for d in digits
    )
    more = "bround(d, 2) AS e2, bround(d, 0) AS e0, round(d, 1) AS u1, bround(b, 3) AS b3"
    df = _bit_equal(numbers, f"SELECT k, {cols}, {more} FROM ints ORDER BY k")
    assert df.fallback is None


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_round_past_the_integer_type_is_sparks_error_or_wrap(numbers, ansi):
    # Spark: ARITHMETIC_OVERFLOW with ANSI mode, the wrapped integer without; the
    # native run fails on the value and Spark SQL answers.
    sql = (
        "SELECT k, round(CAST(2147483647 - k AS INT), -1) AS r, "
        "bround(9223372036854775807 - k, -1) AS s FROM ints WHERE k < 3 ORDER BY k"
    )
    previous = numbers.conf.get("spark.sql.ansi.enabled")
    numbers.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        df = distfusion.spark.sql(numbers, sql)
        if ansi == "true":
            with pytest.raises(Exception, match=r"\[ARITHMETIC_OVERFLOW"):
                df.to_arrow_table()
        else:
            assert df.to_arrow_table().equals(numbers.sql(sql).toArrow())
            assert df.to_pylist()[0]["r"] == -2147483646  # 2147483650 wrapped
        assert df.fallback.startswith("DataFusion failed on a value"), df.fallback
    finally:
        numbers.conf.set("spark.sql.ansi.enabled", previous)


def test_round_of_a_double_spark_answers_otherwise_runs_there(numbers):
    # |x| >= 2^63, or more decimals than d between the narrow bound and 2^52
    df = _bit_equal(numbers, "SELECT k, round(x, 2) AS r FROM dbl_rerun ORDER BY k")
    assert df.fallback.startswith("DataFusion failed on a value"), df.fallback
    assert "round() of the double" in df.fallback


def test_round_of_ratios_and_averages_as_tpcds(numbers):
    # TPC-DS q78's ratio of integer sums, and round(avg(x), 2) over groups
    sql = (
        "SELECT g, round(sum(abs(y)) / (coalesce(sum(abs(y)), 0) + count(y) + 1), 2) AS q, "
        "round(avg(x), 2) AS a, round(avg(x) * 1000, 1) AS b FROM pct GROUP BY g ORDER BY g"
    )
    df = _bit_equal(numbers, sql)
    assert df.fallback is None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT g, percentile(x, 0.5) AS a, percentile(y, 0.25) AS b, percentile(z, 0.9) AS c, "
        "percentile(x, array(0, 0.1, 0.33, 1)) AS d FROM pct GROUP BY g ORDER BY g",
        "SELECT percentile(x, 0.5) AS a, percentile(y, 0.3) AS b, percentile(z, array(0.5, 0.75)) "
        "AS c, percentile(x, 1e-1) AS d FROM pct WHERE g < 99",
        "SELECT percentile(x, 0.5) AS a, percentile(y, 0.5) AS b FROM pct WHERE g < 0",
    ],
    ids=["group-by", "global", "no-rows"],
)
def test_percentile_is_sparks_bit_for_bit(numbers, sql):
    df = _bit_equal(numbers, sql)
    assert df.fallback is None


def test_percentile_of_both_zeros_runs_on_spark(numbers):
    # Spark orders 0.0 and -0.0 as equal, in the order of its hash map
    sql = "SELECT percentile(v, 0.5) AS p, percentile(v, array(0.1)) AS q FROM zeros"
    df = distfusion.spark.sql(numbers, sql)
    assert df.to_arrow_table().equals(numbers.sql(sql).toArrow())
    assert df.fallback.startswith("DataFusion failed on a value"), df.fallback
