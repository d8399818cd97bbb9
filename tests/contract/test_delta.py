"""Delta tables (register_delta) on every runtime, on local disk and on S3, equal to deltalake.

Tables are written by deltalake (delta-rs 1.6) itself, to a local directory
and to the local S3 server (bucket ``delta``): partitioned, several versions
(appends, a partition overwrite, a delete -- which delta-rs 1.6 does by
rewriting files -- and an append that adds a column), deletion vectors
(committed as Delta Spark's DELETE does: tests/delta_tables.py) and column
mapping. Every result equals single-node DataFusion over deltalake's own read
of the same version (``to_pyarrow_table``, or ``scan`` where
``to_pyarrow_table`` cannot read the table: deletion vectors, column
mapping), compared with view types made plain on both sides; a filter on the
partition column plans only that partition's files, a filter on a column's
range only the files whose statistics allow it (counted in the graph that ran
and in ``explain()``); bad input fails registration naming the table and
where it is.
"""

from __future__ import annotations

import datetime
import decimal
import os
import shutil
import time

import pyarrow as pa
import pytest
from datafusion import SessionContext
from deltalake import DeltaTable, write_deltalake

from distfusion import DistributedConfig, DistributedContext
from distfusion.errors import PlanningError, TaskError
from tests.compare import assert_same_result, is_ordered
from tests.contract.conftest import wait_idle
from tests.delta_tables import comparable, delete_rows_with_deletion_vector

BUCKET = "delta"
REGIONS = ("EU", "US", "APAC")


