"""A query whose meaning Substrait cannot carry gives DataFusion's answer anyway.

DataFusion 55's Substrait producer drops ``IGNORE NULLS`` without an error:
``first_value(val ORDER BY o) IGNORE NULLS`` came back as ``first_value(val
ORDER BY o)``, NULL where DataFusion says 1. Such a query runs whole on the
coordinator with DataFusion's own plan, and ``explain()`` says so; the same
query without the modifier is still distributed.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from tests.compare import assert_same_result

F = pa.table(
    {
        "k": [1, 1, 1, 2, 2, 3],
        "val": [None, 1, 2, None, None, 7],
        "o": [1, 2, 3, 1, 2, 1],
    }
)

LOSSY = {
    "first-value-aggregate": (
        "SELECT k, first_value(val ORDER BY o) IGNORE NULLS AS v FROM f GROUP BY k"
    ),
    "last-value-aggregate": (
        "SELECT k, last_value(val ORDER BY o DESC) IGNORE NULLS AS v FROM f GROUP BY k"
    ),
    "first-value-window": (
        "SELECT k, o, first_value(val) IGNORE NULLS OVER (PARTITION BY k ORDER BY o) AS v FROM f"
    ),
}


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    oracle.register_record_batches("f", [F.to_batches()])
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_table("f", F, max_rows_per_unit=2)
    return ctx, oracle


@pytest.mark.parametrize("name", list(LOSSY))
def test_ignore_nulls_gives_datafusions_answer(runtime, workers, name):
    ctx, oracle = _contexts(runtime, workers)
    sql = LOSSY[name]
    df = ctx.sql(sql)
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    assert "IGNORE NULLS" in df.coordinator_only()
    assert df.explain().startswith("coordinator only (single-node DataFusion)")
    with pytest.raises(PlanningError, match="runs on the coordinator"):
        df.stage_graph()
    assert runtime.executed == [], "no stage graph was handed to the runtime"


def test_respect_nulls_is_still_distributed(runtime, workers):
    ctx, oracle = _contexts(runtime, workers)
    sql = "SELECT k, first_value(val ORDER BY o) AS v FROM f GROUP BY k"
    df = ctx.sql(sql)
    assert df.coordinator_only() is None
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    assert len(runtime.executed) == 1
