"""Which Python the Spark executors run distfusion's tasks with, and the error when it lacks it."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
import venv
from pathlib import Path

import pytest

import distfusion.spark
from distfusion import tpch
from distfusion.errors import TransportError
from distfusion.runtime.spark import EXECUTORS_SECTION, SparkRuntime
from tests.conftest import REPO

# A PySpark user's script: their own local session, made with the builder.
CLASSIC_SESSION = """
import sys
from pyspark.sql import SparkSession
import distfusion.spark

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
spark.read.parquet(sys.argv[1]).filter("r_regionkey > 1").createOrReplaceTempView("big_regions")
print(distfusion.spark.sql(spark, "SELECT count(*) AS n FROM big_regions").to_pylist())
spark.stop()
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A ``python3`` of this Python's version without distfusion, datafusion or pyarrow."""
    root = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python3"
    probe = subprocess.run([python, "-c", "import pyarrow"], capture_output=True)
    assert probe.returncode != 0, "the bare venv must not see pyarrow"
    return str(python)


@pytest.mark.slow
def test_classic_session_runs_tasks_with_the_drivers_python(bare_python, tpch_dir):
    """A filtered temp view (read through Spark) works when ``python3`` on the PATH lacks distfusion.

    PySpark starts Python workers with ``python3`` from the PATH unless told
    otherwise; the venv running the driver is not on it here.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env["PATH"] = os.pathsep.join([str(Path(bare_python).parent), "/usr/bin", "/bin"])
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", CLASSIC_SESSION, str(tpch.table_path(tpch_dir, "region"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[{'n': 3}]"


def test_executors_without_distfusion_fail_with_one_short_error(spark, bare_python):
    """Executors whose Python cannot import distfusion: a short error naming a README section."""
    spark.table("region").filter("r_regionkey > 1").createOrReplaceTempView("big_regions")
    sc = spark.sparkContext
    chosen = sc.pythonExec
    sc.pythonExec = bare_python  # as PYSPARK_PYTHON=<bare python> would
    runtime = SparkRuntime(spark=spark)
    try:
        with pytest.raises(TransportError) as info:
            distfusion.spark.sql(
                spark, "SELECT count(*) AS n FROM big_regions", runtime=runtime
            ).to_pylist()
    finally:
        sc.pythonExec = chosen
        runtime.close()
        spark.catalog.dropTempView("big_regions")
    message = str(info.value)
    assert bare_python in message and "No module named" in message
    assert f'section "{EXECUTORS_SECTION}"' in message
    assert f"## {EXECUTORS_SECTION}\n" in (REPO / "docs" / "spark.md").read_text()
    printed = "".join(traceback.format_exception(info.value))
    # One exception, no chained causes, no Java stack: the Python frames of the
    # call chain and the message (157 lines of Java traces before the fix).
    assert "During handling" not in printed and "direct cause" not in printed, printed
    assert len(printed.splitlines()) < 40, printed
    assert "Py4JJavaError" not in printed and "at org.apache" not in printed


# Run in a process of its own: importing distfusion_spark_daemon patches pyspark.daemon.
IDLE_WORKER = """
import os, socket
os.environ["PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE"] = "1"  # Spark's default
import pyspark.daemon
import distfusion_spark_daemon

def closed_by_the_executor():
    worker_end, executor_end = socket.socketpair(socket.AF_UNIX)
    executor_end.close()  # Spark closes an idle worker's socket
    return worker_end

try:  # PySpark's own daemon function: the traceback users saw
    distfusion_spark_daemon._pyspark_worker(closed_by_the_executor(), True)
except BrokenPipeError:
    print("pyspark: BrokenPipeError")
print("distfusion:", pyspark.daemon.worker(closed_by_the_executor(), True))
"""


def test_an_idle_workers_closed_unix_socket_ends_it_without_a_traceback():
    """Issue 25: PySpark daemon tracebacks between successful queries (idle workers' sockets)."""
    proc = subprocess.run(
        [sys.executable, "-c", IDLE_WORKER], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["pyspark: BrokenPipeError", "distfusion: 1"], proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_the_embedded_session_runs_the_quiet_daemon(spark):
    assert (
        spark.sparkContext.getConf().get("spark.python.daemon.module") == "distfusion_spark_daemon"
    )
