"""Iceberg tables on every runtime, equal to pyiceberg's own reader.

The table (``tests/iceberg_tables.py``: ``build_events``) has several
snapshots (appends, an overwrite, a copy-on-write delete), an identity
partition spec, a renamed column, an added column, a promoted type, a
merge-on-read position delete file and a data file without its partition
column; it lives on the local S3 server (a SQL catalog on SQLite, warehouse
``s3://iceberg/...``) and on local disk. Every result equals single-node
DataFusion over pyiceberg's ``scan().to_arrow()`` of the same snapshot.
Planning runs on the coordinator while the query runs: a filter on the
partition column plans only the matching files, and a catalog whose manifest
reads are slowed down delivers the first rows before planning finished
(events, not wall time). A data file removed after planning and a corrupt
manifest fail the query naming the file.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

import pyarrow as pa
import pytest
from datafusion import SessionContext
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from distfusion import DistfusionError, DistributedConfig, DistributedContext, PlanningError
from distfusion.errors import TaskError
from distfusion.io import object_store as stores
from distfusion.io.iceberg import IcebergTable
from tests.compare import assert_same_result, is_ordered
from tests.contract.conftest import wait_idle
from tests.iceberg_tables import build_events, local_catalog, s3_catalog, small_table, timestamp

BUCKET = "iceberg"

QUERIES = [
    "SELECT * FROM events",
    "SELECT region, count(*) AS n, sum(value) AS s, max(note) AS m, min(id) AS lo "
    "FROM events GROUP BY region ORDER BY region",
    # the table read twice in one query: two plannings, two feeds
    "SELECT a.id, b.id AS other FROM events a JOIN events b "
    "ON a.region = b.region AND a.id < b.id ORDER BY 1, 2",
    "SELECT id, value FROM events WHERE note IS NULL AND value > 10 ORDER BY id",
]


@pytest.fixture(scope="module")
def s3_iceberg(s3_server, s3_store):
    """The local S3 server with bucket ``iceberg`` and its store registered (no keys).

    Registered before any Iceberg table on it, so that no store is derived
    from the catalog's FileIO properties (whose keys would then travel to
    the workers: refused by Flight workers without a token).
    """
    s3_server.create_bucket(BUCKET)
    stores.register("s3://", s3_store(BUCKET), BUCKET)
    return s3_server


@pytest.fixture(scope="module")
def events_s3(s3_iceberg, tmp_path_factory):
    catalog = s3_catalog("contract", tmp_path_factory.mktemp("cat") / "c.db", s3_iceberg.endpoint)
    return build_events(catalog)


@pytest.fixture(scope="module")
def events_local(tmp_path_factory):
    return build_events(local_catalog("local", tmp_path_factory.mktemp("warehouse")))


@pytest.fixture(params=["s3", "local"])
def events(request):
    """The events table on the S3 server, then on local disk."""
    return request.getfixturevalue(f"events_{request.param}")


def _ctx(runtime, workers: int) -> DistributedContext:
    return DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))


def _oracle(ctx: DistributedContext, name: str, scan_table: pa.Table) -> SessionContext:
    """Single-node DataFusion over pyiceberg's rows, typed as distfusion reads the table."""
    oracle = SessionContext()
    rows = scan_table.cast(ctx.sources[name].schema)
    oracle.register_record_batches(name, [rows.to_batches() or [rows.schema.empty_table()]])
    return oracle


def _same(ctx, oracle, sql: str) -> pa.Table:
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle.sql(sql).to_arrow_table(), ordered=is_ordered(sql))
    return got


@pytest.mark.parametrize("sql", QUERIES)
def test_reads_equal_pyiceberg(sql, events, runtime, workers):
    ctx = _ctx(runtime, workers)
    ctx.register_iceberg("events", events.table)
    oracle = _oracle(ctx, "events", events.table.scan().to_arrow())
    got = _same(ctx, oracle, sql)
    assert got.num_rows > 0
    wait_idle(runtime)


def test_schema_evolution_and_deletes_are_applied(events_s3, runtime, workers):
    """What the table's history must give: renamed, added, promoted, deleted, projected."""
    ctx = _ctx(runtime, workers)
    ctx.register_iceberg("events", events_s3.table)
    schema = ctx.sources["events"].schema
    assert schema.names == ["id", "region", "value", "note", "info"]
    assert schema.field("id").type == pa.int64()  # promoted from int
    rows = ctx.sql("SELECT id, region, value, note, info FROM events ORDER BY id").to_pylist()
    ids = [r["id"] for r in rows]
    assert 2 not in ids  # the copy-on-write delete
    assert 1 not in ids and 6 not in ids and {3, 4, 5} <= set(ids)  # the position deletes
    assert not {101, 102, 103} & set(ids)  # overwritten
    by_id = {r["id"]: r for r in rows}
    assert by_id[3]["value"] == 4.5  # written as "v", read as "value" by its field id
    assert by_id[3]["note"] is None and by_id[14]["note"] == "c"  # added column
    assert by_id[20]["region"] == "sa"  # the partition value of a file without the column
    assert by_id[12]["info"] == {"source": "web", "tags": ["x", "y"]} and by_id[3]["info"] is None
    # A file whose value statistics say min = max = 15.5 (NaN is left out of them):
    # DataFusion's file statistics would read [15.5, NaN] as [15.5, 15.5].
    assert by_id[15]["value"] == 15.5 and math.isnan(by_id[16]["value"])
    wait_idle(runtime)


