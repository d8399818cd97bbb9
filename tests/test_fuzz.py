"""The randomized differential fuzzer (tests/fuzz_sql.py) in the test suite.

A fast seeded profile runs in every ``make test`` (local runtime, a few
seconds); ``make fuzz`` (the ``slow`` marker) runs thousands of queries on the
local runtime and a sample on Flight and Spark. A finding of the local runs is
shrunk and saved under tests/fuzz_regressions/ (tests/test_fuzz_regressions.py
replays every saved case); the test still fails and prints it.
"""

from __future__ import annotations

import os

import pytest

from tests import fuzz_sql

FAST_QUERIES = 200
SLOW_QUERIES = int(os.environ.get("DISTFUSION_FUZZ_QUERIES", "2000"))
SAMPLE_QUERIES = int(os.environ.get("DISTFUSION_FUZZ_SAMPLE_QUERIES", "40"))


def _assert_agrees(report: fuzz_sql.Report) -> None:
    findings = "\n".join(f"query {i}: {sql}\n  {what}" for i, sql, what in report.mismatches)
    assert not report.mismatches, f"{len(report.mismatches)} of {report.ran}:\n{findings}"
    assert report.ran > 0.9 * (report.ran + report.invalid), "the generator makes valid SQL"


def test_fuzz_fast_profile(runtime_for):
    report = fuzz_sql.run(0, FAST_QUERIES, lambda w: runtime_for("local", w), tables_every=40)
    _assert_agrees(report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_local(runtime_for, seed):
    report = fuzz_sql.run(seed, SLOW_QUERIES // 2, lambda w: runtime_for("local", w), keep=True)
    _assert_agrees(report)


@pytest.mark.slow
@pytest.mark.parametrize("runtime_name", ["flight", "spark"])
def test_fuzz_sample_on_cluster_runtimes(runtime_for, runtime_name):
    # Flight has three worker processes and Spark two slots: at most that many.
    cap = 3 if runtime_name == "flight" else 2
    report = fuzz_sql.run(
        3, SAMPLE_QUERIES, lambda w: runtime_for(runtime_name, min(w, cap)), tables_every=20
    )
    _assert_agrees(report)


def test_datafusions_grouped_max_over_nan_depends_on_batches():
    """Why the fuzzer does not take min/max of a float with NaN (tests/compare.py).

    Found by ``test_fuzz_local[1]``: distributed, ``max(v)`` per group was NaN
    where DataFusion said 8.25. DataFusion answers both, for the same rows,
    depending only on the batches they arrive in.
    """
    import pyarrow as pa
    from datafusion import SessionConfig, SessionContext

    nan, x = (
        pa.record_batch({"k": [1], "v": [float("nan")]}),
        pa.record_batch({"k": [1], "v": [8.25]}),
    )
    # One partition and one thread, so the batch order is the only difference
    # (with two partitions the answer also depends on which arrives first).
    one = SessionContext(SessionConfig().with_target_partitions(1))
    two = SessionContext(SessionConfig().with_target_partitions(1))
    one.register_record_batches("t", [[nan, x]])
    two.register_record_batches("t", [[x, nan]])
    sql = "SELECT max(v) AS m FROM t GROUP BY k"
    assert one.sql(sql).to_pylist() == [{"m": 8.25}]
    assert str(two.sql(sql).to_pylist()) == "[{'m': nan}]"
