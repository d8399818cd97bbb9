"""Bad input fails before any task starts, with DataFusion's own words.

Invalid SQL, an unknown table or column: :class:`PlanningError` (also a
``ValueError``) from ``ctx.sql``, before the runtime is handed a stage graph;
a runtime that reports no workers fails planning clearly.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from datafusion import SessionContext

from distfusion import DistfusionError, DistributedContext, PlanningError
from tests.contract.conftest import RecordingRuntime, idle
from tests.contract.data import context


@pytest.mark.parametrize(
    ("sql", "datafusion_says"),
    [
        ("SELEC k FROM t", "Expected: an SQL statement, found: SELEC"),
        ("SELECT k FROM t WHERE", "Expected: an expression"),
        ("SELECT * FROM no_such_table", "table 'datafusion.public.no_such_table' not found"),
        ("SELECT no_such_column FROM t", "No field named no_such_column"),
        ("SELECT k FROM t; SELECT * FROM missing", "table 'datafusion.public.missing' not found"),
        ("SELECT k, sum(v) FROM t", "GROUP BY"),
    ],
    ids=[
        "syntax",
        "truncated",
        "unknown-table",
        "unknown-column",
        "second-statement",
        "missing-group-by",
    ],
)
def test_bad_sql_raises_planning_error_before_any_task(runtime, sql, datafusion_says):
    ctx = context(runtime)
    with pytest.raises(PlanningError) as info:
        ctx.sql(sql)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, DistfusionError)
    assert datafusion_says in str(err)
    # DataFusion's own message, verbatim, for the failing statement.
    failing = sql.split(";")[-1]
    with pytest.raises(Exception) as single_node:  # DataFusion raises a bare Exception
        plain = SessionContext()
        plain.register_record_batches("t", [pa.table({"k": [1], "v": [1.0]}).to_batches()])
        plain.sql(failing)
    assert str(single_node.value).removeprefix("DataFusion error: ") in str(err)
    assert runtime.executed == [], "no stage graph was handed to the runtime"
    assert idle(runtime)


def test_planning_error_leaves_the_context_usable(runtime):
    ctx = context(runtime)
    with pytest.raises(PlanningError):
        ctx.sql("SELECT * FROM nope")
    with pytest.raises(PlanningError, match="no SQL statement"):
        ctx.sql("  ;  ")
    assert runtime.executed == []
    assert ctx.sql("SELECT sum(v) AS s FROM t").to_pylist() == [{"s": 10.0}]
    assert len(runtime.executed) == 1


def test_runtime_with_no_workers_fails_planning_clearly(runtime):
    class NoWorkers(RecordingRuntime):
        def num_workers(self) -> int:
            return 0

    empty = NoWorkers(runtime.inner)
    c = DistributedContext(runtime=empty)
    c.register_table("t", pa.table({"k": [1, 2]}))
    df = c.sql("SELECT count(*) FROM t")
    with pytest.raises(PlanningError, match="no workers"):
        df.to_arrow_table()
    assert empty.executed == []
