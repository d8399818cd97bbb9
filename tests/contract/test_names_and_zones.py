"""Identifier case rules and timestamp zones, as single-node DataFusion has them.

DataFusion folds unquoted identifiers to lower case and keeps quoted ones, for
table names given to ``register_*`` too (``register_table("T1")`` is table
``t1``). A timestamp's zone is part of its type: a cast to a zone keeps it, and
zone-dependent functions compute in it (Substrait has no field for the zone, so
such casts run on the coordinator).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from tests.compare import assert_same_result, is_ordered

T = pa.table({"A": [1, 2, 3, 4], "b": [3, 4, 5, 6], "Mixed": ["p", "q", "p", "r"]})
Z = pa.table(
    {
        "ts": pa.array([0, 86399, 90000, None], pa.timestamp("s", tz="Asia/Tokyo")),
        "naive": pa.array([0, 86399, 90000, 3600], pa.timestamp("ms")),
    }
)

NAMES = [
    "SELECT * FROM T1",
    "SELECT * FROM t1",
    'SELECT * FROM "t1"',
    'SELECT "A", b FROM t1',
    'SELECT "Mixed", count(*) AS "N" FROM t1 GROUP BY "Mixed"',
    "SELECT B, SUM(b) AS S FROM T1 GROUP BY B",
    'SELECT x."A" FROM t1 AS X JOIN "Q" x2 ON X."A" = x2.k',
    'SELECT * FROM "Q"',
]

ZONES = [
    "SELECT ts FROM z",
    "SELECT date_trunc('day', ts) AS d, count(*) AS n FROM z GROUP BY 1",
    "SELECT arrow_cast(TIMESTAMP '2024-01-01 00:00:00', 'Timestamp(Second, Some(\"+08:00\"))') AS t",
    "SELECT arrow_cast(naive, 'Timestamp(Second, Some(\"+08:00\"))') AS t FROM z",
    "SELECT date_trunc('day', arrow_cast(ts, 'Timestamp(Second, Some(\"+08:00\"))')) AS d FROM z",
    "SELECT ts AT TIME ZONE 'Europe/Paris' AS p FROM z",
    "SELECT CAST(ts AS VARCHAR) AS s, date_part('hour', ts) AS h FROM z",
    "SELECT ts FROM z WHERE ts > TIMESTAMP '1970-01-01 12:00:00'",
    "SELECT arrow_cast(naive, 'Timestamp(Millisecond, Some(\"UTC\"))') AS u FROM z",
]


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    q = pa.table({"k": [1, 3, 9]})
    for c in (oracle,):
        c.register_record_batches("T1", [T.to_batches()])
        c.register_record_batches('"Q"', [q.to_batches()])
        c.register_record_batches("z", [Z.to_batches()])
    ctx.register_table("T1", T, max_rows_per_unit=1)
    ctx.register_table('"Q"', q, max_rows_per_unit=1)
    ctx.register_table("z", Z, max_rows_per_unit=1)
    return ctx, oracle


def _same(ctx, oracle, sql):
    try:
        expected = oracle.sql(sql).to_arrow_table()
    except Exception as exc:  # DataFusion refuses: so must distfusion, with its message
        with pytest.raises(PlanningError) as info:
            ctx.sql(sql).to_arrow_table()
        assert str(info.value) == str(exc)
        return None
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), expected, is_ordered(sql))
    return df


@pytest.mark.parametrize("sql", NAMES)
def test_identifiers_resolve_as_in_datafusion(runtime, workers, sql):
    ctx, oracle = _contexts(runtime, workers)
    df = _same(ctx, oracle, sql)
    if df is not None:
        assert df.coordinator_only() is None


def test_registered_names_fold_as_in_datafusion(runtime, workers):
    ctx, oracle = _contexts(runtime, workers)
    assert set(ctx.table_names()) == set(oracle.catalog().schema().names()) == {"t1", "Q", "z"}
    ctx.deregister_table("T1")
    assert "t1" not in ctx.table_names()


@pytest.mark.parametrize("sql", ZONES)
def test_timestamp_zones_as_in_datafusion(runtime, workers, sql):
    ctx, oracle = _contexts(runtime, workers)
    _same(ctx, oracle, sql)


def test_a_cast_to_a_zone_runs_on_the_coordinator_and_says_why(runtime, workers):
    ctx, _ = _contexts(runtime, workers)
    df = ctx.sql(ZONES[4])
    assert "+08:00" in df.coordinator_only()
    assert ctx.sql("SELECT date_trunc('day', ts) AS d FROM z").coordinator_only() is None
