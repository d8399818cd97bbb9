"""A read's pushed-down filter as plain predicates, and feeds that receive them."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext
from datafusion.substrait import Producer
from substrait.proto import Plan

from distfusion import DistributedContext, FeedTableSource, LocalRuntime, WorkUnit, WorkUnitFeed
from distfusion.planner.scan_filters import any_of, scan_filters
from distfusion.substrait_plan.build import FunctionRegistry
from distfusion.substrait_plan.walk import walk
from distfusion.work_unit_feed.feed import WorkUnitFeedProvider
from distfusion.work_unit_feed.filters import (
    And,
    Comparison,
    In,
    IsNull,
    Not,
    Or,
    from_json,
    to_json,
)

TABLE = pa.table(
    {
        "a": pa.array([1, 7, 9], pa.int64()),
        "s": ["x", "ab", None],
        "d": pa.array([datetime.date(2020, 1, 1)] * 3, pa.date32()),
        "ts": pa.array([datetime.datetime(2020, 1, 1)] * 3, pa.timestamp("us")),
        "dec": pa.array([decimal.Decimal("1.25")] * 3, pa.decimal128(12, 2)),
        "f": [0.5, 1.5, 2.5],
    }
)


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("scan_filters") / "t.parquet"
    pq.write_table(TABLE, path)
    return str(path)


def _filters(sql: str, path: str):
    ctx = SessionContext()
    ctx.register_parquet("t", path)
    plan = Plan()
    plan.ParseFromString(
        Producer.to_substrait_plan(ctx.sql(sql).optimized_logical_plan(), ctx).encode()
    )
    (read,) = [m for m in walk(plan.relations[0].root) if type(m).__name__ == "ReadRel"]
    return scan_filters(read, FunctionRegistry(plan))


def test_comparisons_of_a_column_and_a_literal_become_predicates(table_path):
    got = set(
        _filters(
            "SELECT * FROM t WHERE a > 5 AND 3 >= a AND s = 'x' AND d >= DATE '2020-01-01' "
            "AND ts < TIMESTAMP '2021-01-01 00:00:00' AND dec <= 1.5 AND f != 2.0",
            table_path,
        )
    )
    assert got == {
        Comparison(">", "a", 5),
        Comparison("<=", "a", 3),
        Comparison("=", "s", "x"),
        Comparison(">=", "d", datetime.date(2020, 1, 1)),
        Comparison("<", "ts", datetime.datetime(2021, 1, 1)),
        Comparison("<=", "dec", decimal.Decimal("1.50")),
        Comparison("!=", "f", 2.0),
    }


def test_in_null_tests_and_boolean_structure(table_path):
    got = set(
        _filters(
            "SELECT * FROM t WHERE a IN (1, 2) AND s IS NOT NULL AND (a < 0 OR f IS NULL) "
            "AND NOT (a = 4)",
            table_path,
        )
    )
    in_list = Or((Comparison("=", "a", 1), Comparison("=", "a", 2)))
    assert in_list in got or In("a", (1, 2)) in got
    assert IsNull("s", negated=True) in got
    assert Or((Comparison("<", "a", 0), IsNull("f"))) in got
    assert Comparison("!=", "a", 4) in got or Not(Comparison("=", "a", 4)) in got


def test_what_cannot_be_expressed_is_left_out_whole(table_path):
    got = _filters(
        "SELECT * FROM t WHERE a + 1 > 5 AND s LIKE 'a%' AND (a < 0 OR s LIKE 'b%') AND a > f "
        "AND a = 7",
        table_path,
    )
    assert got == (Comparison("=", "a", 7),)


def test_no_filter_no_predicates(table_path):
    assert _filters("SELECT a FROM t", table_path) == ()


def test_json_round_trip():
    filters = (
        Comparison("<", "d", datetime.date(2020, 1, 2)),
        Comparison(">=", "ts", datetime.datetime(2020, 1, 2, 3, 4, 5)),
        In("dec", (decimal.Decimal("1.25"), decimal.Decimal("2"))),
        And((IsNull("s"), Not(Comparison("=", "a", 1)))),
        Or((Comparison("!=", "s", "x"), IsNull("a", True))),
    )
    assert from_json(to_json(filters)) == filters
    with pytest.raises(ValueError, match="not a list of filters"):
        from_json([["like", "s", "x"]])


def test_reads_of_one_table_imply_their_disjunction():
    a, b = (Comparison(">", "a", 5),), (Comparison("<", "a", 0), IsNull("s"))
    assert any_of([a]) == a
    assert any_of([a, a]) == a
    assert any_of([a, b]) == (Or((a[0], And(b))),)
    assert any_of([a, ()]) == ()  # one read keeps every row
    assert any_of([]) == ()


class _Recording(WorkUnitFeedProvider):
    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: list[tuple] = []

    def feed(self, partition, ctx):
        self.seen.append(ctx.filters)
        if partition == 0:
            yield WorkUnit(path=self.path)


class _Table(FeedTableSource):
    def __init__(self, path: str) -> None:
        self.schema = pq.read_schema(path)
        self.provider = _Recording(path)
        self.feed = WorkUnitFeed(self.provider)
        self.tasks = 2

    def read(self, unit):
        pf = pq.ParquetFile(unit.path)
        return pa.RecordBatchReader.from_batches(pf.schema_arrow, pf.iter_batches())


def test_a_feed_provider_gets_the_reads_filters(table_path):
    source = _Table(table_path)
    ctx = DistributedContext(runtime=LocalRuntime(workers=2))
    ctx.register_feed_table("t", source)
    got = ctx.sql("SELECT a FROM t WHERE a > 5 AND s LIKE 'a%'").to_pylist()
    assert got == [{"a": 7}]
    assert source.provider.seen and all(
        f == (Comparison(">", "a", 5),) for f in source.provider.seen
    )
    source.provider.seen.clear()
    got = ctx.sql("SELECT x.a FROM t x JOIN t y ON x.a = y.a WHERE x.a > 5 AND y.a < 9")
    assert got.to_pylist() == [{"a": 7}]
    implied = {f for fs in source.provider.seen for f in fs}
    assert implied and all(isinstance(f, Comparison | Or) for f in implied)
