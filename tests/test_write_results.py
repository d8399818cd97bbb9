"""Results that stay distributed: ``write_parquet`` / ``write_csv`` on every runtime, ``to_spark``.

Every result is read back with DataFusion and compared with single-node
DataFusion on the same data (tests/compare.py). The commit protocol's
promises (no partial file, no duplicate, nothing left of a failed job) are
checked with a task failing mid-write on Spark, and without a runtime on the
committer itself.
"""

from __future__ import annotations

import gc
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, TaskError, tpch
from distfusion.io.write import FileCommitter, OutputExistsError, WriteSpec, file_schema, write_task
from distfusion.spark import SparkDataFrame
from distfusion.worker.head_parts import row_wise
from tests.compare import assert_same_result, oracle_result
from tests.conftest import REPO

RUNTIMES = {"local": 3, "flight": 3, "spark": 2}

JOIN = (
    "SELECT l_orderkey, l_linenumber, l_quantity, o_orderdate, l_returnflag "
    "FROM lineitem JOIN orders ON l_orderkey = o_orderkey WHERE l_quantity > 40"
)
GROUPED = "SELECT l_suppkey, sum(l_quantity) AS q, count(*) AS n FROM lineitem GROUP BY l_suppkey"
ORDERED = (
    "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem ORDER BY l_orderkey, l_linenumber"
)
FILTER = "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem WHERE l_quantity > 30"


@pytest.fixture(params=list(RUNTIMES))
def ctx(request, runtime_for, tpch_dir) -> DistributedContext:
    runtime = runtime_for(request.param, RUNTIMES[request.param])
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _data_files(path) -> list[str]:
    out = []
    for root, _, files in os.walk(path):
        out.extend(os.path.relpath(os.path.join(root, f), path) for f in files)
    return sorted(f for f in out if f != "_SUCCESS")


def _read_back(path, expected: pa.Table, fmt: str = "parquet", partition_cols=()) -> pa.Table:
    """The written files as one table, read by DataFusion, columns in ``expected``'s order."""
    reader = SessionContext()
    if fmt == "parquet":
        cols = [(c, expected.schema.field(c).type) for c in partition_cols]
        reader.register_parquet("r", str(path), table_partition_cols=cols or None)
    else:
        reader.register_csv("r", str(path), schema=file_schema(expected.schema), has_header=True)
    names = ", ".join(f'"{n}"' for n in expected.column_names)
    return reader.sql(f"SELECT {names} FROM r").to_arrow_table()


@pytest.mark.parametrize("sql", [JOIN, GROUPED], ids=["join", "grouped"])
def test_write_parquet_gives_the_query_rows_one_file_per_task(ctx, oracle, sql, tmp_path):
    out = tmp_path / "out"
    files = ctx.sql(sql).write_parquet(out)
    expected = oracle_result(oracle, sql)
    assert_same_result(_read_back(out, expected), expected, False, check_types=False)
    assert sorted(f.relpath for f in files) == _data_files(out)
    assert len(files) > 1  # a projection head: one file per task of the stage below
    assert sum(f.rows for f in files) == expected.num_rows
    assert os.path.exists(out / "_SUCCESS")
    assert not os.path.exists(out / "_temporary")


def test_write_csv_gives_the_query_rows(ctx, oracle, tmp_path):
    out = tmp_path / "out"
    ctx.sql(JOIN).write_csv(out)
    expected = oracle_result(oracle, JOIN)
    got = _read_back(out, expected, "csv")
    assert_same_result(got, expected, False, check_types=False)
    assert all(f.endswith(".csv") for f in _data_files(out))


def test_write_parquet_partition_by_writes_hive_directories(ctx, oracle, tmp_path):
    out = tmp_path / "out"
    files = ctx.sql(JOIN).write_parquet(out, partition_by=["l_returnflag"])
    expected = oracle_result(oracle, JOIN)
    assert {f.relpath.split("/")[0] for f in files} == {
        "l_returnflag=A",
        "l_returnflag=N",
        "l_returnflag=R",
    }
    got = _read_back(out, expected, partition_cols=["l_returnflag"])
    assert_same_result(got, expected, False, check_types=False)


