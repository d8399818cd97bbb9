"""Shared fixtures: TPC-H data generated with tpchgen-cli, the single-node oracle."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

# Streamed exchanges on for the whole suite (and the workers it starts): the
# tokio threads they need are fixed when DataFusion's runtime starts, before
# distfusion is imported (distfusion.worker.stream_inputs.STREAM_EXCHANGES).
os.environ.setdefault("DISTFUSION_STREAM_EXCHANGES", "1")
# Object store credentials come from each worker's environment, as on a cluster:
# fake ones for the local S3 server (tests/s3_server.py), which takes any.
for _var, _value in (
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
):
    os.environ.setdefault(_var, _value)

# The test session's own temporary directory, for it and every process it
# starts (Flight workers, Spark's JVM and Python workers): what distfusion leaves
# there is found when the session ends (pytest_sessionfinish), whatever else
# runs on the machine. pytest's own tmp_path directories stay where they were.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
SESSION_TMP = Path(tempfile.mkdtemp(prefix="pytest-session-tmp-"))
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = None  # gettempdir() reads TMPDIR again

import pytest  # noqa: E402
from datafusion import SessionContext  # noqa: E402

from distfusion import tpch  # noqa: E402
from distfusion.runtime.registry import runtime_from_name  # noqa: E402
from distfusion.worker.memory import is_running, root_owner  # noqa: E402
from tests.flight_cluster import start_workers, stop_workers  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TPCH_SCALE = float(os.environ.get("DISTFUSION_TEST_SCALE", "0.1"))


@pytest.fixture(scope="session")
def tpch_dir() -> Path:
    """TPC-H at scale factor 0.1 (4 Parquet files per table), generated once.

    Cached under ``data/`` (set ``DISTFUSION_TEST_DATA`` to use another directory).
    """
    path = Path(os.environ.get("DISTFUSION_TEST_DATA", REPO / "data" / f"tpch-sf{TPCH_SCALE:g}"))
    marker = path / ".complete"
    if not marker.exists():
        tpch.generate(TPCH_SCALE, path, parts=4)
        marker.touch()
    return path


@pytest.fixture(scope="session")
def oracle(tpch_dir) -> SessionContext:
    """Single-node DataFusion over the same files: the reference for every result."""
    ctx = SessionContext()
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server on 127.0.0.1 (moto, its own process), for the session."""
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


S3_BUCKET = "tpch"


@pytest.fixture(scope="session")
def s3_tpch(s3_server, tpch_dir) -> str:
    """``s3://tpch/sf<scale>``: the TPC-H files of :func:`tpch_dir`, uploaded to :func:`s3_server`.

    Register with :func:`s3_store` first: its endpoint is the local server.
    """
    prefix = f"sf{TPCH_SCALE:g}"
    s3_server.create_bucket(S3_BUCKET)
    s3_server.upload_dir(tpch_dir, S3_BUCKET, prefix)
    return f"s3://{S3_BUCKET}/{prefix}"


@pytest.fixture(scope="session")
def s3_store(s3_server):
    """``s3_store(bucket, **arguments)``: an ``AmazonS3`` store of the local server (no keys)."""
    from distfusion.io.object_store import AmazonS3

    def make(bucket: str = S3_BUCKET, **arguments):
        return AmazonS3(
            bucket_name=bucket, endpoint=s3_server.endpoint, allow_http=True, **arguments
        )

    return make


FLIGHT_WORKERS = 3


@pytest.fixture(scope="session")
def flight_workers():
    """URLs of three Flight worker processes on 127.0.0.1 (free ports).

    Started once per session and stopped at its end, even after a failure.
    They load the fault-injection UDFs (``tests.udf_funcs:FAULTS``) and no other.
    """
    procs = start_workers(FLIGHT_WORKERS, "--udf", "tests.udf_funcs:FAULTS")
    try:
        yield [p.url for p in procs]
    finally:
        stop_workers(procs)


@pytest.fixture(scope="session")
def spark_session():
    """The one SparkSession of the test session: embedded ``local[2]``.

    Spark retries failed task attempts there (see
    :class:`~distfusion.runtime.spark.SparkRuntime`).
    """
    runtime = runtime_from_name("spark", 2)
    # Spark Connect's service makes <java.io.tmpdir>/spark_connect_model_cache/<session id>
    # for every Connect session and leaves it when the application stops.
    jvm_tmp = runtime.spark.sparkContext._jvm.System.getProperty("java.io.tmpdir")
    model_cache = Path(jvm_tmp) / "spark_connect_model_cache"
    before = set(model_cache.iterdir()) if model_cache.exists() else None
    yield runtime.spark
    runtime.close()
    if model_cache.exists():
        for path in set(model_cache.iterdir()) - (before or set()):
            shutil.rmtree(path, ignore_errors=True)
        if before is None and not any(model_cache.iterdir()):
            model_cache.rmdir()


@pytest.fixture(scope="session")
def connect_session(spark_session):
    """A Spark Connect session on the test session's Spark application (``local[2]``).

    Spark Connect's service runs in the classic session's JVM
    (:func:`~distfusion.runtime.spark.connect_server.start_connect_server`): one
    application, its two task slots shared; the Connect session talks to it
    over gRPC on 127.0.0.1 and runs its Python tasks in Python workers of its
    own. Stopped before the classic session.
    """
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (the test extra)")
    from distfusion.runtime.spark.connect import connect_session as connect
    from distfusion.runtime.spark.connect_server import start_connect_server

    session = connect(start_connect_server(spark_session))
    yield session
    session.stop()


