"""Bad input: errors are raised early, name what failed, and leave nothing behind.

- invalid SQL, an unknown table or column: :class:`PlanningError` (also a
  ``ValueError``) from ``ctx.sql``, keeping DataFusion's own message, before any
  task starts;
- a task that fails (a corrupt Parquet file, a cast that fails on one row):
  :class:`TaskError` naming the stage, the task and the cause; afterwards no task
  is live on any worker, and once the runtime is closed no thread and no
  temporary file is left;
- no workers: a clear ``ValueError`` / :class:`PlanningError`;
- a DataFrame runs again, and closing a result stream early frees every task.

LocalRuntime only: no Spark, no sockets.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import (
    DistfusionError,
    DistributedConfig,
    DistributedContext,
    LocalRuntime,
    PlanningError,
    StaticWorkerResolver,
    TaskError,
)
from distfusion.stages import StageGraph

FILES = 4
ROWS_PER_FILE = 5000


class RecordingRuntime:
    """A Runtime that forwards to a LocalRuntime and records every graph it is asked to run."""

    def __init__(self, inner: LocalRuntime) -> None:
        self.inner = inner
        self.executed: list[StageGraph] = []

    def num_workers(self) -> int:
        return self.inner.num_workers()

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        self.executed.append(graph)
        return self.inner.execute(graph)

    def start_query(self, query_id: str):
        return _RecordingRun(self, self.inner.start_query(query_id))

    def stats(self) -> dict:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class _RecordingRun:
    """A QueryRun that records the graph whose head stage it streams."""

    def __init__(self, runtime: RecordingRuntime, inner) -> None:
        self.runtime = runtime
        self.inner = inner

    def run_stages(self, graph: StageGraph, stage_ids: list[int]):
        return self.inner.run_stages(graph, stage_ids)

    def stream_head(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        self.runtime.executed.append(graph)
        return self.inner.stream_head(graph)

    def close(self) -> None:
        self.inner.close()


def idle(stats: dict) -> bool:
    """True when no worker holds a task or a byte."""
    return all(s == {"live_tasks": 0, "bytes_held": 0} for s in stats.values())


def write_parquet_dir(path) -> list[str]:
    """FILES Parquet files of ROWS_PER_FILE rows each under ``path``; their paths."""
    path.mkdir()
    files = []
    for i in range(FILES):
        start = i * ROWS_PER_FILE
        table = pa.table(
            {
                "k": pa.array([x % 97 for x in range(start, start + ROWS_PER_FILE)], pa.int64()),
                "v": pa.array([float(x) for x in range(start, start + ROWS_PER_FILE)]),
                "s": pa.array([f"row-{x}" for x in range(start, start + ROWS_PER_FILE)]),
            }
        )
        f = str(path / f"part-{i}.parquet")
        pq.write_table(table, f, row_group_size=1000)
        files.append(f)
    return files


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point Python's and DataFusion's temporary directory at an empty private one.

    Other test sessions may write to the machine's temp dir at the same time, so
    "no temporary file left behind" is checked on a directory only this test uses.
    """
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert tempfile.gettempdir() == str(tmp)
    return tmp


@pytest.fixture
def runtime():
    """A recording 4-worker LocalRuntime, closed at the end of the test."""
    rt = RecordingRuntime(LocalRuntime(workers=4))
    yield rt
    rt.close()


@pytest.fixture
def ctx(runtime):
    c = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=4))
    c.register_table(
        "t", pa.table({"k": [1, 2, 3, 4], "v": [1.0, 2.0, 3.0, 4.0]}), max_rows_per_unit=1
    )
    return c


# ------------------------------------------------------------------ planning


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
def test_bad_sql_raises_planning_error_before_any_task(ctx, runtime, sql, datafusion_says):
    before = runtime.stats()
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
    assert runtime.stats() == before and idle(before)


