"""Writing Delta and Iceberg tables: distfusion on Spark against the tables' own libraries.

Issue 39's benchmark. Two jobs over TPC-H Parquet (``distfusion datagen tpch``):

- **write**: ``lineitem`` joined with ``orders`` (11 columns, ``ship_year`` added),
  written as a new table partitioned by ``ship_year``:
    distfusion  ``ctx.sql(JOIN).write_delta(path, partition_by="ship_year")`` and
                ``write_iceberg(table)`` (identity partition on ``ship_year``), on the
                Spark runtime (``local[N]``): the query and the write, one commit;
    library     ``deltalake.write_deltalake(path, data, partition_by=...)`` and
                pyiceberg's ``Table.append(data)`` of the same rows as one Arrow table,
                computed first by single-node DataFusion (its time reported apart:
                the libraries' time is the write alone).
- **merge**: 1% of ``orders`` changed (``o_totalprice`` + 1, every 100th order) and as
  many new orders, merged into a Delta table of ``orders``
  (``WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *``):
    distfusion  ``MERGE INTO`` through ``ctx.sql``;
    library     ``DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()``.

Each run of an engine writes its own fresh table (``--runs``, medians at the end);
reported per job and engine: seconds, files written, bytes written, the rows read back
through the table's own library, and the memory peaks while it ran
(:class:`MemorySampler`: the driver, the executors' Python workers, the JVM, the stage
outputs the workers hold). ``--baseline`` also runs each distfusion write through a
coalesce stage, the plan before writes from the producing stage's tasks.

Run (docs/benchmarks.md, "Writing Delta and Iceberg tables")::

    .venv/bin/python benchmarks/table_writes.py --data /tmp/tpch-sf10 --workers 2 \
        --json benchmarks/results/<date>-table-writes-sf10.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

JOIN = """
SELECT l_orderkey, l_partkey, l_suppkey, l_linenumber, l_quantity, l_extendedprice,
       l_discount, l_shipdate, o_orderdate, o_totalprice,
       CAST(date_part('year', l_shipdate) AS INT) AS ship_year
FROM lineitem JOIN orders ON l_orderkey = o_orderkey
"""

CHANGES = """
SELECT o_orderkey, o_custkey, o_orderstatus, o_totalprice + 1 AS o_totalprice, o_orderdate,
       o_orderpriority, o_clerk, o_shippriority, o_comment
FROM orders WHERE o_orderkey % 100 = 1
UNION ALL
SELECT o_orderkey + 1000000000, o_custkey, o_orderstatus, o_totalprice, o_orderdate,
       o_orderpriority, o_clerk, o_shippriority, o_comment