def with_tpch_views(session, tpch_dir):
    """Register the TPC-H tables as temp views over Parquet (native) in ``session``; a finalizer."""
    for table in tpch.TABLES:
        session.read.parquet(tpch.table_path(tpch_dir, table)).createOrReplaceTempView(table)

    def drop() -> None:
        for table in tpch.TABLES:
            session.catalog.dropTempView(table)

    return drop


@pytest.fixture(scope="module")
def spark(spark_session, tpch_dir):
    """The session's SparkSession with the TPC-H tables as temp views over Parquet (native)."""
    drop = with_tpch_views(spark_session, tpch_dir)
    yield spark_session
    drop()


SPARK_SESSIONS = ("classic", "connect")
"""The kinds of SparkSession ``any_spark`` gives: a classic one and a Spark Connect one."""


@pytest.fixture(scope="module", params=SPARK_SESSIONS)
def any_spark(request, tpch_dir):
    """:func:`spark`, once with the classic session and once with the Spark Connect one.

    For what PySpark users do, which must hold on both. A test that cannot
    hold on Spark Connect says so with ``@pytest.mark.connect_gap(raises=...,
    reason=...)``: a strict xfail of its Connect run (:func:`pytest_collection_modifyitems`).
    """
    name = "connect_session" if request.param == "connect" else "spark_session"
    session = request.getfixturevalue(name)
    drop = with_tpch_views(session, tpch_dir)
    yield session
    drop()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "connect_gap(raises, reason): the test cannot hold on Spark Connect (a strict xfail there)",
    )


LEFTOVER_WAIT_S = 30.0
"""How long the session's end waits for processes that are ending to remove their files."""


def distfusion_leftovers(root: Path) -> list[str]:
    """Names under ``root`` (one level) that distfusion made and nothing will delete.

    Everything named ``distfusion-*``, but the spill roots of processes still
    running (``distfusion-spill-<pid>-...``): this one's in-process workers'
    roots are deleted when they are closed or collected, else when it exits.
    """
    left = []
    for path in root.iterdir():
        owner = root_owner(path.name)
        if owner is not None and is_running(owner):
            continue
        if path.name.startswith("distfusion"):
            left.append(path.name)
    return sorted(left)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when distfusion left files in the session's temporary directory.

    Runs after every fixture's teardown; waits up to :data:`LEFTOVER_WAIT_S`
    for worker processes that are ending (issue 25: nothing distfusion creates
    may outlive the query or the process that made it).
    """
    gc.collect()  # unreachable runtimes' finalizers delete their spill roots
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while (left := distfusion_leftovers(SESSION_TMP)) and time.monotonic() < deadline:
        time.sleep(0.5)
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"distfusion left {len(left)} entries in the temporary directory: {left[:20]}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    """Each ``connect_gap`` test's run on the Spark Connect session is a strict xfail."""
    for item in items:
        mark = item.get_closest_marker("connect_gap")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if mark is not None and params.get("any_spark") == "connect":
            item.add_marker(
                pytest.mark.xfail(
                    raises=mark.kwargs["raises"], reason=mark.kwargs["reason"], strict=True
                )
            )


@pytest.fixture
def fail_task(spark_session):
    """``fail_task("STAGE:TASK:ATTEMPTS")`` makes that task raise inside Spark (cleared after)."""
    from distfusion.runtime.spark import FAIL_TASK_PROPERTY

    sc = spark_session.sparkContext
    yield lambda spec: sc.setLocalProperty(FAIL_TASK_PROPERTY, spec)
    sc.setLocalProperty(FAIL_TASK_PROPERTY, None)


@pytest.fixture
def fail_connect_task(connect_session):
    """``fail_connect_task("STAGE:TASK:ATTEMPTS")``: the same on the Connect session (a job tag).

    Tags are the calling thread's; removed after the test.
    """
    from distfusion.runtime.spark import FAIL_TASK_PROPERTY

    tags: list[str] = []

    def fail(spec: str) -> None:
        tags.append(f"{FAIL_TASK_PROPERTY}={spec}")
        connect_session.addTag(tags[-1])

    yield fail
    for tag in tags:
        connect_session.removeTag(tag)


# Runtime name -> options(request, workers) for runtime_from_name: what a runtime
# shares across the test session (worker processes, the SparkSession). Every
# runtime of the registry is tested; one without an entry is created from its name.
SESSION_OPTIONS = {
    "flight": lambda request, workers: {
        "urls": request.getfixturevalue("flight_workers")[:workers]
    },
    # Spark owns the task slots (2, from local[2]); ``workers`` only sizes the plan.
    "spark": lambda request, workers: {"spark": request.getfixturevalue("spark_session")},
}


@pytest.fixture(scope="session")
def runtime_for(request):
    """``runtime_for(name, workers)``: a runtime, created once per session and closed at the end."""
    cache: dict = {}

    def get(name: str, workers: int):
        key = (name, workers)
        if key not in cache:
            options = SESSION_OPTIONS.get(name, lambda request, workers: {})(request, workers)
            cache[key] = runtime_from_name(name, workers, **options)
        return cache[key]

    yield get
    for runtime in cache.values():
        runtime.close()
