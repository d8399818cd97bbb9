"""The ``distfusion`` command line.

```
distfusion query "SELECT ..." --table name=path ... [--tpch DIR] [--udf module:name]
                 [--runtime spark|local|flight] [--workers N] [--master spark://host:7077]
                 [--explain]
                 [--output out.parquet|out.csv|DIR/ [--output-format parquet|csv] [--overwrite]]
                 [--explain-analyze] [--verbose-plan] [--dot plan.dot] [-v | --log-level LEVEL]
                 [--in-place-bytes BYTES]
distfusion datagen tpch --scale 1 --out data/tpch-sf1
distfusion datagen tpcds --scale 1 --out data/tpcds-sf1
distfusion bench tpch --data data/tpch-sf1 --runtime local --workers 2
                 [--queries 1,3,5] [--runs 5]
                 [--peers datafusion,spark-sql,local,flight,static,no-metrics]
                 [--json out.json] [--baseline earlier.json]
distfusion worker --host 127.0.0.1 --port 50051 [--token T] [--tls-cert C --tls-key K]
distfusion query ... --runtime flight --workers-url grpc://127.0.0.1:50051,...
```

Exit status: 0 on success, 1 when the query fails (the error is printed), 2 on
bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from datafusion import AggregateUDF, ScalarUDF

from distfusion import tpcds, tpch, udfs
from distfusion.bench import run_tpch_bench
from distfusion.context import DistributedConfig, DistributedContext
from distfusion.coordinator.query_run import Runtime
from distfusion.display import print_table
from distfusion.errors import DistfusionError, PlanningError
from distfusion.io import object_store
from distfusion.runtime.registry import RUNTIMES, runtime_from_name, runtime_options
from distfusion.worker import flight_cli
from distfusion.worker.memory import parse_bytes

__all__ = ["main", "make_runtime"]


def make_runtime(args: argparse.Namespace) -> Runtime:
    """The runtime ``--runtime`` names, with ``--workers`` and that runtime's flags.

    Raises:
        ValueError: unknown runtime name, or bad flags (see
            :func:`~distfusion.runtime.registry.runtime_options`).
    """
    return runtime_from_name(args.runtime, args.workers, **runtime_options(args))


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime",
        default="spark",
        choices=list(RUNTIMES),
        help="what runs the tasks (default: %(default)s)",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="number of workers (default: one per core)"
    )
    s = p.add_argument_group("spark runtime")
    s.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: embedded local[WORKERS], or local[*])",
    )
    s.add_argument(
        "--data-plane",
        default=None,
        choices=["flight", "shuffle"],
        help="how stage outputs move between Spark tasks: the executors' Flight servers "
        "or Spark's shuffle (default: flight; docs/spark-data-path.md)",
    )
    f = p.add_argument_group("flight runtime")
    f.add_argument(
        "--workers-url",
        default=None,
        help="comma-separated worker URLs (grpc://host:port,...); "
        "default: start --workers local worker processes (3)",
    )
    f.add_argument(
        "--token", default=None, help="workers' shared secret (default: $DISTFUSION_TOKEN)"
    )
    f.add_argument("--tls-root-certs", default=None, help="PEM file verifying grpc+tls:// workers")
    p.add_argument(
        "--memory-per-task",
        type=_size_type(),
        default=None,
        metavar="SIZE",
        help="DataFusion memory pool of every task, e.g. 256MiB or 2g; past it sorts, "
        "aggregates and joins spill to disk (default: the runtime's, from the machine's "
        "or Spark's executor memory)",
    )


def _size_type():
    """``--memory-per-task``'s type: bytes from ``256MiB``/``4g``; argparse reports errors."""

    def size(text: str) -> int:
        return parse_bytes(text)

    return size


def _register_function(ctx, u) -> None:
    """Register UDF ``u`` of ``--udf`` on ``ctx`` by its kind."""
    if isinstance(u, ScalarUDF):
        ctx.register_udf(u)
    elif isinstance(u, AggregateUDF):
        ctx.register_udaf(u)
    else:
        ctx.register_udwf(u)


