"""A real Spark standalone cluster on 127.0.0.1, and a driver program that uses it.

The master and the workers are the installed pyspark's own JVM classes started
with ``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``), each in its own process group so that stopping the
cluster also stops the executors the workers launched.

``python -m tests.spark_cluster MASTER_URL DATA_DIR OUT_DIR Q [Q ...]`` is the
driver: it runs TPC-H queries with ``SparkRuntime(master=MASTER_URL)`` and
writes each result to ``OUT_DIR/q<N>.arrow`` and the workers it saw to
``OUT_DIR/workers.json``. It runs in its own process because a Python process
holds one SparkContext, and the test session's is the embedded ``local[2]``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)
SPARK_CLASS = os.path.join(SPARK_HOME, "bin", "spark-class")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running standalone cluster: its master URL, processes and log files."""

    master_url: str
    workdir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def tail_logs(self, lines: int = 30) -> str:
        """The last ``lines`` of every log, for failure messages."""
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            out.append(f"--- {log.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


def _env(workdir: Path) -> dict[str, str]:
    return dict(
        os.environ,
        SPARK_HOME=SPARK_HOME,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(workdir / "logs"),
        SPARK_NO_DAEMONIZE="1",
        PYSPARK_PYTHON=sys.executable,
    )


def _spawn(cluster: Cluster, name: str, args: list[str]) -> None:
    log = cluster.workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [SPARK_CLASS, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(cluster.workdir),
            cwd=cluster.workdir,
            start_new_session=True,  # own process group: executors die with their worker
        )
    cluster.procs.append(proc)
    cluster.logs.append(log)


def _wait(cluster: Cluster, what: str, ready, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        for p in cluster.procs:
            if p.poll() is not None:
                msg = f"a Spark process exited ({p.args[1]}) while waiting for {what}\n{cluster.tail_logs()}"
                raise RuntimeError(msg)
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout_s} s waiting for {what}\n{cluster.tail_logs()}"
            raise RuntimeError(msg)
        time.sleep(0.25)


def start_cluster(
    workdir: Path, workers: int = 2, cores: int = 1, memory: str = "2g", timeout_s: float = 120.0
) -> Cluster:
    """Start a master and ``workers`` workers of ``cores`` cores on 127.0.0.1.

    Returns once every worker registered with the master.

    Raises:
        RuntimeError: a process exited or the cluster was not up after
            ``timeout_s`` seconds (the processes started are stopped first).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", workdir)
    try:
        _spawn(
            cluster,
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
        )
        master_log = cluster.logs[0]

        def registered() -> int:
            text = master_log.read_text(errors="replace") if master_log.exists() else ""
            return text.count("Registering worker")

        _wait(
            cluster,
            "the master",
            lambda: "I have been elected leader" in master_log.read_text(errors="replace"),
            timeout_s,
        )
        for i in range(workers):
            _spawn(
                cluster,
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(workdir / f"work-{i}"),
                ],
            )
        _wait(cluster, f"{workers} workers to register", lambda: registered() >= workers, timeout_s)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: Cluster, timeout_s: float = 20.0) -> None:
    """Stop every process of ``cluster`` (SIGTERM to each group, then SIGKILL)."""
    for p in reversed(cluster.procs):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for p in cluster.procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # executors left in the group, if any
        except ProcessLookupError:
            pass
        if p.poll() is None:
            p.wait(5)


def main(argv: list[str]) -> int:
    """The driver program (see the module docstring)."""
    import pyarrow as pa

    from distfusion import DistributedConfig, DistributedContext, tpch
    from distfusion.runtime.spark import SparkRuntime

    master, data, out, *queries = argv
    out_dir = Path(out)
    runtime = SparkRuntime(
        master=master,
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "1g",
        },
    )
    try:
        runtime.resolver.wait_for_executors(2, 120)
        info = {
            "master": runtime.sc.master,
            "urls": runtime.resolver.get_urls(),
            "executors": runtime.resolver.executors(),
        }
        (out_dir / "workers.json").write_text(json.dumps(info))
        ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
        tpch.register_tpch(ctx, data)
        for q in queries:
            table = ctx.sql(tpch.query(int(q))).to_arrow_table()
            with (
                pa.OSFile(str(out_dir / f"q{q}.arrow"), "wb") as f,
                pa.ipc.new_file(f, table.schema) as w,
            ):
                w.write_table(table)
        _spark_source_query(runtime, data, out_dir)
    finally:
        runtime.close()
    return 0


SPARK_SOURCE_SQL = (
    "SELECT o_orderpriority, count(*) AS n, sum(o_totalprice) AS total "
    "FROM big_orders GROUP BY o_orderpriority ORDER BY o_orderpriority"
)


def _spark_source_query(runtime, data: str, out_dir: Path) -> None:
    """A DataFrame built with the DataFrame API read through Spark, and Spark's own answer.

    Writes ``spark_source.arrow`` (distfusion), ``spark_source_expected.arrow``
    (``spark.sql``) and ``spark_source.json``: the workers that ran the leaf
    stage's tasks and the driver's own worker.
    """
    import pyarrow as pa

    import distfusion.spark
    from distfusion import DistributedConfig, tpch

    spark = runtime.spark
    orders = (
        spark.read.parquet(tpch.table_path(data, "orders"))
        .where("o_totalprice > 100000")
        .repartition(4)
    )
    config = DistributedConfig(tasks_per_stage=4)  # a task per partition
    df = distfusion.spark.sql(
        spark, SPARK_SOURCE_SQL, runtime=runtime, config=config, tables={"big_orders": orders}
    )
    got = distfusion.spark.to_spark_compatible(df.to_arrow_table())
    orders.createOrReplaceTempView("big_orders")
    expected = distfusion.spark.to_spark_compatible(spark.sql(SPARK_SOURCE_SQL).toArrow())
    for name, table in (("spark_source", got), ("spark_source_expected", expected)):
        with (
            pa.OSFile(str(out_dir / f"{name}.arrow"), "wb") as f,
            pa.ipc.new_file(f, table.schema) as w,
        ):
            w.write_table(table)
    graph = df._ran_graph()
    leaf = [s for s in graph.stages if any(sc.source.is_spark for sc in s.scans)]
    tasks = [t for s in leaf for t in df.metrics().stage(s.stage_id).tasks]
    driver = runtime._driver_worker.url if runtime._driver_worker is not None else None
    info = {"workers": [t.worker for t in tasks], "driver": driver, "tasks": len(tasks)}
    (out_dir / "spark_source.json").write_text(json.dumps(info))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