def test_ordered_result_is_one_file_in_order(ctx, oracle, tmp_path):
    out = tmp_path / "out"
    files = ctx.sql(ORDERED).write_parquet(out)
    assert len(files) == 1
    expected = oracle_result(oracle, ORDERED)
    got = pq.read_table(out / files[0].relpath)
    assert_same_result(got, expected, True, check_types=False)


def test_existing_directory_is_an_error_unless_overwrite(tmp_path):
    ctx = DistributedContext(runtime=_local())
    ctx.register_table("t", pa.table({"a": [1, 2, 3]}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.parquet").write_text("x")
    with pytest.raises(OutputExistsError, match="mode='overwrite'"):
        ctx.sql("SELECT a FROM t").write_parquet(out)
    assert (out / "old.parquet").exists()
    ctx.sql("SELECT a FROM t").write_parquet(out, mode="overwrite")
    assert not (out / "old.parquet").exists()
    assert pq.read_table(out).column("a").to_pylist() == [1, 2, 3]
    with pytest.raises(ValueError, match="partition_by names"):
        ctx.sql("SELECT a FROM t").write_parquet(tmp_path / "x", partition_by=["b"])


def test_empty_result_writes_one_file_with_the_columns(tmp_path):
    ctx = DistributedContext(runtime=_local())
    ctx.register_table("t", pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}))
    out = tmp_path / "out"
    files = ctx.sql("SELECT a, b FROM t WHERE a > 5").write_parquet(out)
    assert [f.rows for f in files] == [0]
    assert pq.read_table(out).schema.names == ["a", "b"]


def _local():
    from distfusion import LocalRuntime

    return LocalRuntime(workers=2)


# ------------------------------------------------------------------ the committer alone
def _spec(tmp_path) -> WriteSpec:
    return WriteSpec(str(tmp_path / "out"), "q" * 36, "parquet", pa.schema([("a", pa.int64())]))


def _batches(n: int, fail_after: int | None = None):
    for i in range(n):
        if fail_after is not None and i == fail_after:
            raise RuntimeError("killed mid-write")
        yield pa.record_batch({"a": list(range(i * 10, i * 10 + 10))})


def test_failed_attempt_leaves_nothing_and_a_second_commit_of_a_task_is_dropped(tmp_path):
    spec = _spec(tmp_path)
    committer = FileCommitter(spec)
    committer.setup_job()
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_task(spec, 0, _batches(3, fail_after=1))
    assert os.listdir(spec.job_dir) == []  # the failed attempt's directory is gone
    first = write_task(spec, 0, _batches(3))
    again = write_task(spec, 0, _batches(3))  # a speculative attempt committing late
    assert first == again
    other = write_task(spec, 1, _batches(1))
    files = committer.commit_job([first, other])
    assert sorted(f.relpath for f in files) == _data_files(spec.path)
    assert pq.read_table(spec.path).num_rows == 40
    assert sorted(os.listdir(spec.path)) == sorted(
        ["_SUCCESS", f"part-00000-{'q' * 8}.parquet", f"part-00001-{'q' * 8}.parquet"]
    )


def test_aborted_job_leaves_no_file(tmp_path):
    spec = _spec(tmp_path)
    committer = FileCommitter(spec)
    committer.setup_job()
    write_task(spec, 0, _batches(2))
    committer.abort_job()
    assert os.listdir(spec.path) == []


