"""Errors that name their cause and say what to do (issue 41, items 8 to 12).

Each test provokes the failure with real parts (a real child process, real
files, a real SparkSession, Flight workers on 127.0.0.1) and checks the
message names what went wrong, in time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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
from distfusion.runtime.spark.reach import check_connect_server, check_master
from tests.s3_server import S3Server
from tests.test_docs import CONNECT_URL, code_blocks

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


# ------------------------------------------------------ items 8 and 9: Spark that cannot answer
def _free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_python(code: str, cwd) -> tuple[subprocess.CompletedProcess, float]:
    """``code`` in a new interpreter (no SparkSession active there); its result and seconds."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    return done, time.monotonic() - start


@pytest.mark.parametrize(
    ("master", "cause"),
    [
        ("spark://no-such-host.invalid:7077", "host 'no-such-host.invalid' does not resolve"),
        (f"spark://127.0.0.1:{_free_port()}", "(connection refused)"),
    ],
    ids=["unresolvable", "refused"],
)
def test_a_spark_master_that_cannot_be_reached_is_named_at_once(master, cause, tmp_path):
    done, seconds = _run_python(
        f"from distfusion import SparkRuntime\nSparkRuntime(master={master!r})", tmp_path
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("distfusion.errors.TransportError: "), done.stderr[-3000:]
    assert f"the Spark master {master} cannot be reached: " in last and cause in last
    assert "start-master.sh" in last
    assert seconds < 40  # Spark itself: 67 s, then "Py4JJavaError: <exception str() failed>"


def test_a_reachable_master_and_masters_without_an_address_pass():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_master(f"spark://no-such-host.invalid:7077,127.0.0.1:{port}")  # one of two
    for master in ("local[2]", "local-cluster[2,1,1024]", "yarn"):
        check_master(master)


def _readme_connect_block() -> str:
    """The README's Spark Connect example, with the test data (tests/test_docs.py's rules)."""
    (block,) = [b for b in code_blocks("README.md") if b.lang == "python" and CONNECT_URL in b.code]
    return block.code


def test_the_readme_connect_example_without_a_server_says_how_to_start_one(tmp_path, tpch_dir):
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (the test extra)")
    url = f"sc://localhost:{_free_port()}"
    code = _readme_connect_block().replace("data/tpch-sf1", str(tpch_dir))
    done, seconds = _run_python(code.replace(CONNECT_URL, url), tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"distfusion.errors.TransportError: no Spark Connect server answers at {url}: "
    )
    assert "(connection refused)" in last and "sbin/start-connect-server.sh" in last
    assert seconds < 40  # the example ends too: pyspark's exit hook does not retry the server


def test_a_connect_session_whose_server_answers_passes_at_once(connect_session):
    start = time.monotonic()
    check_connect_server(connect_session)
    assert time.monotonic() - start < 20
    assert not connect_session.client.is_closed


def test_a_port_that_is_no_connect_server_is_named_too(tmp_path):
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (the test extra)")
    with socket.create_server(("127.0.0.1", 0)) as server:  # takes connections, speaks no gRPC
        url = f"sc://127.0.0.1:{server.getsockname()[1]}"
        code = (
            "from pyspark.sql.connect.session import SparkSession\n"
            "from distfusion import SparkRuntime\n"
            f"SparkRuntime(spark=SparkSession.builder.remote({url!r}).create())\n"
        )
        done, seconds = _run_python(code, tmp_path)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"distfusion.errors.TransportError: no Spark Connect server answers at {url}: no gRPC connection within 5 s"
    ), done.stderr[-3000:]
    assert seconds < 40
