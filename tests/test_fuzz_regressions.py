"""Kept fuzzer findings are replayed, and the shrinker that keeps them does its job.

``python -m tests.fuzz_sql --keep`` (and the ``make fuzz`` runs) shrink each
finding -- fewer rows, fewer clauses -- and save it under
``tests/fuzz_regressions/case-*``; every case there must agree with DataFusion
from then on. The first cases are bugs fixed before the fuzzer could keep
them: a decimal average computed through float64, and ``IGNORE NULLS`` lost
on the way through Substrait (issue 15).
"""

from __future__ import annotations

import pytest
from datafusion import SessionContext

from tests import fuzz_sql

CASES = sorted(fuzz_sql.REGRESSIONS.glob("case-*"))


def test_cases_are_kept():
    assert len(CASES) >= 2


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kept_case_agrees_with_datafusion(case, runtime_for):
    tables, sql, config = fuzz_sql.load_case(case)
    oracle, dist = fuzz_sql.contexts(tables, lambda w: runtime_for("local", w))
    assert fuzz_sql.check(oracle, dist[config], sql) is None  # ValueError: DataFusion rejects it


def test_shrink_keeps_the_failure_and_drops_the_rest():
    tables = fuzz_sql.make_tables(5)
    target = next(r["k"] for r in tables["t0"].to_pylist() if r["k"] is not None and r["s"])
    sql = (
        "SELECT k, s FROM t0 WHERE k IS NOT NULL AND s IS NOT NULL AND k32 IS NOT NULL "
        "ORDER BY k, s LIMIT 100"
    )

    def fails(ts, query) -> bool:  # a stand-in bug: the answer holds a row with k = target
        ctx = SessionContext()
        for name, t in ts.items():
            ctx.register_record_batches(name, [t.to_batches() or [fuzz_sql._empty(t)]])
        try:
            rows = ctx.sql(query).to_pylist()
        except Exception:
            return False
        return any(r.get("k") == target for r in rows)

    assert fails(tables, sql) and tables["t0"].num_rows > 1
    small, small_sql = fuzz_sql.shrink(tables, sql, fails, budget_s=120)
    assert fails(small, small_sql)
    assert small["t0"].num_rows == 1 and small["t0"].column("k")[0].as_py() == target
    assert small["t1"].num_rows == 0 and small["t2"].num_rows == 0
    assert "LIMIT" not in small_sql and "ORDER" not in small_sql and "k32" not in small_sql
