"""Errors that name their cause and say what to do (issue 41, items 8 to 12).

Each test provokes the failure with real parts (a real child process, real
files, a real SparkSession, Flight workers on 127.0.0.1) and checks the
message names what went wrong, in time.
"""

from __future__ import annotations

import os
import textwrap
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distfusion import (
    ContextClosedError,
    DistributedConfig,
    DistributedContext,
    FlightRuntime,
    LocalRuntime,
    PlanningError,
    QueryCancelledError,
    WorkerUnavailableError,
)
from distfusion.testing.s3_server import S3Server

# A sitecustomize for a child Python: moto cannot be imported there, as when
# the test extra is not installed.
_WITHOUT_MOTO = textwrap.dedent(
    """
    import sys

    class _NoMoto:
        def find_spec(self, name, path=None, target=None):
            if name == "moto" or name.startswith("moto."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoMoto())
    """
)


# ------------------------------------------------------------- item 11: S3Server without moto
def test_the_s3_test_server_without_moto_says_so_and_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(_WITHOUT_MOTO)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    start = time.monotonic()
    with pytest.raises(ImportError) as caught:
        S3Server(timeout_s=60)
    assert time.monotonic() - start < 30
    message = str(caught.value)
    assert "No module named 'moto'" in message
    assert "pip install 'distfusion[test]'" in message


# ------------------------------------------------- item 12: a non-Parquet file in a directory
def _directory_with_a_stray_file(root) -> tuple[str, str]:
    """A directory of two Parquet files and one named ``.parquet`` that is not; both paths."""
    root.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"a": [i, i + 1]}), root / f"part-{i}.parquet")
    stray = root / "notes.parquet"
    stray.write_text("meeting notes, not Parquet\n")
    return str(root), str(stray)


@pytest.fixture
def local_ctx():
    ctx = DistributedContext(runtime=LocalRuntime(workers=2))
    yield ctx
    ctx.close()


def test_a_directory_with_a_file_that_is_not_parquet_names_the_file(local_ctx, tmp_path):
    directory, stray = _directory_with_a_stray_file(tmp_path / "t")
    for path in (directory, f"{directory}/*.parquet"):
        with pytest.raises(PlanningError) as caught:
            local_ctx.register_parquet("t", path)
        assert stray in str(caught.value)
        assert f"the file {stray} is not Parquet" in str(caught.value)
    with pytest.raises(PlanningError, match="notes.parquet"):
        local_ctx.read_parquet(directory)
    assert not local_ctx.ctx.table_exist("t")


def test_a_list_whose_first_file_is_not_parquet_names_it(local_ctx, tmp_path):
    directory, stray = _directory_with_a_stray_file(tmp_path / "t")
    with pytest.raises(PlanningError) as caught:
        local_ctx.register_parquet("t", [stray, f"{directory}/part-0.parquet"])
    assert f"the file {stray} is not Parquet" in str(caught.value)
    assert "leave it out of the list" in str(caught.value)


def test_an_object_store_directory_with_a_file_that_is_not_parquet_names_it(
    local_ctx, tmp_path, s3_server, s3_store
):
    directory, _ = _directory_with_a_stray_file(tmp_path / "t")
    s3_server.create_bucket("stray")
    s3_server.upload_dir(directory, "stray", "t")
    local_ctx.register_object_store("s3://", s3_store("stray"), "stray")
    with pytest.raises(PlanningError) as caught:
        local_ctx.register_parquet("t", "s3://stray/t/")
    assert "the file s3://stray/t/notes.parquet is not Parquet: no PAR1" in str(caught.value)


# --------------------------------------------------------------- item 10: a closed context
def _query_after_close(ctx: DistributedContext, tmp_path) -> list:
    """What each way of using ``ctx`` after its close() raises (after one query ran)."""
    ctx.from_pydict({"a": [1, 2, 3]}, name="t")
    df = ctx.sql("SELECT sum(a) AS s FROM t")
    assert df.to_pylist() == [{"s": 6}]  # the runtime started and ran a query
    ctx.close()
    raised = []
    for use in (
        df.to_pylist,  # a DataFrame made before close
        lambda: ctx.sql("SELECT count(*) FROM t").collect(),
        lambda: ctx.table("t").collect(),
        lambda: df.write_parquet(tmp_path / "out"),
    ):
        with pytest.raises(ContextClosedError) as caught:
            use()
        raised.append(caught.value)
    ctx.close()  # closing again does nothing
    return raised


@pytest.mark.parametrize("in_place_bytes", [0, None], ids=["distributed", "in-place"])
def test_a_closed_local_context_says_it_is_closed(tmp_path, in_place_bytes):
    config = DistributedConfig(in_place_bytes=in_place_bytes)
    ctx = DistributedContext(runtime=LocalRuntime(workers=2), config=config)
    for error in _query_after_close(ctx, tmp_path):
        assert "this DistributedContext was closed (its LocalRuntime is stopped)" in str(error)
        assert "make a new DistributedContext" in str(error)
        assert isinstance(error, RuntimeError) and not isinstance(error, QueryCancelledError)
    assert ctx.closed


def test_a_closed_flight_context_says_it_is_closed(tmp_path):
    ctx = DistributedContext(runtime=FlightRuntime.with_local_workers(2))
    for error in _query_after_close(ctx, tmp_path):
        assert "closed (its FlightRuntime is stopped)" in str(error)
        assert not isinstance(error, WorkerUnavailableError)


def test_a_context_closed_before_its_runtime_started_starts_none():
    started = []
    ctx = DistributedContext(runtime=lambda: started.append(1) or LocalRuntime(workers=1))
    ctx.close()
    with pytest.raises(ContextClosedError, match="this DistributedContext was closed: "):
        ctx.from_pydict({"a": [1]}).collect()
    assert started == []
