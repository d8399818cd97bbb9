"""Work unit feeds (issue #11) on every runtime: results, streaming, back-pressure, errors.

Feed-backed tables here are :class:`RangeSource`: each work unit names a range
of row ids (its ``data``), and ``read`` builds the rows from it, so the
oracle (single-node DataFusion) gets the very same rows as record batches.
Classes are module-level: Flight workers and Spark executors import them
(``tests.test_feeds``) to rebuild ``read``. Timestamps and process ids of
reads on other processes go to a log file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import (
    DistfusionError,
    DistributedConfig,
    DistributedContext,
    FeedContext,
    FeedTableSource,
    ListingFeed,
    LocalRuntime,
    PlanningError,
    TaskError,
    WorkSharingFeedProvider,
    WorkUnit,
    WorkUnitFeed,
    WorkUnitFeedProvider,
)
from tests.compare import assert_same_result, is_ordered, oracle_result

RUNTIMES = ["local", "flight", "spark"]
UNIT_ROWS = 50


def rows(start: int, stop: int) -> pa.RecordBatch:
    """The rows of ids ``start..stop-1``: id, k (7 groups), v, s."""
    ids = list(range(start, stop))
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % 7 for i in ids], pa.int64()),
            "v": pa.array([i * 0.5 for i in ids], pa.float64()),
            "s": pa.array([f"s{i % 11}" for i in ids], pa.string()),
        }
    )


SCHEMA = rows(0, 1).schema


class RangeProvider(WorkUnitFeedProvider):
    """Units of ``UNIT_ROWS`` ids each, unit *u* to partition ``u % n``.

    Records every yield (time, partition, pid) and every closed generator.
    ``delay_s``: sleep before each unit; ``slow``: {partition: seconds before
    its last unit}; ``fail``: (partition, after units) raises there.
    """

    def __init__(self, first, total, log="", delay_s=0.0, slow=None, fail=None, forever=False):
        self.first, self.total, self.log = first, total, log
        self.delay_s, self.slow, self.fail, self.forever = delay_s, slow or {}, fail, forever
        self.yields: list[tuple[float, int, int]] = []
        self.calls_pids: set[int] = set()
        self.closed: set[int] = set()

    def feed(self, partition: int, ctx: FeedContext):
        self.calls_pids.add(os.getpid())
        units = range(self.first, self.first + self.total, UNIT_ROWS)
        mine = [u for i, u in enumerate(units) if i % ctx.num_partitions == partition]
        try:
            n = 0
            while True:
                for j, start in enumerate(mine):
                    if self.fail and self.fail[0] == partition and n == self.fail[1]:
                        raise ValueError(f"page {n} is gone")
                    if self.delay_s and ctx.wait(self.delay_s):
                        return
                    if j == len(mine) - 1 and partition in self.slow:
                        time.sleep(self.slow[partition])
                    stop = min(start + UNIT_ROWS, self.first + self.total)
                    data = json.dumps({"start": start, "stop": stop, "log": self.log})
                    self.yields.append((time.time(), partition, os.getpid()))
                    n += 1
                    yield WorkUnit(data=data.encode(), num_rows=stop - start)
                if not self.forever:
                    return
                mine = [u + self.total for u in mine]
        finally:
            self.closed.add(partition)


class RangeSource(FeedTableSource):
    """A feed-backed table of :func:`rows`; ``read`` needs only the unit (and the schema)."""

    def __init__(self, provider, tasks=None, estimated_bytes=None, buffer_units=4):
        self.schema = SCHEMA
        self.provider = provider
        self.feed = WorkUnitFeed(provider, buffer_units)
        self.tasks = tasks
        self.estimated_bytes = estimated_bytes

    def read(self, unit: WorkUnit) -> pa.RecordBatchReader:
        d = json.loads(unit.data)
        if d["log"]:
            with open(d["log"], "a") as f:
                f.write(f"{time.time()} {os.getpid()} {d['start']}\n")
        batch = rows(d["start"], d["stop"])
        return pa.RecordBatchReader.from_batches(batch.schema, [batch])


def read_log(path: Path) -> list[tuple[float, int, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        t, pid, start = line.split()
        out.append((float(t), int(pid), int(start)))
    return out


# ---------------------------------------------------------------------- setup
TABLES = {  # name -> (first id, rows, tasks, estimated bytes)
    "a1": (0, 1000, 1, None),
    "a2": (0, 1000, 2, None),
    "a": (0, 1000, 3, None),
    "b": (500, 900, 2, None),
    "c": (2000, 400, 3, None),
    "e": (0, 0, 2, None),
    "small": (0, 14, 1, 1000),
}


@pytest.fixture(scope="module")
def file_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("feed_files")
    for i in range(3):
        pq.write_table(pa.Table.from_batches([rows(i * 400, (i + 1) * 400)]), d / f"f{i}.parquet")
    return d


@pytest.fixture(scope="module")
def feed_oracle(file_dir) -> SessionContext:
    ctx = SessionContext()
    for name, (first, n, _, _) in TABLES.items():
        ctx.register_record_batches(name, [[rows(first, first + n)]])
    ctx.register_parquet("f", str(file_dir))
    return ctx


def feed_context(runtime, file_dir, **config) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(**config))
    for name, (first, n, tasks, est) in TABLES.items():
        ctx.register_feed_table(name, RangeSource(RangeProvider(first, n), tasks, est))
    ctx.register_parquet("f", file_dir)
    return ctx


@pytest.fixture(params=RUNTIMES)
def runtime(request, runtime_for):
    return runtime_for(request.param, 3)


SHAPES = {
    "one_task": "SELECT k, count(*) AS n, sum(v) AS sv FROM a1 GROUP BY k",
    "two_tasks": "SELECT k, count(*) AS n, sum(v) AS sv FROM a2 GROUP BY k",
    "three_tasks": "SELECT k, count(*) AS n, sum(v) AS sv, min(s) AS ms FROM a GROUP BY k",
    "scan": "SELECT id, k, s FROM a WHERE id % 3 = 0",
    "empty": "SELECT count(*) AS n, sum(v) AS sv FROM e",
    "empty_rows": "SELECT * FROM e",
    "global_aggregate": "SELECT count(*), sum(v), min(id), max(id), avg(v) FROM a",
    "join_file": "SELECT a.k, count(*) AS n, sum(f.v) AS sv FROM a JOIN f ON a.id = f.id GROUP BY a.k",
    "join_feeds": "SELECT count(*) AS n, sum(a.v + b.v) AS sv FROM a JOIN b ON a.id = b.id",
    "union2": "SELECT k, v FROM a UNION ALL SELECT k, v FROM b",
    "union3": "SELECT id FROM a UNION ALL SELECT id FROM b UNION ALL SELECT id FROM c",
    "nested_unions": (
        "SELECT k, count(*) AS n FROM ((SELECT id, k FROM a UNION ALL SELECT id, k FROM b) "
        "UNION ALL (SELECT id, k FROM c UNION ALL SELECT id, k FROM f)) GROUP BY k"
    ),
    "union_file": "SELECT id, s FROM a UNION ALL SELECT id, s FROM f",
    "broadcast_join": (
        "SELECT small.s, count(*) AS n FROM a JOIN small ON a.k = small.id GROUP BY small.s"
    ),
    "aggregate_union": (
        "SELECT k, count(*) AS n, sum(v) AS sv "
        "FROM (SELECT k, v FROM a UNION ALL SELECT k, v FROM b UNION ALL SELECT k, v FROM c) "
        "GROUP BY k ORDER BY k"
    ),
    "subquery": "SELECT count(*) FROM a WHERE v > (SELECT avg(v) FROM b)",
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_same_result_as_datafusion(runtime, file_dir, feed_oracle, shape):
    sql = SHAPES[shape]
    ctx = feed_context(runtime, file_dir)
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(feed_oracle, sql), is_ordered(sql))


def test_a_query_only_the_coordinator_runs_refuses_a_feed_table(file_dir):
    # The coordinator holds an empty table under a feed table's name: a query
    # that Substrait cannot carry (IGNORE NULLS) would read no row there.
    ctx = feed_context(LocalRuntime(workers=3), file_dir)
    df = ctx.sql("SELECT k, first_value(v ORDER BY id) IGNORE NULLS FROM a GROUP BY k")
    assert "IGNORE NULLS" in df.coordinator_only()
    with pytest.raises(PlanningError, match="table 'a' is a feed-backed table.*memory table"):
        df.to_arrow_table()


def test_task_counts_follow_the_source(file_dir):
    ctx = feed_context(LocalRuntime(workers=3), file_dir)
    for name, tasks in (("a1", 1), ("a2", 2), ("a", 3)):
        graph = ctx.sql(f"SELECT k, sum(v) FROM {name} GROUP BY k").stage_graph()
        (leaf,) = [s for s in graph.stages if s.scans]
        assert leaf.num_tasks == tasks
        assert leaf.scans[0].source.options["chunked"] is (tasks > 1)
    text = ctx.sql("SELECT small.s, count(*) FROM a JOIN small ON a.k = small.id GROUP BY 1")
    assert "broadcast" in text.explain()


# ---------------------------------------------------------------------- streaming
def test_provider_on_coordinator_and_reads_start_early(runtime, file_dir, tmp_path):
    log = tmp_path / "reads.log"
    provider = RangeProvider(0, 600, log=str(log), delay_s=0.15)
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("slow", RangeSource(provider, tasks=2))
    got = ctx.sql("SELECT count(*) AS n, sum(v) AS sv FROM slow").to_pylist()
    assert got == [{"n": 600, "sv": sum(i * 0.5 for i in range(600))}]
    assert provider.calls_pids == {os.getpid()}
    assert {pid for _, _, pid in provider.yields} == {os.getpid()}
    reads = read_log(log)
    assert len(reads) == 12
    # A worker read its first unit before the provider yielded its last.
    assert min(t for t, _, _ in reads) < max(t for t, _, _ in provider.yields)


def test_slow_partition_does_not_delay_another_feed(runtime, tmp_path):
    fast_log, slow_log = tmp_path / "fast.log", tmp_path / "slow.log"
    fast = RangeProvider(0, 200, log=str(fast_log))
    slow = RangeProvider(1000, 200, log=str(slow_log), slow={0: 3.0})
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("fast", RangeSource(fast, tasks=1))
    ctx.register_feed_table("slow", RangeSource(slow, tasks=1))
    sql = "SELECT count(*) AS n FROM (SELECT id FROM fast UNION ALL SELECT id FROM slow)"
    assert ctx.sql(sql).to_pylist() == [{"n": 400}]
    last_slow_yield = max(t for t, _, _ in slow.yields)
    fast_reads = read_log(fast_log)
    assert len(fast_reads) == 4
    # Every unit of the fast feed was read before the slow partition's last unit existed.
    assert max(t for t, _, _ in fast_reads) < last_slow_yield


def test_bounded_buffer_keeps_the_coordinator_flat(runtime):
    provider = RangeProvider(0, 200 * UNIT_ROWS)
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("long", RangeSource(provider, tasks=2, buffer_units=3))
    df = ctx.sql("SELECT k, count(*) AS n FROM long GROUP BY k")
    assert sum(r["n"] for r in df.to_pylist()) == 200 * UNIT_ROWS
    metrics = df.feed_metrics()["long"]
    assert [m.partition for m in metrics] == [0, 1]
    assert sum(m.work_units for m in metrics) == 200
    assert all(m.bytes > 0 and m.done for m in metrics)
    assert max(m.buffer_high_water for m in metrics) <= 3
    text = df.explain()
    assert "Work unit feeds (last run):" in text and "partition 1: 100 units" in text


def test_session_partitions_are_independent():
    provider = RangeProvider(0, 10 * UNIT_ROWS, slow={0: 30.0})
    feed = WorkUnitFeed(provider, buffer_units=2)
    session = feed.open("q-independent", 2, table="t")
    try:
        got = list(session.read(1))  # partition 0 is stuck in its provider meanwhile
        assert len(got) == 5
        assert feed.metrics()[1].work_units == 5
    finally:
        session.close()


def test_work_sharing_gives_a_slow_reader_fewer_units():
    units = [WorkUnit(path=f"p{i}") for i in range(40)]
    feed = WorkUnitFeed(WorkSharingFeedProvider(lambda ctx: iter(units)), buffer_units=1)
    session = feed.open("q-sharing", 2, table="t")
    taken: dict[int, list] = {0: [], 1: []}

    def reader(p: int, pause_s: float) -> None:
        for raw in session.read(p):
            taken[p].append(WorkUnit.from_bytes(raw).path)
            time.sleep(pause_s)

    threads = [
        threading.Thread(target=reader, args=(0, 0.0)),
        threading.Thread(target=reader, args=(1, 0.05)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(taken[0] + taken[1], key=lambda p: int(p[1:])) == [u.path for u in units]
    assert len(taken[0]) > 2 * len(taken[1])


def test_work_unit_round_trip():
    u = WorkUnit(path="s3://bucket/x.parquet", size_bytes=10, num_rows=3, data=b"\x00page")
    assert WorkUnit.from_bytes(u.to_bytes()) == u
    with pytest.raises(ValueError, match="not a serialised WorkUnit"):
        WorkUnit.from_bytes(b"pickle?")


def test_listing_feed_over_files(runtime, file_dir, feed_oracle):
    paths = sorted(str(p) for p in file_dir.glob("*.parquet"))
    listed = []

    def pages():
        for i in range(0, len(paths), 2):
            listed.append(time.time())
            yield paths[i : i + 2]

    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("lf", ListingFeed(pages, tasks=2))
    sql = "SELECT k, count(*) AS n, sum(v) AS sv FROM lf GROUP BY k"
    got = ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(feed_oracle, sql.replace("lf", "f")), False)


# ---------------------------------------------------------------------- errors
def _live_tasks(runtime) -> int:
    return sum(s.get("live_tasks", 0) for s in runtime.stats().values())


def test_provider_error_fails_the_query_fast(runtime):
    provider = RangeProvider(0, 100 * UNIT_ROWS, delay_s=0.05, fail=(1, 2))
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("broken", RangeSource(provider, tasks=3))
    df = ctx.sql("SELECT k, count(*) FROM broken GROUP BY k")
    start = time.monotonic()
    with pytest.raises(DistfusionError) as info:
        df.to_arrow_table()
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "page 2 is gone" in message
    assert "'broken'" in message and "partition 1" in message
    assert elapsed < 10, elapsed  # about a second here; wide margin on a busy machine
    deadline = time.monotonic() + 10
    while _live_tasks(runtime) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_tasks(runtime) == 0
    deadline = time.monotonic() + 10
    while provider.closed != {0, 1, 2} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provider.closed == {0, 1, 2}


def test_cancel_closes_the_provider(runtime):
    provider = RangeProvider(0, 10 * UNIT_ROWS, delay_s=0.01, forever=True)
    ctx = DistributedContext(runtime=runtime)
    ctx.register_feed_table("endless", RangeSource(provider, tasks=1))
    stream = ctx.sql("SELECT id FROM endless").execute_stream()
    first = next(iter(stream))
    assert first.num_rows > 0
    stream.close()
    deadline = time.monotonic() + 10
    while provider.closed != {0} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provider.closed == {0}


def test_worker_that_cannot_reach_the_feed(file_dir):
    from distfusion.protocol.task_plan import TaskKey, TaskPlan
    from distfusion.runtime.local import LocalRuntime as _Local

    runtime = _Local(workers=1)
    ctx = feed_context(runtime, file_dir)
    graph = ctx.sql("SELECT id FROM a2 WHERE k = 1").stage_graph()
    (leaf,) = [s for s in graph.stages if s.scans]
    plan = TaskPlan.for_task("q-unreachable", leaf, 0, (), 1)
    share = plan.scans[0]
    options = {**share.source.options, "endpoint": "grpc://127.0.0.1:9", "secret": "x"}
    import dataclasses

    share = dataclasses.replace(share, source=dataclasses.replace(share.source, options=options))
    plan = dataclasses.replace(plan, scans=(share,))
    worker = runtime.transport.workers[runtime.urls[0]]
    worker.set_plan(plan)
    with pytest.raises(TaskError, match="cannot reach the work unit feed at grpc://127.0.0.1:9"):
        list(worker.execute_partition(TaskKey("q-unreachable", leaf.stage_id, 0), 0, 30))
    runtime.close()


@pytest.mark.parametrize("shape", ["three_tasks", "join_feeds", "aggregate_union", "empty"])
def test_spark_shuffle_data_plane(spark_session, file_dir, feed_oracle, shape):
    from distfusion.runtime.spark import SparkRuntime

    runtime = SparkRuntime(spark=spark_session, data_plane="shuffle")
    sql = SHAPES[shape]
    got = feed_context(runtime, file_dir).sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(feed_oracle, sql), is_ordered(sql))


@pytest.mark.parametrize("plane", ["flight", "shuffle"])
def test_spark_encrypted_data_plane_pulls_feeds_over_tls(
    spark_session, file_dir, feed_oracle, plane
):
    """Spark asked to encrypt: the driver's feed endpoint serves TLS, and tasks pull through it."""
    from distfusion.runtime.spark import SparkRuntime

    runtime = SparkRuntime(
        spark=spark_session, conf={"spark.io.encryption.enabled": "true"}, data_plane=plane
    )
    try:
        sql = SHAPES["join_feeds"]
        got = feed_context(runtime, file_dir).sql(sql).to_arrow_table()
        assert_same_result(got, oracle_result(feed_oracle, sql), is_ordered(sql))
        endpoint = runtime._feed_endpoint  # started by the query's tasks' pulls
        assert endpoint is not None and endpoint.url.startswith("grpc+tls://")
    finally:
        runtime.close()
