"""An embedded Spark session distfusion starts ends with its process (issue #25, item 6).

Ctrl-C during Spark's start-up left the JVM running (16 minutes later): PySpark's
``launch_gateway``, interrupted, deletes the directory the JVM writes its
connection file to; the JVM's main thread then fails, while py4j's server thread
keeps the JVM alive, and it never reads the standard input pipe that would have
ended it. The child here is interrupted as soon as it starts Spark's launch (an
event, not a delay), before the session is up; no process of that launch may
survive it. They are found by a marker in their environment: a JVM started after
its Python parent ended is no longer its descendant.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 30.0
"""Bound for Spark's processes to end after their Python parent did (seconds)."""

CHILD = (
    "print('go', flush=True)\n"
    "from distfusion.runtime.spark import SparkRuntime\n"
    "SparkRuntime()\n"
    "print('started', flush=True)\n"
    "import time; time.sleep(600)\n"
)


def _marked(marker: bytes) -> list[int]:
    """Live processes (not zombies) whose environment holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_spark_start_up_leaves_no_jvm():
    marker = f"distfusion-test-{uuid.uuid4()}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "DISTFUSION_TEST_MARK": marker,
    }
    mark = f"DISTFUSION_TEST_MARK={marker}".encode()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    left: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 120
        while not [p for p in _marked(mark) if p != proc.pid]:  # Spark's launch began
            assert proc.poll() is None, "the child ended before it launched Spark"
            assert time.monotonic() < deadline, "Spark was not launched within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < deadline:
            left = _marked(mark)
            if not left:
                break
            time.sleep(0.5)
        assert not left, f"Spark process(es) {left} still run {GONE_WITHIN_S} s after Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in _marked(mark):
            os.kill(p, signal.SIGKILL)
        proc.stdout.close()


SPILLING = (
    "import sys\n"
    "from distfusion import DistributedConfig, DistributedContext, tpch\n"
    "from distfusion.runtime.spark import SparkRuntime\n"
    "runtime = SparkRuntime(master='local[2]')\n"
    "ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))\n"
    "tpch.register_tpch(ctx, sys.argv[1])\n"
    "ctx.sql(tpch.query(3)).collect()\n"
    "runtime.close()\n"
)


@pytest.mark.slow
def test_closing_an_embedded_session_leaves_no_spill_directory(tmp_path, tpch_dir):
    # Spark ends its Python workers without their finalizers: their spill roots
    # stayed in the temp directory after the session stopped (issue #25, item 8).
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", SPILLING, str(tpch_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("distfusion-")]
