"""A panic in DataFusion's native code fails its query with a TaskError, within seconds.

A Rust panic reaches Python as pyo3's ``PanicException``, a ``BaseException``
that ``except Exception`` does not catch: the task's thread ended with its
output neither finished nor failed, and its consumers waited for it forever.
Now the task fails with a :class:`~distfusion.TaskPanicked` (a TaskError) naming
its stage and task, the query fails at once (the coordinator polls its workers
for failed tasks; a Spark executor tells the driver), its other tasks are
cancelled, and nothing stays behind. The panic is real: a UDF returns
strings where it declared int64, and DataFusion's ``sum`` panics over them
(tests/udf_funcs.py ``native_panic``; the session's Flight workers load it).

The panic first seen this way was DataFusion's own: the shuffle hashes its
keys with datafusion-spark's ``xxhash64``, which panics when every argument
is a scalar over a batch of several rows, as a ``CASE`` of literals is when
every row takes one branch (docs/datafusion-bugs.md). Shuffle keys are now
hashed as materialized columns; the query that showed it gives DataFusion's
answer.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from distfusion import DistributedConfig, DistributedContext, TaskPanicked, tpch
from tests.compare import assert_same_result, oracle_result
from tests.contract.conftest import wait_idle
from tests.udf_funcs import POISON, SLOW_S, native_panic

UNITS_PER_TASK = 120
"""Work units (one row each) of each task of the slow stage: a task runs them
one after the other, ``UNITS_PER_TASK * SLOW_S`` seconds (60 s) uncancelled."""

ERROR_WITHIN_S = 30.0
STOPPED_WITHIN_S = UNITS_PER_TASK * SLOW_S / 3
"""Seconds from the error until no task of any worker runs (20 s): the slow
stage's tasks were cancelled, as they would run on for 60 s (wide: a busy
machine, Spark's cancellation)."""


def _run(df) -> tuple[pa.Table | None, BaseException | None, bool]:
    """Collect ``df`` in a thread: (its result, what it raised, whether it ended in time).

    A query that hangs fails the test instead of hanging it (the thread is a
    daemon and stays behind).
    """
    out: list = [None, None]

    def collect() -> None:
        try:
            out[0] = df.to_arrow_table()
        except BaseException as exc:  # whatever it raised is what the test checks
            out[1] = exc

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    thread.join(ERROR_WITHIN_S)
    return out[0], out[1], not thread.is_alive()


def _running(runtime) -> int:
    """Tasks running now on every worker (a cancelled task runs until it stops)."""
    return sum(s.get("running_tasks", 0) for s in runtime.stats().values())


def test_a_native_panic_in_a_task_is_a_task_error(runtime, workers):
    # Two sibling stages: one task sums native_panic over the poisoned row and
    # panics at once; the other stage's tasks stream native_panic over slow
    # rows for a minute, unless cancelled. The head reads them side by side.
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_udf(native_panic)
    slow = pa.array(range(1, workers * UNITS_PER_TASK + 1), pa.int64())
    ctx.register_table("slow", pa.table({"k": slow}), max_rows_per_unit=1)
    ctx.register_table("poisoned", pa.table({"k": pa.array([POISON], pa.int64())}))
    df = ctx.sql(
        "SELECT sum(native_panic(k)) AS v FROM poisoned "
        "UNION ALL SELECT native_panic(k) AS v FROM slow"
    )
    (panicking,) = [
        s
        for s in df.stage_graph().stages
        if any(scan.source.name == "poisoned" for scan in s.scans)
    ]
    start = time.monotonic()
    _, raised, ended = _run(df)
    assert ended, f"the query neither returned nor raised in {ERROR_WITHIN_S} s"
    assert isinstance(raised, TaskPanicked), repr(raised)
    assert (raised.stage_id, raised.task_index) == (panicking.stage_id, 0), str(raised)
    assert raised.cause.startswith("DataFusion panicked: primitive array"), raised.cause
    assert f"stage {panicking.stage_id} task 0 failed on worker {raised.worker}" in str(raised)
    assert raised.worker and "PanicException" in raised.remote_traceback
    failed_s = time.monotonic() - start
    while _running(runtime):
        stopped_s = time.monotonic() - start - failed_s
        assert stopped_s < STOPPED_WITHIN_S, f"tasks still run {stopped_s:.0f} s after the error"
        time.sleep(0.1)
    wait_idle(runtime)
    # The runtime goes on.
    n = ctx.sql("SELECT count(*) AS n FROM slow").to_arrow_table().column("n")[0].as_py()
    assert n == len(slow)


SHOWN_BY = (
    "SELECT CASE WHEN l_orderkey IS NULL THEN 'none' WHEN l_quantity > 25 THEN 'big' "
    "ELSE 'small' END AS bucket, count(DISTINCT s_nationkey) AS n1, "
    "count(DISTINCT l_partkey) AS n2 "
    "FROM supplier LEFT JOIN lineitem ON s_suppkey = l_suppkey AND l_quantity > 49 "
    "GROUP BY 1"
)


def test_a_shuffle_key_of_one_value_per_batch(runtime, workers, tpch_dir, oracle):
    # Shuffled by the CASE (the grouping key), appended to the join's output:
    # every row of a batch takes the branch 'big'.
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    tpch.register_tpch(ctx, tpch_dir)
    df = ctx.sql(SHOWN_BY)
    got, raised, ended = _run(df)
    assert ended and raised is None, repr(raised)
    assert_same_result(got, oracle_result(oracle, SHOWN_BY), ordered=False)
    wait_idle(runtime)
