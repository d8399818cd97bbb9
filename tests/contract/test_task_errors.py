"""A failed task is a TaskError naming its stage, task and worker, and the runtime goes on.

Wherever the task ran (a thread, a Flight worker process, a Spark executor or
the driver), the error reaches the caller with its kind, the stage, the task,
the worker, the cause and the remote traceback; afterwards no worker holds
anything of the query and the runtime answers the next query.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from distfusion import PlanningError, TaskError
from tests.contract.conftest import wait_idle
from tests.contract.data import FILES, ROWS_PER_FILE, TASKS, context, parquet_context

COORDINATOR = "coordinator"


def _assert_names_task(err: TaskError, stage_id: int, task_index: int) -> None:
    assert (err.stage_id, err.task_index) == (stage_id, task_index)
    assert err.worker and err.worker != COORDINATOR
    msg = str(err)
    assert f"stage {stage_id}" in msg and f"task {task_index}" in msg and err.cause in msg
    assert "Traceback" in err.remote_traceback
    assert not isinstance(err, PlanningError)


def test_task_error_in_a_leaf_stage_names_the_task(runtime):
    ctx = context(runtime)
    # One work unit per row; only the row 'x' fails to cast, so exactly its task fails.
    ctx.register_table(
        "s", pa.table({"k": [1, 2, 3, 4], "s": ["1", "2", "x", "4"]}), max_rows_per_unit=1
    )
    df = ctx.sql("SELECT k, CAST(s AS INT) AS i FROM s")
    leaf = df.stage_graph().stages[0]
    (bad_task,) = [
        i
        for i, units in enumerate(leaf.scans[0].task_units)
        if any("x" in pa.ipc.open_stream(u.ipc).read_all().column("s").to_pylist() for u in units)
    ]
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    _assert_names_task(info.value, leaf.stage_id, bad_task)
    assert "Cannot cast string 'x'" in info.value.cause
    wait_idle(runtime)


def test_task_error_in_an_upper_stage(runtime):
    ctx = context(runtime)
    ctx.register_table(
        "s",
        pa.table({"k": [1, 2, 1, 2, 3, 3], "s": ["1", "2", "1", "x", "5", "6"]}),
        max_rows_per_unit=2,
    )
    df = ctx.sql("SELECT k, CAST(max(s) AS INT) AS m FROM s GROUP BY k")
    final = df.stage_graph().stages[1]  # partial aggregate -> shuffle -> final aggregate + cast
    assert not final.is_leaf and "CAST" in final.plan_text.upper()
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    assert info.value.stage_id == final.stage_id
    assert 0 <= info.value.task_index < final.num_tasks
    assert info.value.worker and info.value.worker != COORDINATOR
    assert "Cannot cast string 'x'" in info.value.cause
    wait_idle(runtime)


def test_task_error_in_the_head_stage_names_the_coordinator(runtime):
    ctx = context(runtime)
    ctx.register_table("s", pa.table({"s": ["1", "x", "3"]}), max_rows_per_unit=1)
    df = ctx.sql("SELECT CAST(max(s) AS INT) AS m FROM s")
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    head = df.stage_graph().head
    err = info.value
    assert (err.stage_id, err.task_index, err.worker) == (head.stage_id, 0, COORDINATOR)
    wait_idle(runtime)


@pytest.mark.parametrize("damage", ["garbage", "truncate", "garbage-same-size"])
def test_corrupt_parquet_raises_task_error_and_leaves_nothing_behind(runtime, tmp_path, damage):
    ctx, files = parquet_context(runtime, tmp_path / "data")
    df = ctx.sql("SELECT k, count(*) AS n, sum(v) AS sv, max(s) AS ms FROM p GROUP BY k")
    assert df.to_arrow_table().num_rows == 97  # the files are fine so far
    leaf = df.stage_graph().stages[0]
    assert leaf.is_leaf and leaf.num_tasks == TASKS
    bad = files[2]
    (bad_task,) = [
        i for i, units in enumerate(leaf.scans[0].task_units) if any(u.path == bad for u in units)
    ]
    size = os.path.getsize(bad)
    if damage == "garbage":
        with open(bad, "wb") as f:
            f.write(b"this is not a parquet file\n" * 10)
    elif damage == "truncate":
        with open(bad, "r+b") as f:
            f.truncate(size // 2)
    else:  # the footer survives, the column chunks it points to do not
        with open(bad, "r+b") as f:
            f.seek(4)
            f.write(b"\xff" * (size // 2))
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    _assert_names_task(info.value, leaf.stage_id, bad_task)
    assert "DataFusion error" in info.value.cause
    wait_idle(runtime)


def test_runtime_is_usable_after_a_task_error(runtime, tmp_path):
    ctx, files = parquet_context(runtime, tmp_path / "data")
    good = open(files[0], "rb").read()
    df = ctx.sql("SELECT count(*) AS n, sum(v) AS sv FROM p")
    expected = df.to_pylist()
    with open(files[0], "wb") as f:
        f.write(b"junk")
    with pytest.raises(TaskError):
        df.to_arrow_table()
    with open(files[0], "wb") as f:
        f.write(good)
    total = FILES * ROWS_PER_FILE
    assert df.to_pylist() == expected == [{"n": total, "sv": float(sum(range(total)))}]
    wait_idle(runtime)
