"""An Iceberg table on a local S3 server, queried with distfusion (docs/iceberg.md).

Starts moto's S3 server on 127.0.0.1 (``pip install 'moto[server]'``), writes
a partitioned Iceberg table there with pyiceberg (a SQL catalog on SQLite in
a temporary directory; several appends, a column renamed), registers it with
``ctx.register_iceberg`` and runs: an aggregate over the whole table, the
same over one partition (only its data files are planned: ``explain()``
says "planned N of M data files"), and a time travel to the first snapshot.

    python examples/iceberg_s3.py                    # local runtime
    python examples/iceberg_s3.py --runtime flight   # or spark
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import tempfile

import pyarrow as pa

# Workers take S3 credentials from their environment (moto accepts any).
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_REGION", "us-east-1")

from distfusion import DistributedContext  # noqa: E402
from distfusion.io.object_store import AmazonS3  # noqa: E402
from distfusion.runtime.registry import runtime_from_name  # noqa: E402


def start_s3() -> tuple[object, str]:
    """Start moto's S3 server on a free port of 127.0.0.1; the server and its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def write_table(endpoint: str, directory: str):
    """``db.trips`` on ``s3://lake/warehouse``: partitioned by city, three appends, a rename."""
    import boto3
    from pyiceberg.catalog.sql import SqlCatalog

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lake")
    catalog = SqlCatalog(
        "demo",
        uri=f"sqlite:///{directory}/catalog.db",
        warehouse="s3://lake/warehouse",
        **{
            "s3.endpoint": endpoint,
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.region": "us-east-1",
        },
    )
    catalog.create_namespace("db")
    first = pa.table({"city": ["Oslo", "Oslo", "Rome"], "km": [3.5, 12.0, 7.25]})
    table = catalog.create_table("db.trips", schema=first.schema)
    with table.update_spec() as spec:
        spec.add_identity("city")  # a data file per city
    table.append(first)
    table.append(pa.table({"city": ["Rome", "Lima"], "km": [1.0, 30.0]}))
    with table.update_schema() as update:
        update.rename_column("km", "distance_km")  # older files still say "km"
    table.append(pa.table({"city": ["Oslo"], "distance_km": [5.0]}))
    return table


def main() -> None:
    """Write the table, query it three ways, print results and what was planned."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="local", choices=["local", "flight", "spark"])
    args = parser.parse_args()
    server, endpoint = start_s3()
    try:
        with tempfile.TemporaryDirectory() as directory:
            table = write_table(endpoint, directory)
            ctx = DistributedContext(runtime=runtime_from_name(args.runtime, 2))
            # The store the tasks read through; without it, one would be made from the
            # table's FileIO properties (its keys then travel to the workers).
            ctx.register_object_store(
                "s3://", AmazonS3(bucket_name="lake", endpoint=endpoint, allow_http=True), "lake"
            )
            ctx.register_iceberg("trips", table)
            sql = "SELECT city, count(*) AS trips, sum(distance_km) AS km FROM trips"
            print(ctx.sql(f"{sql} GROUP BY city ORDER BY city").to_pandas())
            df = ctx.sql(f"{sql} WHERE city = 'Oslo' GROUP BY city")
            print(df.to_pandas())
            print(next(line.strip() for line in df.explain().splitlines() if "Iceberg" in line))
            ctx.register_iceberg("first", table, snapshot_id=table.snapshots()[0].snapshot_id)
            print(ctx.sql("SELECT * FROM first ORDER BY km").to_pandas())
            ctx.runtime.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