# ------------------------------------------------------------------ how the head is cut
@pytest.mark.parametrize(
    ("sql", "cut"),
    [
        (JOIN, True),
        (GROUPED, True),
        (ORDERED, False),
        ("SELECT count(*) FROM lineitem", False),
        ("SELECT l_orderkey FROM lineitem LIMIT 5", False),
        ("SELECT l_orderkey FROM lineitem UNION ALL SELECT o_orderkey FROM orders", True),
    ],
)
def test_only_a_row_wise_head_is_cut(tpch_dir, sql, cut):
    ctx = DistributedContext(runtime=_local(), config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    assert row_wise(ctx.sql(sql).stage_graph().head) is cut


# ------------------------------------------------------------------ Spark: failures, to_spark
@pytest.fixture
def spark_ctx(runtime_for, tpch_dir) -> DistributedContext:
    ctx = DistributedContext(
        runtime=runtime_for("spark", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def test_task_killed_mid_write_on_spark_leaves_no_partial_or_duplicate_file(
    spark_ctx, oracle, fail_task, tmp_path
):
    df = spark_ctx.sql(FILTER)
    head = df.stage_graph().head
    expected = oracle_result(oracle, FILTER)
    # Every attempt of part 0 fails after its first batch: the job fails, no file is left.
    fail_task(f"{head.stage_id}:0:always")
    with pytest.raises(TaskError, match="injected failure"):
        df.write_parquet(tmp_path / "failed")
    assert _data_files(tmp_path / "failed") == []
    # Its first attempt only: Spark's next attempt writes it; the result is whole, once.
    fail_task(f"{head.stage_id}:0:1")
    out = tmp_path / "out"
    files = df.write_parquet(out)
    assert sorted(f.relpath for f in files) == _data_files(out)
    assert len({f.relpath for f in files}) == len(files) == 2
    assert not os.path.exists(out / "_temporary")
    assert_same_result(_read_back(out, expected), expected, False, check_types=False)


def _executed_plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def test_to_spark_of_a_multi_task_result_is_computed_on_the_executors(
    spark_ctx, spark_session, oracle
):
    runtime = spark_ctx.runtime
    sdf = SparkDataFrame(spark_ctx, spark_ctx.sql(GROUPED), spark_session)
    frame = sdf.to_spark()
    assert "MapInArrow" in _executed_plan(frame)  # not a table made on the driver
    graph = sdf.last_run.final
    tasks = sum(graph.stage(i.stage_id).num_tasks for i in graph.head.inputs)
    assert tasks > 1
    assert frame.rdd.getNumPartitions() == tasks  # one per task of the final aggregate
    assert len(runtime.held_results) == 1
    del sdf  # the DataFrame alone keeps the result
    expected = oracle_result(oracle, GROUPED)
    assert_same_result(frame.toArrow(), expected, False, check_types=False)
    assert_same_result(frame.toArrow(), expected, False, check_types=False)  # read twice
    del frame
    gc.collect()
    assert runtime.held_results == {}  # released with the DataFrame


def test_to_spark_of_a_global_order_by_keeps_its_order(spark_ctx, spark_session, oracle):
    sdf = SparkDataFrame(spark_ctx, spark_ctx.sql(ORDERED), spark_session)
    frame = sdf.to_spark()
    assert "MapInArrow" in _executed_plan(frame)  # inputs over 16 MiB: run on an executor
    assert frame.rdd.getNumPartitions() == 1
    expected = oracle_result(oracle, ORDERED)
    assert_same_result(frame.toArrow(), expected, True, check_types=False)
    sdf.release()
    assert spark_ctx.runtime.held_results == {}
    with pytest.raises(Exception):  # noqa: B017 - Spark's wrapping of the task's error
        frame.count()


def test_to_spark_of_a_small_single_task_result_is_made_on_the_driver(
    spark_ctx, spark_session, oracle
):
    sql = "SELECT l_returnflag, count(*) AS n FROM lineitem GROUP BY 1 ORDER BY 1"
    frame = SparkDataFrame(spark_ctx, spark_ctx.sql(sql), spark_session).to_spark()
    assert "MapInArrow" not in _executed_plan(frame)
    assert spark_ctx.runtime.held_results == {}
    assert_same_result(frame.toArrow(), oracle_result(oracle, sql), True, check_types=False)


# ------------------------------------------------------------------ the target (slow)
def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.slow
def test_to_spark_of_six_million_rows_written_by_spark_keeps_the_driver_small(
    runtime_for, spark_session, tpch_dir, tmp_path
):
    """TPC-H SF1 lineitem joined with orders (6,001,215 rows) through to_spark to Parquet.

    The driver's RSS (this process) grows by less than 200 MB while Spark
    writes the result; the files hold the single-node result (count and sums).
    """
    sf1 = next(
        (p for p in (REPO / "data" / "tpch-sf1", tpch_dir.parent / "tpch-sf1") if p.is_dir()), None
    )
    if sf1 is None:
        pytest.skip("no TPC-H scale factor 1 data (make run generates data/tpch-sf1)")
    sql = (
        "SELECT l_orderkey, l_partkey, l_quantity, l_extendedprice, l_shipdate, "
        "o_custkey, o_orderdate FROM lineitem JOIN orders ON l_orderkey = o_orderkey"
    )
    ctx = DistributedContext(runtime=runtime_for("spark", 2))
    tpch.register_tpch(ctx, sf1)
    gc.collect()
    base = _rss_bytes()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        frame = SparkDataFrame(ctx, ctx.sql(sql), spark_session).to_spark()
        frame.write.parquet(str(tmp_path / "out"))
    finally:
        stop.set()
        sampler.join()
    growth = peak[0] - base
    print(f"driver RSS grew by {growth / 2**20:.1f} MiB")
    assert growth < 200 * 2**20, f"driver RSS grew by {growth / 2**20:.0f} MiB"
    assert frame.rdd.getNumPartitions() > 1
    del frame
    check = (
        "SELECT count(*) AS n, sum(l_quantity) AS q, sum(l_extendedprice) AS p, "
        "sum(o_custkey) AS c, sum(l_orderkey) AS k FROM r"
    )
    got = SessionContext()
    got.register_parquet("r", str(tmp_path / "out"))
    single = SessionContext()
    tpch.register_tpch(single, sf1)
    single.sql(f"CREATE VIEW r AS {sql}")
    a = got.sql(check).to_pylist()[0]
    b = single.sql(check).to_pylist()[0]
    assert a["n"] == b["n"] == 6001215
    assert a == b


def test_cli_output_directory_writes_one_file_per_task(tpch_dir, oracle, tmp_path, capsys):
    from distfusion.cli import main

    out = tmp_path / "out"
    argv = ["query", JOIN, "--tpch", str(tpch_dir), "--runtime", "local", "--workers", "2"]
    argv += ["--tasks-per-stage", "2", "--output", f"{out}/"]
    assert main(argv) == 0
    expected = oracle_result(oracle, JOIN)
    assert f"wrote {expected.num_rows} rows in 2 parquet files" in capsys.readouterr().out
    assert_same_result(_read_back(out, expected), expected, False, check_types=False)
    assert main(argv) == 1  # the directory has files now: an error, nothing overwritten
    assert main([*argv, "--overwrite", "--output-format", "csv"]) == 0
    assert all(f.endswith(".csv") for f in _data_files(out))


def test_head_part_and_write_spec_round_trip_through_json(tpch_dir, tmp_path):
    from distfusion.protocol.task_plan import TaskPlan
    from distfusion.worker.head_parts import HeadPart, head_parts

    ctx = DistributedContext(runtime=_local(), config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    graph = ctx.sql(JOIN).stage_graph()
    head = graph.head
    workers = tuple(
        tuple(f"grpc://w{j}" for j in range(graph.stage(i.stage_id).num_tasks)) for i in head.inputs
    )
    parts = head_parts(TaskPlan.for_task(graph.query_id, head, 0, workers, 2), head)
    assert len(parts) == 2
    assert [HeadPart.from_json(p.to_json()) for p in parts] == parts
    spec = WriteSpec(str(tmp_path), "q" * 36, "csv", pa.schema([("a", pa.int64())]), ("a",))
    assert WriteSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="not accepted"):
        WriteSpec.from_json(WriteSpec("rel/path", "q", "csv", spec.schema).to_json())


@pytest.mark.slow
def test_to_spark_result_outlives_pysparks_idle_timeout(spark_ctx, spark_session, oracle):
    """Read 75 s after to_spark(): past PySpark's one-minute idle timeout of Python workers.

    The keep-warm jobs keep the executors' Python workers, and the outputs they
    hold, alive while the result is held.
    """
    import time

    sdf = SparkDataFrame(spark_ctx, spark_ctx.sql(GROUPED), spark_session)
    frame = sdf.to_spark()
    time.sleep(75)
    assert_same_result(frame.toArrow(), oracle_result(oracle, GROUPED), False, check_types=False)
    sdf.release()


# ------------------------------------------------------------------ object stores (issue 24)
@pytest.fixture
def s3_out(s3_server, s3_store, request) -> str:
    """A fresh ``s3://out/<test>/`` prefix on the local S3 server, its store registered."""
    from distfusion.io import object_store

    s3_server.create_bucket("out")
    object_store.register("s3://", s3_store("out"), "out")
    return f"s3://out/{request.node.name.replace('[', '-').replace(']', '')}"


def _s3_files(server, url: str) -> list[str]:
    """Keys below ``url`` relative to it (``_SUCCESS`` and ``_temporary`` included)."""
    prefix = url.removeprefix("s3://out/").rstrip("/") + "/"
    return [k[len(prefix) :] for k in server.keys("out", prefix)]


def _s3_read_back(url: str, expected: pa.Table, partition_cols=()) -> pa.Table:
    from distfusion import LocalRuntime

    reader = DistributedContext(runtime=LocalRuntime(workers=2))
    cols = [(c, expected.schema.field(c).type) for c in partition_cols]
    reader.register_parquet("r", url, table_partition_cols=cols or None)
    names = ", ".join(f'"{n}"' for n in expected.column_names)
    return reader.sql(f"SELECT {names} FROM r").to_arrow_table()


def test_write_parquet_to_s3_commits_the_files_then_a_manifest(ctx, oracle, s3_server, s3_out):
    import json

    files = ctx.sql(JOIN).write_parquet(s3_out)
    expected = oracle_result(oracle, JOIN)
    keys = _s3_files(s3_server, s3_out)
    assert not [k for k in keys if k.startswith("_temporary")]
    assert sorted(k for k in keys if k != "_SUCCESS") == sorted(f.relpath for f in files)
    assert len(files) > 1 and sum(f.rows for f in files) == expected.num_rows
    body = s3_server.client.get_object(Bucket="out", Key=f"{s3_out[9:]}/_SUCCESS")["Body"].read()
    manifest = json.loads(body)
    assert sorted(f["relpath"] for f in manifest["files"]) == sorted(f.relpath for f in files)
    assert_same_result(_s3_read_back(s3_out, expected), expected, False, check_types=False)


def test_write_parquet_to_s3_partitioned(ctx, oracle, s3_out):
    files = ctx.sql(JOIN).write_parquet(s3_out, partition_by=["l_returnflag"])
    assert {f.relpath.split("/")[0] for f in files} == {
        "l_returnflag=A",
        "l_returnflag=N",
        "l_returnflag=R",
    }
    expected = oracle_result(oracle, JOIN)
    got = _s3_read_back(s3_out, expected, ["l_returnflag"])
    assert_same_result(got, expected, False, check_types=False)


def test_s3_output_with_objects_is_an_error_unless_overwrite(s3_server, s3_out):
    ctx = DistributedContext(runtime=_local())
    ctx.register_table("t", pa.table({"a": [1, 2, 3]}))
    s3_server.client.put_object(Bucket="out", Key=f"{s3_out[9:]}/old.parquet", Body=b"x")
    with pytest.raises(OutputExistsError, match="mode='overwrite'"):
        ctx.sql("SELECT a FROM t").write_parquet(s3_out)
    assert "old.parquet" in _s3_files(s3_server, s3_out)
    ctx.sql("SELECT a FROM t").write_parquet(s3_out, mode="overwrite")
    assert "old.parquet" not in _s3_files(s3_server, s3_out)
    got = _s3_read_back(s3_out, pa.table({"a": pa.array([], pa.int64())}))
    assert sorted(got.column("a").to_pylist()) == [1, 2, 3]


def test_s3_committer_drops_failed_and_duplicate_attempts(s3_server, s3_out):
    spec = WriteSpec(s3_out, "q" * 36, "parquet", pa.schema([("a", pa.int64())]))
    committer = FileCommitter(spec)
    committer.setup_job()
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_task(spec, 0, _batches(3, fail_after=1))
    assert _s3_files(s3_server, s3_out) == []  # the failed attempt uploaded nothing
    first = write_task(spec, 0, _batches(3))
    write_task(spec, 0, _batches(3))  # a speculative attempt whose result is not used
    other = write_task(spec, 1, _batches(1))
    files = committer.commit_job([first, other])
    assert sorted(_s3_files(s3_server, s3_out)) == sorted(
        ["_SUCCESS", f"part-00000-{'q' * 8}.parquet", f"part-00001-{'q' * 8}.parquet"]
    )
    assert [f.rows for f in files] == [30, 10]


def test_s3_aborted_job_leaves_no_object(s3_server, s3_out):
    spec = WriteSpec(s3_out, "q" * 36, "parquet", pa.schema([("a", pa.int64())]))
    committer = FileCommitter(spec)
    committer.setup_job()
    write_task(spec, 0, _batches(2))
    assert _s3_files(s3_server, s3_out)  # staged below _temporary
    committer.abort_job()
    assert _s3_files(s3_server, s3_out) == []


def test_task_killed_mid_write_to_s3_on_spark_leaves_no_partial_or_duplicate_file(
    spark_ctx, oracle, fail_task, s3_server, s3_out
):
    df = spark_ctx.sql(FILTER)
    head = df.stage_graph().head
    fail_task(f"{head.stage_id}:0:always")
    with pytest.raises(TaskError, match="injected failure"):
        df.write_parquet(f"{s3_out}/failed")
    assert _s3_files(s3_server, f"{s3_out}/failed") == []
    fail_task(f"{head.stage_id}:0:1")
    files = df.write_parquet(f"{s3_out}/ok")
    keys = _s3_files(s3_server, f"{s3_out}/ok")
    assert sorted(k for k in keys if k != "_SUCCESS") == sorted(f.relpath for f in files)
    assert len(files) == 2
    expected = oracle_result(oracle, FILTER)
    assert_same_result(_s3_read_back(f"{s3_out}/ok", expected), expected, False, check_types=False)


def test_cli_reads_and_writes_s3_with_the_store_from_the_environment(
    tpch_dir, oracle, s3_server, monkeypatch, capsys
):
    from distfusion.cli import main

    s3_server.create_bucket("clienv")  # a bucket no store was registered for
    s3_server.upload_dir(tpch_dir / "orders", "clienv", "orders")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    sql = "SELECT o_orderstatus, count(*) AS n FROM orders GROUP BY 1"
    argv = ["query", sql, "--table", "orders=s3://clienv/orders", "--runtime", "local"]
    argv += ["--workers", "2", "--tasks-per-stage", "2", "--output", "s3://clienv/out"]
    assert main(argv) == 0
    assert "parquet files to s3://clienv/out" in capsys.readouterr().out
    assert "out/_SUCCESS" in s3_server.keys("clienv", "out/")
    expected = oracle_result(oracle, sql)
    assert_same_result(
        _s3_read_back("s3://clienv/out", expected), expected, False, check_types=False
    )
    assert main([*argv[:-1], "s3://clienv/one.csv"]) == 0
    assert s3_server.keys("clienv", "one.csv") == ["one.csv"]
