"""What DataFusion 55's Substrait round trip drops, on single-node DataFusion alone.

Each lossy shape answers differently after ``Producer.to_substrait_plan`` /
``Consumer.from_substrait_plan`` than DataFusion does, and
:func:`~distfusion.planner.detect_substrait_losses.substrait_losses` finds it
from the plan's structure; each carried shape answers the same and is not
reported. When a DataFusion upgrade carries a property, its round-trip test
here fails: drop the rule for it then.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext
from datafusion.substrait import Consumer, Producer
from substrait.proto import Plan

from distfusion.planner import detect_substrait_losses
from distfusion.planner.detect_substrait_losses import substrait_losses
from tests.contract.test_substrait_losses import CARRIED, LOSSY, F

Z = pa.table(
    {
        "ts": pa.array([0, 86399, 90000, None], pa.timestamp("s", tz="Asia/Tokyo")),
        "naive": pa.array([0, 86399, 90000, 3600], pa.timestamp("ms")),
        "k": [1, 1, 2, 2],
    }
)

ZONED = {
    "at-time-zone": ("SELECT ts AT TIME ZONE 'Europe/Paris' AS p FROM z", "Europe/Paris"),
    "cast-in-a-function": (
        "SELECT date_trunc('day', arrow_cast(ts, 'Timestamp(Second, Some(\"+08:00\"))')) AS d "
        "FROM z",
        "+08:00",
    ),
    "in-an-aggregate-filter": (
        "SELECT k, count(*) FILTER "
        "(WHERE date_part('hour', ts AT TIME ZONE 'Europe/Paris') > 3) AS n FROM z GROUP BY k",
        "Europe/Paris",
    ),
    "in-a-window-partition": (
        "SELECT k, count(*) OVER (PARTITION BY date_trunc('day', naive AT TIME ZONE '+05:00')) "
        "AS n FROM z",
        "+05:00",
    ),
}
NOT_ZONED = {
    "utc": "SELECT arrow_cast(naive, 'Timestamp(Millisecond, Some(\"UTC\"))') AS u FROM z",
    "to-text": "SELECT CAST(ts AS VARCHAR) AS s, date_part('hour', ts) AS h FROM z",
    "a-column-named-like-one": 'SELECT ts AS "Timestamp(s, ""+08:00"")" FROM z',
}


@pytest.fixture(scope="module")
def ctx() -> SessionContext:
    ctx = SessionContext()
    ctx.register_record_batches("f", [F.to_batches()])
    ctx.register_record_batches("z", [Z.to_batches()])
    return ctx


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(repr(v) for v in r.values()) for r in table.to_pylist())


def _round_trip(ctx: SessionContext, sql: str) -> tuple[pa.Table, pa.Table, list[str]]:
    """DataFusion's answer, the answer after the Substrait round trip, the losses found."""
    df = ctx.sql(sql)
    logical = df.optimized_logical_plan()
    produced = Producer.to_substrait_plan(logical, ctx)
    again = Consumer.from_substrait_plan(ctx, produced)
    plan = Plan()
    plan.ParseFromString(produced.encode())
    return (
        df.to_arrow_table(),
        ctx.create_dataframe_from_logical_plan(again).to_arrow_table(),
        substrait_losses(logical, ctx, plan),
    )


@pytest.mark.parametrize("name", list(LOSSY))
def test_datafusion_drops_it_and_the_check_finds_it(ctx, name):
    sql, named = LOSSY[name]
    want, got, lost = _round_trip(ctx, sql)
    assert _rows(got) != _rows(want), "DataFusion carries it now: drop its rule"
    assert len(lost) == 1 and named in lost[0], lost


@pytest.mark.parametrize("name", list(CARRIED))
def test_datafusion_carries_it_and_the_check_passes_it(ctx, name):
    want, got, lost = _round_trip(ctx, CARRIED[name])
    assert _rows(got) == _rows(want)
    assert lost == []


@pytest.mark.parametrize("name", list(ZONED))
def test_a_cast_to_a_zone_is_found_wherever_it_is(ctx, name):
    sql, zone = ZONED[name]
    want, got, lost = _round_trip(ctx, sql)
    assert lost == [f"the time zone of a cast to a timestamp ({zone})"]


@pytest.mark.parametrize("name", list(NOT_ZONED))
def test_no_zone_no_loss(ctx, name):
    _, _, lost = _round_trip(ctx, NOT_ZONED[name])
    assert lost == []


def test_the_aggregates_that_take_ignore_nulls_are_known(ctx):
    """DataFusion says which of its aggregates accept IGNORE NULLS.

    A subquery's Substrait form is screened for those (the property itself is
    gone there).
    """
    ctx.sql("SET datafusion.catalog.information_schema = true").collect()
    names = ctx.sql(
        "SELECT DISTINCT routine_name FROM information_schema.routines "
        "WHERE function_type = 'AGGREGATE'"
    ).to_pydict()["routine_name"]
    accepting = set()
    for name in names:
        for args in ("val", "val, o", "val, 0.5", "s, ','", "val > 1"):
            try:
                ctx.sql(f"SELECT {name}({args}) IGNORE NULLS FROM f").optimized_logical_plan()
            except Exception as exc:
                if "NULLS are not permitted" in str(exc):
                    break
                continue
            accepting.add(name)
            break
    assert accepting == detect_substrait_losses._NULL_TREATMENT


def test_a_subquery_without_what_a_loss_sits_on_passes(ctx):
    _, _, lost = _round_trip(ctx, "SELECT k FROM f WHERE val > (SELECT avg(val) FROM f)")
    assert lost == []
    _, _, lost = _round_trip(
        ctx, "SELECT k, (SELECT max(x) FROM (SELECT sum(val) OVER (ORDER BY o) AS x FROM f)) FROM f"
    )
    assert lost == ["what a window function in a subquery may hold"]
