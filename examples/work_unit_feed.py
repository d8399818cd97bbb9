"""A feed-backed lineitem: its Parquet files are listed page by page while the query runs.

A tiny paginated catalog serves the TPC-H ``lineitem`` files over HTTP on
127.0.0.1, one page per request with a delay (a metadata service, an S3
``ListObjectsV2`` with continuation tokens). The table is registered with
``ListingFeed``: each query lists the catalog on the coordinator and streams
every file to a leaf task as soon as its page arrives, so reading starts
before the listing ends. Prints when each page was listed and when the tasks
read their first files, for an aggregate and for a join with ``orders``
(registered from its files as usual).

    python examples/work_unit_feed.py                       # default runtime (Spark)
    python examples/work_unit_feed.py --runtime local       # or flight, spark
    python examples/work_unit_feed.py --data data/tpch-sf1 --page-delay 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa

from distfusion import DistributedContext, ListingFeed, WorkUnit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# ---------------------------------------------------------------------- the catalog
def serve_catalog(paths: list[str], page_size: int, delay_s: float) -> ThreadingHTTPServer:
    """An HTTP catalog on 127.0.0.1: ``GET /list?token=N`` -> ``{"paths": [...], "next": M}``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            """One page of paths after the catalog's delay."""
            token = int(self.path.partition("token=")[2] or 0)
            time.sleep(delay_s)  # the catalog is slow: one page per round trip
            page = paths[token : token + page_size]
            nxt = token + page_size if token + page_size < len(paths) else None
            body = json.dumps({"paths": page, "next": nxt}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class PagedLister:
    """``lister()`` for ListingFeed: follows the catalog's continuation tokens, page by page."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.listed: list[tuple[float, int]] = []  # (time, files on the page)

    def __call__(self):
        """Yield each page's paths as the catalog returns it, noting when."""
        token = 0
        while token is not None:
            with urllib.request.urlopen(f"{self.url}/list?token={token}") as r:
                page = json.load(r)
            self.listed.append((time.time(), len(page["paths"])))
            yield page["paths"]
            token = page["next"]


class TimedListingFeed(ListingFeed):
    """ListingFeed that notes (in a file) when a task opens each listed file.

    Module-level, so Flight workers and Spark executors import it
    (``work_unit_feed:TimedListingFeed``) to read on their side.
    """

    def __init__(self, lister, log: str, **kwargs) -> None:
        super().__init__(lister, **kwargs)
        self.log = log

    def read(self, unit: WorkUnit) -> pa.RecordBatchReader:
        """The file of ``unit``, after noting the time and this process."""
        with open(self.log, "a") as f:
            f.write(f"{time.time()} {os.getpid()} {Path(unit.path).name}\n")
        return super().read(unit)

    def to_bytes(self) -> bytes:
        """ListingFeed's state and the log path."""
        return json.dumps({"base": json.loads(super().to_bytes()), "log": self.log}).encode()

    @classmethod
    def from_bytes(cls, data: bytes, schema: pa.Schema) -> TimedListingFeed:
        """Inverse of :meth:`to_bytes` (no lister on a worker)."""
        d = json.loads(data)
        base = d["base"]
        return cls(
            None,
            d["log"],
            format=base["format"],
            schema=schema,
            has_header=base["has_header"],
            delimiter=base["delimiter"],
        )


AGGREGATE = """
SELECT l_returnflag, l_linestatus, count(*) AS n, sum(l_quantity) AS qty,
       avg(l_extendedprice) AS avg_price
FROM lineitem GROUP BY 1, 2 ORDER BY 1, 2
"""
JOIN = """
SELECT o_orderpriority, count(*) AS late_lines
FROM lineitem JOIN orders ON l_orderkey = o_orderkey
WHERE l_commitdate < l_receiptdate AND l_shipmode IN ('MAIL', 'SHIP')
GROUP BY o_orderpriority ORDER BY o_orderpriority
"""


def main(argv: list[str] | None = None) -> None:
    """Serve the catalog, register the feed, run both queries, print the timings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", choices=["local", "flight", "spark"], default=None)
    p.add_argument("--data", default=os.environ.get("DISTFUSION_TEST_DATA", "data/tpch-sf0.1"))
    p.add_argument("--page-size", type=int, default=1, help="files per catalog page")
    p.add_argument("--page-delay", type=float, default=0.3, help="seconds per catalog page")
    p.add_argument("--tasks", type=int, default=2, help="leaf tasks reading the feed")
    args = p.parse_args(argv)

    data = Path(args.data)
    if not (data / "lineitem").is_dir():
        from distfusion import tpch

        print(f"generating TPC-H SF0.1 into {data} ...")
        tpch.generate(0.1, data, parts=4)
    paths = sorted(str(f.resolve()) for f in (data / "lineitem").glob("*.parquet"))
    catalog = serve_catalog(paths, args.page_size, args.page_delay)
    url = f"http://127.0.0.1:{catalog.server_address[1]}"
    print(f"catalog of {len(paths)} lineitem files at {url}, {args.page_delay} s per page")

    # Workers in other processes import TimedListingFeed from this directory.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    )
    import work_unit_feed as me  # this file as a module: its class path is importable

    runtime = None
    if args.runtime is not None:
        from distfusion.runtime.registry import runtime_from_name

        runtime = runtime_from_name(args.runtime, 3 if args.runtime != "spark" else None)
    log = os.path.join(tempfile.mkdtemp(prefix="distfusion-feed-"), "reads.log")
    lister = me.PagedLister(url)
    with DistributedContext(runtime=runtime) as ctx:
        ctx.register_feed_table(
            "lineitem", me.TimedListingFeed(lister, log, tasks=args.tasks, buffer_units=1)
        )
        ctx.register_parquet("orders", data / "orders")
        for title, sql in (("aggregate", AGGREGATE), ("join", JOIN)):
            lister.listed.clear()
            open(log, "w").close()
            df = ctx.sql(sql)
            start = time.time()
            table = df.to_arrow_table()
            end = time.time() - start
            print(f"\n== {title} on {ctx.runtime.name}: {table.num_rows} rows in {end:.2f} s")
            for t, n in lister.listed:
                print(f"  page listed at {t - start:6.2f} s ({n} files)")
            for line in Path(log).read_text().splitlines()[:4]:
                t, pid, name = line.split()
                print(f"  {name} first read at {float(t) - start:6.2f} s (pid {pid})")
            print(table.to_pandas().to_string(index=False))
            for name, parts in df.feed_metrics().items():
                for m in parts:
                    print(f"  feed {name} {m.describe()}")
    catalog.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