def _register_tables(ctx, args) -> None:
    if args.tpch:
        tpch.register_tpch(ctx, args.tpch)
    for spec in args.table or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            msg = f"--table expects name=path, got {spec!r}"
            raise DistfusionError(msg)
        if path.endswith(".csv") or (
            os.path.isdir(path) and any(f.endswith(".csv") for f in os.listdir(path))
        ):
            ctx.register_csv(name, path)
        elif object_store.is_url(path) and not path.endswith(".parquet"):
            try:  # an object store "directory": Parquet files, else CSV files
                ctx.register_parquet(name, path)
            except PlanningError as exc:
                if "no .parquet files" not in str(exc):
                    raise
                ctx.register_csv(name, path)
        else:
            ctx.register_parquet(name, path)


def cmd_query(args) -> int:
    """Run one SQL text (several statements allowed) and print or write the result."""
    sql = args.sql
    if args.file:
        with open(args.file) as f:
            sql = f.read()
    if not sql:
        print("error: give the SQL as an argument or with --file", file=sys.stderr)
        return 2
    config = DistributedConfig(
        tasks_per_stage=args.tasks_per_stage,
        memory_per_task_bytes=args.memory_per_task,
        in_place_bytes=args.in_place_bytes,
    )
    try:
        loaded = [u for reference in args.udf for u in udfs.load(reference)]
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"error: --udf {exc}", file=sys.stderr)
        return 2
    with DistributedContext(runtime=lambda: make_runtime(args), config=config) as ctx:
        for u in loaded:
            _register_function(ctx, u)
        _register_tables(ctx, args)
        df = ctx.sql(sql)
        if args.explain:
            print(df.explain(verbose=args.verbose_plan))
            print()
        start = time.perf_counter()
        if args.output and _is_directory(args.output):
            mode = "overwrite" if args.overwrite else "error"
            if args.output_format == "csv":
                files = df.write_csv(args.output, mode=mode)
            else:
                files = df.write_parquet(args.output, mode=mode)
            elapsed = time.perf_counter() - start
            rows = sum(f.rows for f in files) if all(f.rows >= 0 for f in files) else None
            what = f"{rows} rows in " if rows is not None else ""
            print(f"wrote {what}{len(files)} {args.output_format} files to {args.output}")
            print(f"elapsed: {elapsed:.3f} s ({args.runtime} runtime)")
            return 0
        # A live status line on every runtime (Spark's own progress bar is off).
        table = df.to_arrow_table(progress=sys.stderr.isatty())
        elapsed = time.perf_counter() - start
        if args.output:
            _write(table, args.output)
            print(f"wrote {table.num_rows} rows to {args.output}")
        else:
            print_table(table, limit=args.limit)
        if args.explain_analyze:
            print()
            print(df.explain_run(verbose=args.verbose_plan))
        if args.dot:
            with open(args.dot, "w") as f:
                f.write(df.explain(format="dot"))
            print(f"wrote the plan graph to {args.dot} (render: dot -Tsvg {args.dot} -o plan.svg)")
        metrics = df.metrics()
        where = f"{args.runtime} runtime, {ctx.runtime.num_workers()} workers"
        if metrics is not None and df.runs_in_place() is not None:
            where += "; ran in place, as single-node DataFusion here (--in-place-bytes)"
        print(f"elapsed: {elapsed:.3f} s ({where})")
    return 0


def _is_directory(path: str) -> bool:
    """``--output`` names a directory: it ends in a separator or is one.

    An object store URL is a directory unless it names a ``.parquet`` or ``.csv`` file.
    """
    if object_store.is_url(path):
        return not path.endswith((".parquet", ".csv"))
    return path.endswith(("/", os.sep)) or os.path.isdir(path)


