"""The local runtime beyond the contract: TPC-H over 1-4 workers, threads and files freed.

The contract suite (tests/contract/) runs every runtime at one worker count;
the in-process runtime, cheap to start, is also checked at the others and with
the default task estimator.
"""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from distfusion import (
    DistributedConfig,
    DistributedContext,
    LocalRuntime,
    StaticWorkerResolver,
    TaskError,
    tpch,
)
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.contract.data import parquet_context

WORKERS = (1, 2, 4)  # 3: the contract suite


@pytest.mark.parametrize("workers", WORKERS, ids=[f"local-{w}" for w in WORKERS])
@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch(q, workers, runtime_for, tpch_dir, oracle):
    # Force one task per worker in every stage so small data still distributes.
    runtime = runtime_for("local", workers)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    tpch.register_tpch(ctx, tpch_dir)
    sql = tpch.query(q)
    assert_same_result(ctx.sql(sql).to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))
    stats = runtime.stats().values()
    assert all(s["live_tasks"] == 0 and s["bytes_held"] == 0 for s in stats), stats


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch_default_config(q, runtime_for, tpch_dir, oracle):
    """The default task estimator (bytes per task) on 4 workers."""
    sql = tpch.query(q)
    ctx = DistributedContext(runtime=runtime_for("local", 4))
    tpch.register_tpch(ctx, tpch_dir)
    assert_same_result(ctx.sql(sql).to_arrow_table(), oracle_result(oracle, sql), is_ordered(sql))


def test_zero_workers_is_rejected():
    with pytest.raises(ValueError, match="workers >= 1"):
        LocalRuntime(workers=0)
    with pytest.raises(ValueError, match="slots >= 1"):
        LocalRuntime(workers=2, slots=0)
    with pytest.raises(ValueError, match="at least one worker URL"):
        StaticWorkerResolver([])
    with pytest.raises(ValueError, match="distinct"):
        StaticWorkerResolver(["local://0", "local://0"])


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


def test_a_closed_runtime_leaves_no_thread_and_no_temporary_file(tmp_path, private_tmp):
    """After a task error and an early close, closing the runtime frees its threads."""
    threads_before = set(threading.enumerate())
    runtime = LocalRuntime(workers=4)
    try:
        ctx, files = parquet_context(runtime, tmp_path / "data")
        stream = ctx.sql("SELECT k, v, s FROM p").execute_stream()
        next(stream)
        stream.close()
        with open(files[1], "wb") as f:
            f.write(b"this is not a parquet file\n")
        with pytest.raises(TaskError):
            ctx.sql("SELECT k, count(*) AS n FROM p GROUP BY k").to_arrow_table()
    finally:
        runtime.close()
    assert set(threading.enumerate()) - threads_before == set()
    assert os.listdir(private_tmp) == []