def _rows(ids, region_of=None, note: bool = False) -> pa.Table:
    """Rows ``ids`` of the events table (``note`` added by a later version)."""
    ids = list(ids)
    cols = {
        "id": pa.array(ids, pa.int64()),
        "region": [region_of(i) if region_of else REGIONS[i % 3] for i in ids],
        "day": pa.array([datetime.date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
        "amount": pa.array(
            [None if i % 11 == 0 else decimal.Decimal(i * 37 % 1000) / 100 for i in ids],
            pa.decimal128(12, 2),
        ),
        "score": pa.array([i * 0.5 for i in ids], pa.float64()),
        "name": [None if i % 13 == 0 else f"n{i % 17}" for i in ids],
        "ts": pa.array(
            [
                datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(hours=i)
                for i in ids
            ],
            pa.timestamp("us", tz="UTC"),
        ),
    }
    if note:
        cols["note"] = [f"note {i}" for i in ids]
    return pa.table(cols)


def _write_events(uri: str, options: dict | None) -> list[int]:
    """The events table at ``uri``: the commit timestamps (ms) of its versions 0..5.

    v0-v2 appends (one file per region each), v3 overwrites region EU, v4
    deletes ``id % 7 = 0`` (files rewritten), v5 appends rows with a new
    column ``note``.
    """
    kw = {"storage_options": options} if options else {}
    write_deltalake(uri, _rows(range(0, 90)), partition_by=["region"], **kw)
    for start in (90, 180):
        time.sleep(0.01)  # distinct commit times, for time travel by timestamp
        write_deltalake(uri, _rows(range(start, start + 90)), mode="append", **kw)
    time.sleep(0.01)
    write_deltalake(
        uri,
        _rows(range(1000, 1040), region_of=lambda i: "EU"),
        mode="overwrite",
        predicate="region = 'EU'",
        **kw,
    )
    time.sleep(0.01)
    DeltaTable(uri, **kw).delete("id % 7 = 0")
    time.sleep(0.01)
    write_deltalake(
        uri, _rows(range(300, 330), note=True), mode="append", schema_mode="merge", **kw
    )
    return [
        h["timestamp"] for h in sorted(DeltaTable(uri, **kw).history(), key=lambda h: h["version"])
    ]


@pytest.fixture(scope="session")
def s3_delta(s3_server) -> dict:
    """Storage options (deltalake) for the local S3 server, its bucket ``delta`` created."""
    s3_server.create_bucket(BUCKET)
    return {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


@pytest.fixture(scope="module", params=["disk", "s3"])
def events(request, tmp_path_factory):
    """``(uri, deltalake storage options, commit timestamps)`` of the events table, per place."""
    if request.param == "disk":
        uri, options = str(tmp_path_factory.mktemp("delta") / "events"), None
    else:
        options = request.getfixturevalue("s3_delta")
        uri = f"s3://{BUCKET}/events"
    return uri, options, _write_events(uri, options)


def _context(runtime, workers, uri: str, s3_store=None) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    if uri.startswith("s3://"):
        ctx.register_object_store("s3://", s3_store(BUCKET), BUCKET)
    return ctx


def _oracle(table: pa.Table, name: str = "events") -> SessionContext:
    """Single-node DataFusion over ``table`` (deltalake's read), view types made plain."""
    ctx = SessionContext()
    table = comparable(table)
    ctx.register_record_batches(name, [table.to_batches() or [table.schema.empty_table()]])
    return ctx


def _check(ctx: DistributedContext, oracle: SessionContext, sql: str) -> None:
    got = comparable(ctx.sql(sql).to_arrow_table())
    expected = comparable(oracle.sql(sql).to_arrow_table())
    assert_same_result(got, expected, ordered=is_ordered(sql))


QUERIES = (
    "SELECT * FROM events",
    "SELECT region, count(*) AS n, sum(amount) AS s, min(day) AS d, max(ts) AS t, "
    "avg(score) AS a, count(name) AS names FROM events GROUP BY region ORDER BY region",
    "SELECT id, name, note FROM events WHERE id BETWEEN 150 AND 320 ORDER BY id",
    "SELECT count(*) AS n, count(note) AS notes FROM events WHERE region = 'EU'",
    "SELECT day, count(*) AS n FROM events WHERE ts >= TIMESTAMP '2024-01-08T00:00:00Z' "
    "AND name IS NOT NULL GROUP BY day ORDER BY day",
)


def test_latest_version_equals_deltalake(runtime, workers, events, s3_store):
    uri, options, _ = events
    ctx = _context(runtime, workers, uri, s3_store)
    ctx.register_delta("events", uri)
    dt = DeltaTable(uri, storage_options=options)
    assert dt.version() == 5
    oracle = _oracle(dt.to_pyarrow_table())
    for sql in QUERIES:
        _check(ctx, oracle, sql)
    source = ctx.sources["events"]
    # one unit per active file, from the log (not listed): rows and paths as delta-rs says
    actions = pa.table(dt.get_add_actions(flatten=True))
    assert len(source.units) == actions.num_rows
    assert sum(u.num_rows for u in source.units) == sum(actions.column("num_records").to_pylist())
    # schema evolution: the files written before v5 lack ``note``, read as NULL
    # a query that runs on the coordinator only reads deltalake's dataset there
    sql = "SELECT unnest(make_array(count(*), count(note))) AS v FROM events"
    assert ctx.sql(sql).coordinator_only() is not None
    _check(ctx, oracle, sql)
    notes = ctx.sql("SELECT count(*) AS n FROM events WHERE note IS NULL").to_pylist()
    assert notes == [
        {"n": dt.to_pyarrow_table().filter(pa.compute.is_null(pa.compute.field("note"))).num_rows}
    ]
    wait_idle(runtime)


def test_time_travel_by_version_and_timestamp(runtime, workers, events, s3_store):
    uri, options, stamps = events
    ctx = _context(runtime, workers, uri, s3_store)
    ctx.register_delta("events", uri, version=2)
    old = DeltaTable(uri, version=2, storage_options=options)
    oracle = _oracle(old.to_pyarrow_table())
    for sql in QUERIES[:2]:
        _check(ctx, oracle, sql)
    assert len(ctx.sources["events"].units) == 9  # three appends of one file per region
    # the version current at v1's commit time (a datetime in UTC, and the same as text),
    # as deltalake's load_as_version finds it (a commit's time is its log file's
    # modification time: on the S3 server, whole seconds)
    at_ms = stamps[1]
    if uri.startswith("/"):  # the log file's time, a few ms after commitInfo's on a busy machine
        log = os.path.join(uri, "_delta_log", f"{1:020d}.json")
        at_ms = max(at_ms, os.path.getmtime(log) * 1000)
    at = datetime.datetime.fromtimestamp(at_ms / 1000, tz=datetime.UTC)
    for when in (at, at.isoformat()):
        expected = DeltaTable(uri, storage_options=options)
        expected.load_as_version(when)
        ctx.register_delta("events", DeltaTable(uri, storage_options=options), timestamp=when)
        files = len(pa.table(expected.get_add_actions(flatten=True)))
        assert len(ctx.sources["events"].units) == files
        _check(ctx, _oracle(expected.to_pyarrow_table()), QUERIES[1])
        if uri.startswith("/"):
            assert expected.version() == 1 and files == 6
    wait_idle(runtime)


def _units_read(runtime) -> list[str]:
    """The unit paths of every scan in the last graph the runtime ran."""
    graph = runtime.executed[-1]
    return [u.path for s in graph.stages for scan in s.scans for t in scan.task_units for u in t]


def test_partition_filter_plans_only_matching_files(runtime, workers, events, s3_store):
    uri, options, _ = events
    ctx = _context(runtime, workers, uri, s3_store)
    ctx.register_delta("events", uri)
    dt = DeltaTable(uri, storage_options=options)
    actions = pa.table(dt.get_add_actions(flatten=True))
    eu = [
        p
        for p, r in zip(
            actions.column("path").to_pylist(),
            actions.column("partition.region").to_pylist(),
            strict=True,
        )
        if r == "EU"
    ]
    total = actions.num_rows
    assert 0 < len(eu) < total
    sql = "SELECT count(*) AS n, sum(amount) AS s FROM events WHERE region = 'EU'"
    df = ctx.sql(sql)
    assert f"({len(eu)} of {total} work units" in df.explain()
    _check(ctx, _oracle(dt.to_pyarrow_table()), sql)
    read = _units_read(runtime)
    assert len(read) == len(eu) and all("region=EU/" in p for p in read), read
    wait_idle(runtime)


def test_file_statistics_skip_files(runtime, workers, events, s3_store):
    """``id >= 300`` only in v5's files: the others' max(id) rules them out."""
    uri, options, _ = events
    ctx = _context(runtime, workers, uri, s3_store)
    ctx.register_delta("events", uri)
    dt = DeltaTable(uri, storage_options=options)
    actions = pa.table(dt.get_add_actions(flatten=True))
    total = actions.num_rows
    matching = sum(1 for m in actions.column("max.id").to_pylist() if m >= 300 and m < 1000)
    assert 0 < matching < total
    sql = "SELECT id, note FROM events WHERE id >= 300 AND id < 1000 ORDER BY id"
    assert f"({matching} of {total} work units" in ctx.sql(sql).explain()
    _check(ctx, _oracle(dt.to_pyarrow_table()), sql)
    assert len(_units_read(runtime)) == matching
    # a filter no file can pass plans no unit, and still answers
    _check(ctx, _oracle(dt.to_pyarrow_table()), "SELECT count(*) AS n FROM events WHERE id < 0")
    wait_idle(runtime)


# ---------------------------------------------------------------------- deletion vectors
@pytest.fixture(scope="module", params=["disk", "s3"])
def dv_table(request, tmp_path_factory):
    """A partitioned table with deletion vectors in two files: ``(uri, options, version before)``."""
    local = tmp_path_factory.mktemp("delta-dv") / "dv"
    rows = _rows(range(200))
    DeltaTable.create(
        str(local),
        rows.schema,
        partition_by=["region"],
        configuration={"delta.enableDeletionVectors": "true"},
    )
    write_deltalake(str(local), rows, mode="append")
    before = DeltaTable(str(local)).version()
    paths = sorted(
        pa.table(DeltaTable(str(local)).get_add_actions(flatten=True)).column("path").to_pylist()
    )
    delete_rows_with_deletion_vector(local, paths[0], [0, 1, 5, 40, 41, 42])
    delete_rows_with_deletion_vector(local, paths[1], list(range(0, 66, 3)))
    if request.param == "disk":
        return str(local), None, before
    server = request.getfixturevalue("s3_server")
    options = request.getfixturevalue("s3_delta")
    server.upload_dir(local, BUCKET, "dv")
    return f"s3://{BUCKET}/dv", options, before


def test_deletion_vectors_are_applied(runtime, workers, dv_table, s3_store):
    uri, options, before = dv_table
    ctx = _context(runtime, workers, uri, s3_store)
    ctx.register_delta("events", uri)
    dt = DeltaTable(uri, storage_options=options)
    assert pa.table(dt.deletion_vectors()).num_rows == 2  # deltalake reads both vectors
    live = pa.table(dt.scan())
    assert live.num_rows == 200 - 6 - 22
    oracle = _oracle(live)
    for sql in QUERIES[:2] + ("SELECT id FROM events WHERE id < 70 ORDER BY id",):
        _check(ctx, oracle, sql)
    assert sum(u.num_rows for u in ctx.sources["events"].units) == live.num_rows
    # a query that runs on the coordinator only (UNNEST): read there by delta-rs's own
    # table provider, which reads a local table only (deltalake 1.6 from
    # datafusion-python 55); on S3 it is refused, naming the table and why
    sql = "SELECT unnest(make_array(count(*), sum(id))) AS v FROM events"
    df = ctx.sql(sql)
    assert df.coordinator_only() is not None
    if uri.startswith("s3://"):
        with pytest.raises(PlanningError, match="table 'events' is read only by tasks"):
            df.to_arrow_table()
    else:
        _check(ctx, oracle, sql)
    # the version before the deletes reads every row
    ctx.register_delta("old", uri, version=before)
    got = ctx.sql("SELECT count(*) AS n FROM old").to_pylist()
    assert got == [{"n": 200}]
    wait_idle(runtime)


# ---------------------------------------------------------------------- column mapping
@pytest.fixture(scope="module", params=["name", "id"])
def mapped_table(request, tmp_path_factory):
    """A partitioned table with column mapping ``mode``: physical names are ``col-<uuid>``."""
    path = str(tmp_path_factory.mktemp(f"delta-cm-{request.param}") / "cm")
    rows = _rows(range(120))
    DeltaTable.create(
        path,
        rows.schema,
        partition_by=["region"],
        configuration={"delta.columnMapping.mode": request.param},
    )
    write_deltalake(path, rows, mode="append")
    write_deltalake(path, _rows(range(120, 150)), mode="append")
    return path


def test_column_mapping_reads_physical_columns(runtime, workers, mapped_table):
    ctx = _context(runtime, workers, mapped_table)
    ctx.register_delta("events", mapped_table)
    dt = DeltaTable(mapped_table)
    mode = dt.metadata().configuration["delta.columnMapping.mode"]
    source = ctx.sources["events"]
    if mode == "name":
        assert source.options["file_columns"]["id"].startswith("col-")
    else:  # resolved per file by field id: every unit says its columns
        assert all(u.data for u in source.units)
    # deltalake's to_pyarrow_table reads such a table as NULLs (1.6); its scan() maps columns
    live = pa.table(dt.scan())
    assert live.column("id").null_count == 0
    oracle = _oracle(live)
    for sql in QUERIES[:2]:
        _check(ctx, oracle, sql)
    sql = "SELECT count(*) AS n FROM events WHERE region = 'US' AND id >= 120"
    # one file of six: US's of the second append (its partition value and its ids)
    assert "(1 of 6 work units" in ctx.sql(sql).explain()
    _check(ctx, oracle, sql)
    wait_idle(runtime)


# ---------------------------------------------------------------------- read by delta-rs on S3
@pytest.fixture(scope="module")
def s3_read_by_delta_rs(s3_server, s3_delta, tmp_path_factory) -> dict[str, str]:
    """Tables on S3 the coordinator knows through delta-rs's table provider: kind -> URL.

    Column mapping (``name``, ``id``) written there by deltalake; deletion
    vectors committed on disk (tests/delta_tables.py) and uploaded.
    """
    out = {}
    for mode in ("name", "id"):
        uri = f"s3://{BUCKET}/read-by-delta-rs-{mode}"
        config = {"delta.columnMapping.mode": mode}
        write_deltalake(uri, _rows(range(50)), configuration=config, storage_options=s3_delta)
        out[mode] = uri
    local = tmp_path_factory.mktemp("delta-rs-dv") / "dv"
    rows = _rows(range(50))
    DeltaTable.create(
        str(local), rows.schema, configuration={"delta.enableDeletionVectors": "true"}
    )
    write_deltalake(str(local), rows, mode="append")
    (path,) = pa.table(DeltaTable(str(local)).get_add_actions(flatten=True)).column("path")
    delete_rows_with_deletion_vector(local, path.as_py(), [0, 7, 8, 49])
    s3_server.upload_dir(local, BUCKET, "read-by-delta-rs-dv")
    out["deletion vectors"] = f"s3://{BUCKET}/read-by-delta-rs-dv"
    return out


@pytest.mark.parametrize("kind", ["name", "id", "deletion vectors"])
def test_tables_read_by_delta_rs_on_s3_answer_with_default_settings(
    runtime, kind, s3_read_by_delta_rs, s3_delta, s3_store
):
    """Default settings run a small query as one task in place on the coordinator.

    delta-rs's provider there finds no store for the bucket ("No suitable
    object store found for s3://delta/"): that task reads the files as every
    task does, through the store registered for the bucket.
    """
    uri = s3_read_by_delta_rs[kind]
    ctx = DistributedContext(runtime=runtime)
    ctx.register_object_store("s3://", s3_store(BUCKET), BUCKET)
    ctx.register_delta("events", uri)
    live = pa.table(DeltaTable(uri, storage_options=s3_delta).scan())
    assert live.num_rows == (46 if kind == "deletion vectors" else 50)
    oracle = _oracle(live)
    for sql in QUERIES[:2] + ("SELECT id FROM events WHERE region = 'EU' ORDER BY id",):
        _check(ctx, oracle, sql)
    wait_idle(runtime)


# ---------------------------------------------------------------------- failures
def test_removed_data_file_fails_the_query(runtime, workers, tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(range(30)), partition_by=["region"])
    ctx = _context(runtime, workers, str(path))
    ctx.register_delta("t", str(path))
    gone = ctx.sources["t"].units[1].path
    shutil.os.remove(gone)
    with pytest.raises(TaskError) as info:
        ctx.sql("SELECT count(*) FROM t").to_arrow_table()
    assert gone in str(info.value) and "does not exist" in str(info.value)
    wait_idle(runtime)


def test_data_file_missing_before_registration_is_named_as_the_log_names_it(
    runtime, workers, tmp_path
):
    """A file the log names but which was gone before registration: not "removed after".

    Registration reads the log, not the files, so all that is known is that
    the log names a file that is not there; in place on the coordinator and
    in tasks alike.
    """
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(range(30)), partition_by=["region"])
    gone = os.path.join(
        path, DeltaTable(str(path)).get_add_actions(flatten=True)["path"][0].as_py()
    )
    os.remove(gone)
    for ctx in (DistributedContext(runtime=runtime), _context(runtime, workers, str(path))):
        ctx.register_delta("t", str(path))
        with pytest.raises(TaskError) as info:
            ctx.sql("SELECT count(*) FROM t").to_arrow_table()
        text = str(info.value)
        assert gone in text and "its Delta log (version 0) names it" in text, text
        assert "removed after the table was registered" not in text
    wait_idle(runtime)


def test_bad_delta_input_fails_registration(runtime, tmp_path, s3_store, s3_delta):
    ctx = DistributedContext(runtime=runtime)
    plain = tmp_path / "plain"
    plain.mkdir()
    pa.parquet.write_table(_rows(range(3)), plain / "part-0.parquet")
    with pytest.raises(PlanningError, match=f"table 'p'.*{plain}.*no Delta table there"):
        ctx.register_delta("p", plain)
    with pytest.raises(PlanningError, match="table 'p'.*nothing"):
        ctx.register_delta("p", tmp_path / "nothing")
    good = tmp_path / "good"
    write_deltalake(str(good), _rows(range(3)))
    with pytest.raises(PlanningError, match=f"table 'v'.*{good} at version 7.*versions run to 0"):
        ctx.register_delta("v", good, version=7)
    with pytest.raises(PlanningError, match="not both"):
        ctx.register_delta("v", good, version=0, timestamp="2024-01-01T00:00:00Z")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "_delta_log" / f"{1:020d}.json").write_text('{"add": not json\n')
    with pytest.raises(PlanningError, match=f"table 'c'.*{corrupt}") as info:
        ctx.register_delta("c", corrupt)
    assert "\n" not in str(info.value) and "<unknown>" not in str(info.value)  # no backtrace
    # an unreachable endpoint fails within seconds, naming the URL
    start = time.monotonic()
    with pytest.raises(PlanningError, match="table 'a'.*s3://away/t"):
        ctx.register_delta(
            "a",
            "s3://away/t",
            storage_options={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"},
        )
    assert time.monotonic() - start < 30
    assert ctx.table_names() == []


def test_storage_options_without_a_store_make_one(runtime, workers, s3_server, s3_delta):
    """A table given storage_options for a bucket with no store: the tasks read it too."""
    bucket = f"delta-opts-{runtime.name}"
    s3_server.create_bucket(bucket)
    uri = f"s3://{bucket}/t"
    rows = _rows(range(40))
    write_deltalake(uri, rows, partition_by=["region"], storage_options=s3_delta)
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    options = {k: v for k, v in s3_delta.items() if "KEY" not in k}  # keys: the environment's
    ctx.register_delta("t", uri, storage_options=options)
    _check(
        ctx,
        _oracle(DeltaTable(uri, storage_options=s3_delta).to_pyarrow_table(), "t"),
        "SELECT region, count(*) AS n FROM t GROUP BY region ORDER BY region",
    )
    wait_idle(runtime)