def _write(table, path: str) -> None:
    # Writers of pyarrow 26 lack string_view support; views become plain strings.
    table = table.cast(
        pa.schema(
            [
                f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                for f in table.schema
            ]
        )
    )
    if not path.endswith((".parquet", ".csv")):
        msg = f"--output must end in .parquet or .csv, got {path!r}"
        raise DistfusionError(msg)
    buffer = pa.BufferOutputStream() if object_store.is_url(path) else None
    sink = path if buffer is None else buffer
    if path.endswith(".parquet"):
        pq.write_table(table, sink)
    else:
        pcsv.write_csv(table, sink)
    if buffer is not None:  # an object store URL: one object, written whole
        object_store.put_bytes(path, buffer.getvalue().to_pybytes())


def cmd_datagen(args) -> int:
    """Generate TPC-H Parquet with tpchgen-cli, or TPC-DS Parquet with tpcgen-cli."""
    start = time.perf_counter()
    benchmark = {"tpch": (tpch, "TPC-H"), "tpcds": (tpcds, "TPC-DS")}
    module, title = benchmark[args.benchmark]
    module.generate(args.scale, args.out, args.parts)
    print(
        f"{title} scale factor {args.scale:g} written to {args.out} "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


def cmd_bench(args) -> int:
    """Benchmark the 22 TPC-H queries against single-node DataFusion (and peers)."""
    run_tpch_bench(args, _parse_queries(args.queries))
    return 0


def _parse_queries(spec: str) -> list[int]:
    """``--queries 1,3,5`` as query numbers, in the order given; empty: all 22.

    Raises:
        ValueError: a part is not a number of a TPC-H query (1..22).
    """
    if not spec:
        return list(tpch.QUERIES)
    queries = []
    for part in spec.split(","):
        part = part.strip().upper().removeprefix("Q")
        if not part.isdigit() or int(part) not in tpch.QUERIES:
            msg = f"--queries expects TPC-H query numbers 1..22 separated by commas, got {spec!r}"
            raise ValueError(msg)
        queries.append(int(part))
    return queries


def cmd_worker(args) -> int:
    """Serve as an Arrow Flight worker until SIGINT/SIGTERM."""
    return flight_cli.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="distfusion", description="Distributed SQL on Apache DataFusion"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log distfusion's records to stderr (-v: INFO, -vv: DEBUG)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log distfusion's records of this level and above to stderr",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    q = sub.add_parser("query", help="run SQL distributed and print or write the result")
    q.add_argument("sql", nargs="?", default="", help="SQL text; statements separated by ';'")
    q.add_argument("--file", "-f", help="read the SQL from this file")
    q.add_argument(
        "--table",
        "-t",
        action="append",
        metavar="NAME=PATH",
        help="register a Parquet/CSV file, directory or glob, local or an object store URL "
        "(s3://bucket/prefix/, gs://, az://, https://; the store comes from the environment: "
        "AWS_REGION, AWS_ENDPOINT_URL and each worker's own credentials)",
    )
    q.add_argument(
        "--tpch", metavar="DIR", help="register the eight TPC-H tables under DIR (or a URL)"
    )
    q.add_argument(
        "--udf",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="Python UDFs the SQL calls (a datafusion ScalarUDF, AggregateUDF or WindowUDF, "
        "or a list of them, made with distfusion.udf/udaf/udwf to run on Spark); "
        "Flight workers started here load them too; repeatable",
    )
    q.add_argument("--explain", action="store_true", help="print the distributed plan first")
    q.add_argument(
        "--explain-analyze",
        action="store_true",
        help="after the result, print the plan annotated with what the run did "
        "(rows, bytes, task seconds and skew per stage; bytes moved per boundary)",
    )
    q.add_argument(
        "--verbose-plan",
        action="store_true",
        help="with --explain/--explain-analyze: each stage's physical plan (and tasks) too",
    )
    q.add_argument(
        "--dot", metavar="PATH", help="write the plan (with the run's metrics) as Graphviz DOT"
    )
    q.add_argument(
        "--output",
        "-o",
        help="write the result to a .parquet or .csv file, or, for a path ending in '/', "
        "an existing directory or an object store URL (s3://bucket/prefix), as one file per "
        "task written in parallel by the tasks (DistributedDataFrame.write_parquet / write_csv)",
    )
    q.add_argument(
        "--output-format",
        choices=["parquet", "csv"],
        default="parquet",
        help="the files' format for a directory --output (default: %(default)s)",
    )
    q.add_argument(
        "--overwrite",
        action="store_true",
        help="a directory --output that has files is emptied first (else it is an error)",
    )
    q.add_argument("--limit", type=int, default=50, help="rows to print (default: %(default)s)")
    q.add_argument(
        "--in-place-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="run in place (single-node DataFusion here, unplanned) when the scans read at most "
        "this many bytes; default: the runtime's (320 MiB a core when the workers share this "
        "machine's cores); 0: always plan and distribute",
    )
    q.add_argument("--tasks-per-stage", type=int, default=None, help=argparse.SUPPRESS)
    _add_runtime_args(q)
    q.set_defaults(func=cmd_query)

    d = sub.add_parser("datagen", help="generate benchmark data")
    d.add_argument("benchmark", choices=["tpch", "tpcds"])
    d.add_argument("--scale", type=float, default=1.0, help="scale factor (default: %(default)s)")
    d.add_argument("--out", required=True, help="output directory")
    d.add_argument(
        "--parts",
        type=int,
        default=None,
        help="files per table (default: 8 per scale unit, at least 4)",
    )
    d.set_defaults(func=cmd_datagen)

    w = sub.add_parser("worker", help="run an Arrow Flight worker (the flight runtime's workers)")
    flight_cli.add_arguments(w)
    w.set_defaults(func=cmd_worker)

    b = sub.add_parser("bench", help="benchmark against single-node DataFusion and other peers")
    b.add_argument("benchmark", choices=["tpch"])
    b.add_argument(
        "--data", required=True, help="TPC-H Parquet directory (see datagen), or an s3:// URL"
    )
    b.add_argument(
        "--runs", type=int, default=5, help="timed runs per query and engine (default: %(default)s)"
    )
    b.add_argument(
        "--queries", default="", help="comma-separated query numbers, e.g. 1,3,5 (default: all 22)"
    )
    b.add_argument(
        "--no-warmup",
        action="store_true",
        help="time each engine's first run of a query (it counts as the first of --runs) "
        "instead of warming up with it: for runs at scale",
    )
    b.add_argument(
        "--peers",
        default=None,
        help="comma-separated engines measured next to distfusion: datafusion (single-node), "
        "spark-sql (Spark runtime only), local (distfusion's local runtime, same --workers), "
        "flight (the Flight runtime, 3 local worker processes), "
        "static (same runtime, adaptive execution off), "
        "no-metrics (same runtime, operator metrics off), "
        "spark-connect (a Spark Connect session on the same Spark application; "
        "Spark runtime only); "
        "default: datafusion, plus spark-sql on the Spark runtime",
    )
    b.add_argument(
        "--local-s3",
        action="store_true",
        help="upload --data to a local S3 server (moto, 127.0.0.1: the tests' tests/s3_server.py, "
        "so distfusion installed from a checkout with the test extra) and read it from there "
        "with every engine; counts each engine's requests per query",
    )
    b.add_argument(
        "--json", metavar="PATH", default=None, help="write every timed run and median as JSON"
    )
    b.add_argument(
        "--baseline",
        metavar="PATH",
        default=None,
        help="a --json file of an earlier run: flag queries now more than 5%% slower",
    )
    _add_runtime_args(b)
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``distfusion`` command."""
    args = build_parser().parse_args(argv)
    level = args.log_level or ("DEBUG" if args.verbose >= 2 else "INFO" if args.verbose else None)
    if level:
        logging.basicConfig(
            level=level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    try:
        return args.func(args)
    except (DistfusionError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