FROM orders WHERE o_orderkey % 100 = 2
"""

WARMUP = "SELECT * FROM nation"

MERGE = """
MERGE INTO target AS t USING changes AS s ON t.o_orderkey = s.o_orderkey
WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *
"""


def _files(root: Path) -> tuple[int, int]:
    """Data files (``.parquet``) under ``root`` and their bytes."""
    files = [p for p in root.rglob("*.parquet") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


_SAMPLER: MemorySampler | None = None
"""Samples memory while a job runs (set by :func:`run`)."""


def _timed(fn):
    """``(seconds, fn())``; the memory peaks are measured from here."""
    if _SAMPLER is not None:
        _SAMPLER.start()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


class MemorySampler:
    """Peak RSS of this process's descendants and the outputs the executors' workers hold.

    A thread reads ``/proc`` every ``interval_s`` seconds: the resident set
    (``VmRSS``) of every process below this one, split into the JVM and the
    Python workers (PySpark's daemon and its forks: the executors' Python
    workers, which host distfusion's Flight workers and their stage outputs),
    and, with ``runtime``, ``bytes_held`` of every executor worker
    (``SparkRuntime.stats()``: stage outputs kept, in memory and on disk).
    :meth:`start` resets the peaks of a job; :meth:`peaks` reads them, in bytes.
    ``timeline`` keeps ``(seconds, python RSS, held)`` of every sample of the job.
    """

    def __init__(self, runtime=None, interval_s: float = 0.25) -> None:
        self.runtime = runtime
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.start()
        threading.Thread(target=self._run, name="memory-sampler", daemon=True).start()

    def start(self) -> None:
        """Reset the peaks (a new job starts)."""
        with self._lock:
            self._t0 = time.perf_counter()
            names = ("driver_rss", "python_rss", "python_max_rss", "jvm_rss", "held")
            self._peak = dict.fromkeys(names, 0)
            self.timeline: list[tuple[float, int, int]] = []

    def peaks(self) -> dict[str, int]:
        """Peaks since :meth:`start`, bytes.

        This process's RSS, the Python workers' RSS summed and the largest one,
        the JVM's, the outputs held by the executors' workers summed.
        """
        with self._lock:
            return dict(self._peak)

    def close(self) -> None:
        """Stop sampling."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            python, largest, jvm = _descendants_rss(os.getpid())
            driver = _rss(os.getpid())
            held = 0
            if self.runtime is not None:
                try:
                    stats = self.runtime.stats()
                    master = self.runtime.sc.master
                    held = sum(s.get("bytes_held", 0) for u, s in stats.items() if u != master)
                except Exception:  # stopping, or a worker exiting: skip the sample
                    held = 0
            with self._lock:
                p = self._peak
                p["driver_rss"] = max(p["driver_rss"], driver)
                p["python_rss"] = max(p["python_rss"], python)
                p["python_max_rss"] = max(p["python_max_rss"], largest)
                p["jvm_rss"] = max(p["jvm_rss"], jvm)
                p["held"] = max(p["held"], held)
                self.timeline.append((time.perf_counter() - self._t0, python, held))


def _rss(pid: int) -> int:
    """``VmRSS`` of process ``pid``, bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants_rss(root: int) -> tuple[int, int, int]:
    """``(Python RSS summed, largest Python RSS, JVM RSS)`` of ``root``'s descendants, bytes."""
    parent: dict[int, int] = {}
    info: dict[int, tuple[str, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields.get("PPid", "0").strip())
        rss = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        info[pid] = (fields.get("Name", "").strip(), rss)
    python = largest = jvm = 0
    for pid, (name, rss) in info.items():
        p = parent.get(pid, 0)
        while p and p != root:
            p = parent.get(p, 0)
        if p != root:
            continue
        if name == "java":
            jvm += rss
        elif name.startswith("python"):
            python += rss
            largest = max(largest, rss)
    return python, largest, jvm


def _iceberg_catalog(root: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    root.mkdir(parents=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")
    catalog.create_namespace("db")
    return catalog


def _iceberg_table(catalog, name: str, schema):
    """A new Iceberg table ``db.<name>`` of Arrow ``schema``, partitioned by ``ship_year``."""
    table = catalog.create_table(f"db.{name}", schema=schema)
    with table.update_spec() as update:
        update.add_identity("ship_year")
    return catalog.load_table(f"db.{name}")


def run(args: argparse.Namespace) -> dict:
    """Both jobs; every measure as a dict (also printed)."""
    from datafusion import SessionContext
    from deltalake import DeltaTable, write_deltalake

    from distfusion import DistributedConfig, DistributedContext, tpch
    from distfusion.runtime.spark import SparkRuntime

    global _SAMPLER
    jobs = set(args.jobs.split(","))
    out: dict = {"data": args.data, "workers": args.workers, "rows": []}
    tmp = Path(tempfile.mkdtemp(prefix="distfusion-bench-writes-", dir=args.tmp))
    runtime = SparkRuntime(master=f"local[{args.workers}]")
    config = DistributedConfig(memory_per_task_bytes=args.memory_per_task)
    ctx = DistributedContext(runtime=runtime, config=config)
    _SAMPLER = MemorySampler(runtime)
    try:
        tpch.register_tpch(ctx, args.data)
        single = SessionContext()
        tpch.register_tpch(single, args.data)

        def record(job, engine, seconds, root: Path, rows: int, before=(0, 0)) -> None:
            """One measure: the files and bytes under ``root`` past ``before``."""
            files, size = (now - then for now, then in zip(_files(root), before, strict=True))
            row = {"job": job, "engine": engine, "seconds": round(seconds, 2)}
            row |= {"files": files, "bytes": size, "rows_read_back": rows}
            peaks = _SAMPLER.peaks()
            row |= {f"peak_{k}": v for k, v in peaks.items()}
            out["rows"].append(row)
            gib = {k: v / 2**30 for k, v in peaks.items()}
            print(
                f"{job:6} {engine:28} {seconds:8.2f} s  {files:5} files  "
                f"{size / 2**20:9.1f} MiB  {rows:,} rows  peak GiB: driver "
                f"{gib['driver_rss']:.2f}, Python workers {gib['python_rss']:.2f} "
                f"(largest {gib['python_max_rss']:.2f}), JVM {gib['jvm_rss']:.2f}, "
                f"outputs held {gib['held']:.2f}",
                flush=True,
            )
            if args.timeline:
                for t, python, held in _SAMPLER.timeline[:: max(1, len(_SAMPLER.timeline) // 60)]:
                    print(
                        f"    {t:7.2f} s  workers {python / 2**30:6.2f} GiB  held "
                        f"{held / 2**30:6.2f} GiB"
                    )

        # A first query starts the executors' Python workers and their Flight workers;
        # a tiny write warms the write path (its cost reported apart, not in the rows).
        seconds, _ = _timed(lambda: ctx.sql(WARMUP).write_delta(str(tmp / "warmup")))
        out["warmup_s"] = round(seconds, 2)
        print(f"warm-up (start the executors' workers, a 25-row write): {seconds:.2f} s")

        # ---- write: the join as a new partitioned table. distfusion first, while
        # this process holds nothing; then the libraries, from one Arrow table.
        catalog = _iceberg_catalog(tmp / "iceberg")
        variants = [("", True)] + ([(" (coalesce stage)", False)] if args.baseline else [])
        for run_ in range(args.runs):
            for suffix, fused in variants:
                _fuse_writes(fused)
                if "write_delta" in jobs:
                    root = tmp / f"delta-distfusion-{run_}"
                    seconds, _ = _timed(
                        lambda root=root: ctx.sql(JOIN).write_delta(
                            str(root), partition_by="ship_year"
                        )
                    )
                    engine = f"distfusion write_delta{suffix}"
                    record("write", engine, seconds, root, _delta_rows(root))
                    shutil.rmtree(root, ignore_errors=True)
                if "write_iceberg" in jobs:
                    name = f"ours{run_}{'' if fused else 'c'}"
                    table = _iceberg_table(catalog, name, _plain(ctx.sql(JOIN).schema()))
                    seconds, _ = _timed(lambda table=table: ctx.sql(JOIN).write_iceberg(table))
                    rows = catalog.load_table(f"db.{name}").scan().count()
                    where = tmp / "iceberg" / "db" / name
                    record("write", f"distfusion write_iceberg{suffix}", seconds, where, rows)
                    shutil.rmtree(where, ignore_errors=True)
        _fuse_writes(True)
        if "libraries" in jobs:
            seconds, data = _timed(lambda: _arrow(single.sql(JOIN)))
            out["single_node_query_s"] = round(seconds, 2)
            print(f"single-node DataFusion computes the {data.num_rows:,} rows: {seconds:.2f} s")
            for run_ in range(args.runs):
                root = tmp / f"delta-deltalake-{run_}"
                seconds, _ = _timed(
                    lambda root=root: write_deltalake(str(root), data, partition_by=["ship_year"])
                )
                record("write", "deltalake.write_deltalake", seconds, root, _delta_rows(root))
                shutil.rmtree(root, ignore_errors=True)
                table = _iceberg_table(catalog, f"theirs{run_}", data.schema)
                seconds, _ = _timed(lambda table=table: table.append(data))
                rows = catalog.load_table(f"db.theirs{run_}").scan().count()
                where = tmp / "iceberg" / "db" / f"theirs{run_}"
                record("write", "pyiceberg Table.append", seconds, where, rows)
                shutil.rmtree(where, ignore_errors=True)
            data = None  # free it before the merge job

        # ---- merge: 1% changed and 1% new orders into a Delta table of orders
        if "merge" in jobs:
            orders = _arrow(single.sql("SELECT * FROM orders"))
            changes = _arrow(single.sql(CHANGES)).cast(orders.schema)
            out["merge_source_rows"] = changes.num_rows
            ctx.register_record_batches("changes", [changes.to_batches()])
            for run_ in range(args.runs):
                for engine in ("distfusion MERGE INTO", "deltalake DeltaTable.merge"):
                    root = tmp / f"merge-{engine.split()[0]}-{run_}"
                    write_deltalake(str(root), orders)
                    before = _files(root)
                    if engine.startswith("distfusion"):
                        if run_:
                            ctx.deregister_table("target")
                        ctx.register_delta("target", str(root))
                        seconds, _ = _timed(lambda: ctx.sql(MERGE).collect())
                    else:
                        merge = DeltaTable(str(root)).merge(
                            changes,
                            "t.o_orderkey = s.o_orderkey",
                            source_alias="s",
                            target_alias="t",
                        )
                        seconds, _ = _timed(
                            lambda m=merge: (
                                m.when_matched_update_all().when_not_matched_insert_all().execute()
                            )
                        )
                    record("merge", engine, seconds, root, _delta_rows(root), before)
                    shutil.rmtree(root, ignore_errors=True)
        _summary(out)
    finally:
        _SAMPLER.close()
        ctx.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _summary(out: dict) -> None:
    """Medians by job and engine: seconds and the peaks, into ``out["medians"]`` (printed)."""
    import statistics

    groups: dict[tuple[str, str], list[dict]] = {}
    for row in out["rows"]:
        groups.setdefault((row["job"], row["engine"]), []).append(row)
    out["medians"] = []
    print("medians:")
    for (job, engine), rows in groups.items():
        med = {"job": job, "engine": engine, "runs": len(rows)}
        for k in rows[0]:
            if k.startswith("peak_") or k in ("seconds", "files", "bytes"):
                med[k] = statistics.median(r[k] for r in rows)
        out["medians"].append(med)
        print(
            f"  {job:6} {engine:42} {med['seconds']:8.2f} s  {med['files']:5} files  "
            f"{med['bytes'] / 2**20:9.1f} MiB  Python workers {med['peak_python_rss'] / 2**30:.2f}"
            f" GiB, driver {med['peak_driver_rss'] / 2**30:.2f} GiB, held "
            f"{med['peak_held'] / 2**30:.2f} GiB  ({len(rows)} runs)"
        )


def _fuse_writes(on: bool) -> None:
    """Writes from the producing stage's tasks (on, the default), or through a coalesce stage.

    Off: the plan before :mod:`distfusion.planner.write_from_producer` (the
    join stage's output coalesced into writing parts), for ``--baseline``.
    """
    from distfusion.coordinator import execution
    from distfusion.planner.write_from_producer import write_from_producer

    execution.write_from_producer = write_from_producer if on else (lambda graph, ran: None)


def _arrow(df):
    """A single-node DataFusion result as one Arrow table, strings plain (not views)."""
    import pyarrow as pa

    from distfusion.worker.execute_task import without_views

    return pa.Table.from_batches([without_views(b) for b in df.collect()], None)


def _plain(schema):
    """``schema`` with string and binary views as plain strings and binaries (as :func:`_arrow`)."""
    import pyarrow as pa

    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return pa.schema([f.with_type(views.get(f.type, f.type)) for f in schema])


def _delta_rows(root: Path) -> int:
    """Rows of the Delta table at ``root``, read by deltalake."""
    from deltalake import DeltaTable

    return DeltaTable(str(root)).to_pyarrow_dataset().count_rows()


def main() -> None:
    """Parse the arguments, run both jobs, write ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="TPC-H Parquet directory")
    p.add_argument("--workers", type=int, default=2, help="Spark local[N] (default 2)")
    p.add_argument(
        "--memory-per-task",
        type=int,
        default=None,
        help="DistributedConfig.memory_per_task_bytes, bytes (default: the runtime's)",
    )
    p.add_argument("--runs", type=int, default=1, help="runs of each job (default 1)")
    p.add_argument(
        "--jobs",
        default="write_delta,write_iceberg,libraries,merge",
        help="comma-separated: write_delta, write_iceberg, libraries, merge (default: all)",
    )
    p.add_argument("--timeline", action="store_true", help="print the memory samples of each job")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also run each distfusion write through a coalesce stage (the plan before), "
        "alternating with the default",
    )
    p.add_argument("--tmp", default=None, help="where the tables are written (then removed)")
    p.add_argument("--json", default=None, help="write the measures here")
    args = p.parse_args()
    # a SIGTERM (a memory guard, a CI timeout) ends through run()'s cleanup of the tables
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    out = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