def test_planning_error_leaves_the_context_usable(ctx, runtime):
    with pytest.raises(PlanningError):
        ctx.sql("SELECT * FROM nope")
    assert ctx.sql("SELECT sum(v) AS s FROM t").to_pylist() == [{"s": 10.0}]
    assert len(runtime.executed) == 1


def test_empty_sql_is_a_planning_error(ctx, runtime):
    with pytest.raises(PlanningError, match="no SQL statement"):
        ctx.sql("  ;  ")
    assert runtime.executed == []


def test_missing_file_at_registration(tmp_path, runtime):
    c = DistributedContext(runtime=runtime)
    missing = tmp_path / "nothing-here.parquet"
    with pytest.raises(PlanningError) as info:
        c.register_parquet("m", missing)
    msg = str(info.value)
    assert str(missing) in msg and "'m'" in msg and "no such file or directory" in msg
    assert "m" not in c.table_names()
    # The table was not half-registered: a query on it is an unknown-table error.
    with pytest.raises(PlanningError, match="not found"):
        c.sql("SELECT * FROM m")
    with pytest.raises(PlanningError, match="no such file or directory"):
        c.register_csv("m", tmp_path / "nothing-here.csv")
    assert runtime.executed == []


def test_empty_directory_at_registration(tmp_path, runtime):
    c = DistributedContext(runtime=runtime)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlanningError, match="empty"):
        c.register_parquet("m", tmp_path / "empty")


# ------------------------------------------------------------------ workers


def test_zero_workers_is_rejected():
    with pytest.raises(ValueError, match="workers >= 1"):
        LocalRuntime(workers=0)
    with pytest.raises(ValueError, match="slots >= 1"):
        LocalRuntime(workers=2, slots=0)
    with pytest.raises(ValueError, match="at least one worker URL"):
        StaticWorkerResolver([])
    with pytest.raises(ValueError, match="distinct"):
        StaticWorkerResolver(["local://0", "local://0"])


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


# ------------------------------------------------------------------ task errors


@contextlib.contextmanager
def parquet_on_four_workers(tmp_path) -> Iterator[tuple[DistributedContext, list]]:
    """Table ``p`` (``write_parquet_dir``) on ``LocalRuntime(workers=4)``, 4 tasks per stage.

    Yields the context and the Parquet files; on exit the runtime is closed
    and no thread it started may be left.
    """
    files = write_parquet_dir(tmp_path / "data")
    threads_before = set(threading.enumerate())
    rt = LocalRuntime(workers=4)
    try:
        c = DistributedContext(runtime=rt, config=DistributedConfig(tasks_per_stage=4))
        c.register_parquet("p", tmp_path / "data")
        yield c, files
    finally:
        rt.close()
    assert set(threading.enumerate()) - threads_before == set()


