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

Each engine writes its own fresh table; reported per job and engine: seconds (one run
each: a write cannot be repeated on the same table), files written, bytes written, and
the rows read back through the table's own library (checked equal across engines).

Run (docs/benchmarks.md, "Writing Delta and Iceberg tables")::

    .venv/bin/python benchmarks/table_writes.py --data /tmp/tpch-sf10 --workers 2 \
        --json benchmarks/results/<date>-table-writes-sf10.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
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


def _timed(fn):
    """``(seconds, fn())``."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


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

    out: dict = {"data": args.data, "workers": args.workers, "rows": []}
    tmp = Path(tempfile.mkdtemp(prefix="distfusion-bench-writes-", dir=args.tmp))
    runtime = SparkRuntime(master=f"local[{args.workers}]")
    config = DistributedConfig(memory_per_task_bytes=args.memory_per_task)
    ctx = DistributedContext(runtime=runtime, config=config)
    try:
        tpch.register_tpch(ctx, args.data)
        single = SessionContext()
        tpch.register_tpch(single, args.data)

        def record(job, engine, seconds, root: Path, rows: int, before=(0, 0)) -> None:
            """One measure: the files and bytes under ``root`` past ``before``."""
            files, size = (now - then for now, then in zip(_files(root), before, strict=True))
            row = {"job": job, "engine": engine, "seconds": round(seconds, 2)}
            row |= {"files": files, "bytes": size, "rows_read_back": rows}
            out["rows"].append(row)
            print(
                f"{job:6} {engine:28} {seconds:8.2f} s  {files:5} files  "
                f"{size / 2**20:9.1f} MiB  {rows:,} rows",
                flush=True,
            )

        # A first query starts the executors' Python workers and their Flight workers;
        # a tiny write warms the write path (its cost reported apart, not in the rows).
        seconds, _ = _timed(lambda: ctx.sql(WARMUP).write_delta(str(tmp / "warmup")))
        out["warmup_s"] = round(seconds, 2)
        print(f"warm-up (start the executors' workers, a 25-row write): {seconds:.2f} s")

        # ---- write: the join as a new partitioned table. distfusion first, while
        # this process holds nothing; then the libraries, from one Arrow table.
        root = tmp / "delta-distfusion"
        seconds, _ = _timed(lambda: ctx.sql(JOIN).write_delta(str(root), partition_by="ship_year"))
        record("write", "distfusion write_delta", seconds, root, _delta_rows(root))
        catalog = _iceberg_catalog(tmp / "iceberg")
        schema = _plain(ctx.sql(JOIN).schema())
        table = _iceberg_table(catalog, "ours", schema)
        seconds, _ = _timed(lambda: ctx.sql(JOIN).write_iceberg(table))
        rows = catalog.load_table("db.ours").scan().count()
        record("write", "distfusion write_iceberg", seconds, tmp / "iceberg" / "db" / "ours", rows)

        seconds, data = _timed(lambda: _arrow(single.sql(JOIN)))
        out["single_node_query_s"] = round(seconds, 2)
        print(f"single-node DataFusion computes the {data.num_rows:,} rows: {seconds:.2f} s")
        root = tmp / "delta-deltalake"
        seconds, _ = _timed(lambda: write_deltalake(str(root), data, partition_by=["ship_year"]))
        record("write", "deltalake.write_deltalake", seconds, root, _delta_rows(root))
        table = _iceberg_table(catalog, "theirs", data.schema)
        seconds, _ = _timed(lambda: table.append(data))
        rows = catalog.load_table("db.theirs").scan().count()
        record("write", "pyiceberg Table.append", seconds, tmp / "iceberg" / "db" / "theirs", rows)
        data = None  # free it before the merge job

        # ---- merge: 1% changed and 1% new orders into a Delta table of orders
        orders = _arrow(single.sql("SELECT * FROM orders"))
        changes = _arrow(single.sql(CHANGES)).cast(orders.schema)
        out["merge_source_rows"] = changes.num_rows
        for engine in ("distfusion MERGE INTO", "deltalake DeltaTable.merge"):
            root = tmp / f"merge-{engine.split()[0]}"
            write_deltalake(str(root), orders)
            before = _files(root)
            if engine.startswith("distfusion"):
                ctx.register_delta("target", str(root))
                ctx.register_record_batches("changes", [changes.to_batches()])
                seconds, _ = _timed(lambda: ctx.sql(MERGE).collect())
            else:
                merge = DeltaTable(str(root)).merge(
                    changes, "t.o_orderkey = s.o_orderkey", source_alias="s", target_alias="t"
                )
                seconds, _ = _timed(
                    lambda m=merge: (
                        m.when_matched_update_all().when_not_matched_insert_all().execute()
                    )
                )
            record("merge", engine, seconds, root, _delta_rows(root), before)
    finally:
        ctx.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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
