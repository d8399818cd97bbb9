"""A distributed decimal average equals single-node DataFusion's exactly.

DataFusion's ``avg`` of ``Decimal(p, s)`` is ``Decimal(p + 4, s + 4)``, the exact
sum divided by the count and truncated toward zero. The distributed average
divides a sum of partial sums by a sum of partial counts, so it must divide in
decimal arithmetic too: through float64 it rounds the last digit differently
(TPC-H Q1's ``avg_disc``) and loses digits of a sum wider than 15-16 significant
digits.
"""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext
from tests.compare import assert_same_result

D = decimal.Decimal


def _table() -> pa.Table:
    # Groups: thirds that truncate (1/3, 2/3, -2/3), a sum of 20 significant
    # digits, all-NULL values, a single row, and many rows of a small key.
    k, small, wide = [], [], []

    def add(key, s, w):
        k.append(key)
        small.append(None if s is None else D(s))
        wide.append(None if w is None else D(w))

    for v in ("0.01", "0.00", "0.00"):
        add(1, v, "1.0000000001")
    for v in ("0.01", "0.01", "0.00"):
        add(2, v, "-2.0000000002")
    for v in ("-0.01", "-0.01", "0.00"):
        add(3, v, "0.0000000001")
    for v in ("9999999999999.99", "9999999999999.98", "1.01"):
        add(4, v, "1234567890123456789.0123456789")
    add(5, None, None)
    add(5, None, None)
    add(6, "12.34", "-0.0000000003")
    for i in range(200):
        add(7 + i % 3, f"{(i * 7919) % 100000 / 100:.2f}", f"{i * 104729 % 999983}.{i:010d}")
    return pa.table(
        {
            "k": pa.array(k, pa.int64()),
            "small": pa.array(small, pa.decimal128(15, 2)),
            "wide": pa.array(wide, pa.decimal128(38, 10)),
        }
    )


QUERIES = {
    "grouped": "SELECT k, avg(small) AS a, avg(wide) AS w FROM d GROUP BY k",
    "global": "SELECT avg(small) AS a, avg(wide) AS w, avg(small) FILTER (WHERE k > 3) AS f FROM d",
    "empty-group": "SELECT k, avg(small) AS a FROM d WHERE k = 5 GROUP BY k",
    "no-rows": "SELECT avg(small) AS a, avg(wide) AS w FROM d WHERE k < 0",
    "with-sum-count": (
        "SELECT k % 2 AS m, sum(small) AS s, count(small) AS c, avg(small) AS a, "
        "avg(wide) * 2 AS w2 FROM d GROUP BY k % 2"
    ),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_decimal_average_equals_datafusion(runtime, workers, name):
    table = _table()
    sql = QUERIES[name]
    oracle = SessionContext()
    oracle.register_record_batches("d", [table.to_batches()])
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_table("d", table, max_rows_per_unit=7)
    got = ctx.sql(sql).to_arrow_table()
    expected = oracle.sql(sql).to_arrow_table()
    assert got.schema.types == expected.schema.types
    assert_same_result(got, expected, ordered=False)