def test_time_travel(events, runtime, workers):
    ctx = _ctx(runtime, workers)
    t = events.table
    for step in ("append1", "overwrite", "delete"):
        sid = events.snapshots[step]
        ctx.register_iceberg("events", t, snapshot_id=sid)
        assert ctx.sources["events"].schema.names == ["id", "region", "v"]  # that snapshot's
        _same(ctx, _oracle(ctx, "events", t.scan(snapshot_id=sid).to_arrow()), QUERIES[0])
    ctx.register_iceberg("events", t, as_of=timestamp(events.times_ms["append2"]))
    oracle = _oracle(ctx, "events", t.scan(snapshot_id=events.snapshots["append2"]).to_arrow())
    got = _same(ctx, oracle, QUERIES[0])
    assert sorted(got.column("id").to_pylist()) == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        101,
        102,
        103,
    ]
    wait_idle(runtime)


def test_partition_filter_plans_only_matching_files(events_s3, runtime, workers):
    t = events_s3.table
    ctx = _ctx(runtime, workers)
    ctx.register_iceberg("events", t)
    matching = list(t.scan(row_filter="region = 'eu'").plan_files())
    total = int(t.current_snapshot().summary["total-data-files"])
    assert 0 < len(matching) < total
    sql = "SELECT region, count(*) AS n, sum(value) AS s FROM events WHERE region = 'eu' GROUP BY 1"
    df = ctx.sql(sql)
    oracle = _oracle(ctx, "events", t.scan().to_arrow())
    assert_same_result(df.to_arrow_table(), oracle.sql(sql).to_arrow_table(), ordered=False)
    units = sum(m.work_units for m in df.feed_metrics()["events"])
    assert units == len(matching)
    assert f"planned {len(matching)} of {total} data files" in df.explain_run()
    wait_idle(runtime)


class SlowManifests(FileIO):
    """A FileIO whose manifest reads are slowed down (the manifest list is not).

    The first manifest read takes ``delay_s``; every later one waits also
    until ``gate`` opens (at most ``wait_s``): a consumer's first rows, or a
    task's first read, so that planning cannot end before them unless units
    are held back until it ends.
    """

    def __init__(self, inner: FileIO, gate: threading.Event, delay_s: float = 0.1, wait_s=60):
        super().__init__(inner.properties)
        self.inner, self.gate, self.delay_s, self.wait_s = inner, gate, delay_s, wait_s
        self.reads: list[str] = []
        self.read_ends: list[float] = []  # time.time() when each manifest read was let go
        self.lock = threading.Lock()

    def new_input(self, location: str):
        name = location.rsplit("/", 1)[-1]
        if name.endswith(".avro") and not name.startswith("snap-"):  # a manifest
            with self.lock:
                first = not self.reads
                self.reads.append(location)
            time.sleep(self.delay_s)
            if not first:
                self.gate.wait(self.wait_s)
            with self.lock:
                self.read_ends.append(time.time())
        return self.inner.new_input(location)

    def new_output(self, location: str):
        return self.inner.new_output(location)

    def delete(self, location) -> None:
        self.inner.delete(location)


def test_first_rows_arrive_before_planning_finished(s3_iceberg, tmp_path, runtime):
    catalog = s3_catalog(f"slow_{runtime.name}", tmp_path / "c.db", s3_iceberg.endpoint)
    t = small_table(catalog, "db.slow", parts=4, rows_per_part=5)
    gate = threading.Event()
    io = SlowManifests(t.io, gate)
    slow = Table(t.name(), t.metadata, t.metadata_location, io, t.catalog)
    source = IcebergTable(slow, tasks=1)
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("t", source)
    events = []
    rows = 0
    for batch in ctx.sql("SELECT id, region FROM t").execute_stream():
        if not events:
            report = source.reports()[-1]
            events.append(("first rows", report.finished, report.data_files))
            gate.set()
        rows += batch.num_rows
    gate.set()
    report = source.reports()[-1]
    events.append(("end", report.finished, report.data_files))
    assert events[0][:2] == ("first rows", False), events  # planning had not finished
    assert events[0][2] < 4, events
    assert events[-1] == ("end", True, 4), events
    assert rows == 20 and len(io.reads) == 4
    wait_idle(runtime)


