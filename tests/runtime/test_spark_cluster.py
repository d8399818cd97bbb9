"""TPC-H on a real Spark standalone cluster (a master and two workers on 127.0.0.1).

Slow (JVMs start, about a minute on two cores) but part of CI: it is the only
test where tasks run in executors that a cluster manager launched.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from distfusion import tpch
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.conftest import REPO
from tests.spark_cluster import start_cluster, stop_cluster

QUERIES = (1, 3, 13, 18)  # aggregation, broadcast joins, two shuffles, a semi-join subquery

pytestmark = pytest.mark.slow


def test_tpch_on_a_standalone_cluster(tmp_path, tpch_dir, oracle):
    cluster = start_cluster(tmp_path / "cluster", workers=2, cores=1)
    try:
        out = tmp_path / "results"
        out.mkdir()
        driver = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.spark_cluster",
                cluster.master_url,
                str(tpch_dir),
                str(out),
                *map(str, QUERIES),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert driver.returncode == 0, driver.stderr[-5000:] + "\n" + cluster.tail_logs()
        workers = json.loads((out / "workers.json").read_text())
        assert workers["master"] == cluster.master_url
        assert len(workers["executors"]) == 2  # one executor per worker
        assert len(workers["urls"]) == 2  # one task slot per executor core
        for q in QUERIES:
            sql = tpch.query(q)
            got = pa.ipc.open_file(str(out / f"q{q}.arrow")).read_all()
            assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
        # A DataFrame of the pipeline read through Spark: Spark's answer, its leaf
        # tasks run in the executors over its 4 partitions.
        got = pa.ipc.open_file(str(out / "spark_source.arrow")).read_all()
        expected = pa.ipc.open_file(str(out / "spark_source_expected.arrow")).read_all()
        assert_same_result(got, expected, ordered=True, decimal_ulps=1, check_types=False)
        source = json.loads((out / "spark_source.json").read_text())
        assert source["tasks"] == 4
        assert source["driver"] not in source["workers"]
        # Tasks ran in the executors both workers launched, not in the driver.
        for i in range(2):
            logs = list((tmp_path / "cluster" / f"work-{i}").glob("app-*/*/stderr"))
            assert any("Running task" in log.read_text(errors="replace") for log in logs), i
    finally:
        stop_cluster(cluster)
    assert all(p.poll() is not None for p in cluster.procs)