@pytest.mark.parametrize("damage", ["garbage", "truncate", "garbage-same-size"])
def test_corrupt_parquet_raises_task_error_and_leaves_nothing_behind(tmp_path, private_tmp, damage):
    with parquet_on_four_workers(tmp_path) as (c, files):
        df = c.sql("SELECT k, count(*) AS n, sum(v) AS sv, max(s) AS ms FROM p GROUP BY k")
        assert df.to_arrow_table().num_rows == 97  # the files are fine so far
        graph = df.stage_graph()
        leaf = graph.stages[0]
        assert leaf.is_leaf and leaf.num_tasks == 4

        bad = files[2]
        (bad_task,) = [
            i
            for i, units in enumerate(leaf.scans[0].task_units)
            if any(u.path == bad for u in units)
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
        err = info.value
        assert (err.stage_id, err.task_index) == (leaf.stage_id, bad_task)
        assert err.worker.startswith("local://")
        assert "DataFusion error" in err.cause
        msg = str(err)
        assert f"stage {leaf.stage_id}" in msg and f"task {bad_task}" in msg and err.cause in msg
        assert not isinstance(err, PlanningError)
        # Every task of the failed query is gone from every worker.
        assert idle(c.runtime.stats()), c.runtime.stats()
    assert os.listdir(private_tmp) == []


def test_task_error_in_a_leaf_stage_names_the_task(ctx):
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
    assert (info.value.stage_id, info.value.task_index) == (leaf.stage_id, bad_task)
    assert "Cannot cast string 'x'" in str(info.value)


def test_task_error_in_an_upper_stage(ctx, runtime):
    ctx.register_table(
        "s",
        pa.table({"k": [1, 2, 1, 2, 3, 3], "s": ["1", "2", "1", "x", "5", "6"]}),
        max_rows_per_unit=2,
    )
    df = ctx.sql("SELECT k, CAST(max(s) AS INT) AS m FROM s GROUP BY k")
    graph = df.stage_graph()
    final = graph.stages[1]  # partial aggregate -> shuffle -> final aggregate + cast
    assert not final.is_leaf and "CAST" in final.plan_text.upper()
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    assert info.value.stage_id == final.stage_id
    assert 0 <= info.value.task_index < final.num_tasks
    assert "Cannot cast string 'x'" in info.value.cause
    assert idle(runtime.stats())


def test_task_error_in_the_head_stage_names_the_coordinator(ctx, runtime):
    ctx.register_table("s", pa.table({"s": ["1", "x", "3"]}), max_rows_per_unit=1)
    df = ctx.sql("SELECT CAST(max(s) AS INT) AS m FROM s")
    with pytest.raises(TaskError) as info:
        df.to_arrow_table()
    head = df.stage_graph().head
    assert (info.value.stage_id, info.value.task_index, info.value.worker) == (
        head.stage_id,
        0,
        "coordinator",
    )
    assert idle(runtime.stats())


def test_runtime_is_usable_after_a_task_error(tmp_path, runtime):
    files = write_parquet_dir(tmp_path / "data")
    c = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=4))
    c.register_parquet("p", tmp_path / "data")
    good = open(files[0], "rb").read()
    df = c.sql("SELECT count(*) AS n, sum(v) AS sv FROM p")
    expected = df.to_pylist()
    with open(files[0], "wb") as f:
        f.write(b"junk")
    with pytest.raises(TaskError):
        df.to_arrow_table()
    with open(files[0], "wb") as f:
        f.write(good)
    assert (
        df.to_pylist()
        == expected
        == [{"n": FILES * ROWS_PER_FILE, "sv": float(sum(range(FILES * ROWS_PER_FILE)))}]
    )
    assert idle(runtime.stats())


# ------------------------------------------------------------------ re-runs and streams


def test_same_dataframe_runs_twice(tmp_path, runtime):
    write_parquet_dir(tmp_path / "data")
    c = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=4))
    c.register_parquet("p", tmp_path / "data")
    df = c.sql("SELECT k, count(*) AS n, sum(v) AS sv FROM p GROUP BY k ORDER BY k")
    first = df.to_arrow_table()
    assert idle(runtime.stats())
    second = df.to_arrow_table()
    assert first.equals(second) and first.num_rows == 97
    assert idle(runtime.stats())
    # Each run is a distinct query on the workers.
    assert len(runtime.executed) == 2
    assert runtime.executed[0].query_id != runtime.executed[1].query_id


def test_closing_the_result_stream_early_frees_every_task(tmp_path, private_tmp):
    with parquet_on_four_workers(tmp_path) as (c, _):
        df = c.sql("SELECT k, v, s FROM p")
        total = df.to_arrow_table().num_rows
        assert total == FILES * ROWS_PER_FILE
        stream = df.execute_stream()
        first = next(stream)
        assert 0 < first.num_rows < total, "the result comes in several batches"
        stream.close()
        assert idle(c.runtime.stats()), c.runtime.stats()
        # The runtime still answers, with every row.
        assert df.to_arrow_table().num_rows == total
        assert idle(c.runtime.stats())
    assert os.listdir(private_tmp) == []


def test_closing_a_stream_before_reading_runs_nothing(ctx, runtime):
    stream = ctx.sql("SELECT k FROM t").execute_stream()
    stream.close()
    assert idle(runtime.stats())