class RecordingIceberg(IcebergTable):
    """An IcebergTable whose tasks note each scan in a file (any process): time and units."""

    log = ""

    def scan(self, ctx, units):
        with open(self.log, "a") as f:
            f.write(f"{time.time()} {len(units)}\n")
        return super().scan(ctx, units)

    def to_bytes(self) -> bytes:
        return json.dumps({"source": super().to_bytes().decode(), "log": self.log}).encode()

    @classmethod
    def from_bytes(cls, data: bytes, schema: pa.Schema) -> RecordingIceberg:
        d = json.loads(data)
        source = super().from_bytes(d["source"].encode(), schema)
        source.log = d["log"]
        return source


class FileGate:
    """Opens once a file has a line (a task in any process wrote it)."""

    def __init__(self, path) -> None:
        self.path = path

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
                return True
            time.sleep(0.02)
        return False


def test_leaf_tasks_read_files_before_planning_finished(s3_iceberg, tmp_path, runtime, workers):
    """Units reach the leaf tasks (pushed, or pulled on Spark) while manifests are still read."""
    catalog = s3_catalog(f"leaf_{runtime.name}", tmp_path / "c.db", s3_iceberg.endpoint)
    t = small_table(catalog, "db.leaf", parts=4, rows_per_part=5)
    log = tmp_path / "scans.log"
    io = SlowManifests(t.io, FileGate(log))
    source = RecordingIceberg(Table(t.name(), t.metadata, t.metadata_location, io, t.catalog))
    source.log = str(log)
    ctx = _ctx(runtime, workers)
    ctx.register_feed_table("t", source)
    got = ctx.sql("SELECT region, count(*) AS n FROM t GROUP BY 1").to_pylist()
    assert sorted(r["n"] for r in got) == [5, 5, 5, 5]
    scans = [float(line.split()[0]) for line in log.read_text().splitlines()]
    assert min(scans) < max(io.read_ends), (scans, io.read_ends)  # a task read first
    assert source.reports()[-1].finished and source.reports()[-1].data_files == 4
    wait_idle(runtime)


def test_data_file_removed_after_planning_fails_naming_it(s3_iceberg, tmp_path, runtime, workers):
    catalog = s3_catalog(f"removed_{runtime.name}", tmp_path / "c.db", s3_iceberg.endpoint)
    t = small_table(catalog, "db.removed", parts=3)
    ctx = _ctx(runtime, workers)
    ctx.register_iceberg("t", t)
    gone = sorted(task.file.file_path for task in t.scan().plan_files())[1]
    s3_iceberg.client.delete_object(Bucket=BUCKET, Key=gone.removeprefix(f"s3://{BUCKET}/"))
    start = time.monotonic()
    with pytest.raises(TaskError) as info:
        ctx.sql("SELECT region, count(*) FROM t GROUP BY 1").to_arrow_table()
    assert time.monotonic() - start < 60
    assert gone in str(info.value) and "no longer exists" in str(info.value)
    wait_idle(runtime)


def test_corrupt_manifest_fails_the_query_naming_it(s3_iceberg, tmp_path, runtime, workers):
    catalog = s3_catalog(f"corrupt_{runtime.name}", tmp_path / "c.db", s3_iceberg.endpoint)
    t = small_table(catalog, "db.corrupt", parts=2)
    manifest = t.current_snapshot().manifests(t.io)[0].manifest_path
    s3_iceberg.client.put_object(
        Bucket=BUCKET, Key=manifest.removeprefix(f"s3://{BUCKET}/"), Body=b"not avro"
    )
    ctx = _ctx(runtime, workers)
    ctx.register_iceberg("t", t)  # the manifest list is fine: planning fails in the query
    start = time.monotonic()
    with pytest.raises(DistfusionError) as info:
        ctx.sql("SELECT count(*) FROM t").to_arrow_table()
    assert time.monotonic() - start < 60
    assert manifest in str(info.value) and "cannot read manifest" in str(info.value)
    wait_idle(runtime)


def test_coordinator_only_query_over_an_iceberg_table_is_refused(events_local, runtime):
    ctx = DistributedContext(runtime=runtime)
    ctx.register_iceberg("events", events_local.table)
    df = ctx.sql(
        "WITH RECURSIVE r(n) AS (SELECT min(id) FROM events UNION ALL "
        "SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r"
    )
    assert df.coordinator_only() is not None
    with pytest.raises(PlanningError, match="'events' is a feed-backed table"):
        df.to_arrow_table()
    # What the message says to do: a copy made by a distributed query, then the query.
    ctx.sql("CREATE TABLE events_copy AS SELECT id FROM events")
    got = ctx.sql(
        "WITH RECURSIVE r(n) AS (SELECT min(id) FROM events_copy UNION ALL "
        "SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r ORDER BY n"
    ).to_arrow_table()
    assert got.column(0).to_pylist() == [3, 4, 5]
    wait_idle(runtime)
