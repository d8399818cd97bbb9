"""Tables on an object store (a real S3-protocol server on 127.0.0.1) on every runtime.

The 22 TPC-H queries read from ``s3://`` equal single-node DataFusion reading
the same files from local disk; a file removed after registration fails the
query naming it (local disk and S3); each file's footer is read once per query
whatever the task count; bad URLs, buckets, endpoints and files fail
registration within seconds, naming what is wrong; globs on S3 (Parquet,
CSV, JSON) read the objects they match.
"""

from __future__ import annotations

import glob as glob_module
import json
import shutil
import time

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.errors import PlanningError, TaskError
from tests.compare import assert_same_result, is_ordered, oracle_result
from tests.contract.conftest import wait_idle


@pytest.fixture
def s3_ctx(runtime, workers, s3_tpch, s3_store):
    """A context of the runtime over the TPC-H tables on the local S3 server, a task per worker."""
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_object_store("s3://", s3_store(), "tpch")
    tpch.register_tpch(ctx, s3_tpch)
    return ctx


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch_from_s3(q, s3_ctx, runtime, oracle):
    sql = tpch.query(q)
    got = s3_ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=is_ordered(sql))
    wait_idle(runtime)


def test_s3_units_are_urls_and_tasks_read_them(s3_ctx, s3_tpch):
    source = s3_ctx.sources["lineitem"]
    assert source.units and all(u.path.startswith(f"{s3_tpch}/lineitem/") for u in source.units)
    assert source.num_rows > 0 and source.size_bytes > 0  # from the footers, read through S3


def test_each_footer_read_once_per_query(s3_ctx, s3_server, tpch_dir, oracle):
    """However many tasks read a table, each file's footer is fetched once per query.

    A footer read is a range request ending at the file's last byte
    (DataFusion fetches the footer with one such request).
    """
    sql = "SELECT l_returnflag, sum(l_quantity) FROM lineitem GROUP BY 1"
    s3_server.clear_requests()
    got = s3_ctx.sql(sql).to_arrow_table()
    assert_same_result(got, oracle_result(oracle, sql), ordered=False)
    tails: dict[str, int] = {}
    for r in s3_server.requests():
        cr = r.get("content_range", "")
        if r["method"] == "GET" and cr:
            span, total = cr.split()[1].split("/")
            if int(span.split("-")[1]) == int(total) - 1:
                tails[r["path"]] = tails.get(r["path"], 0) + 1
    files = [u.path for u in s3_ctx.sources["lineitem"].units]
    assert len(files) > 1
    read = {p: n for p, n in tails.items() if "/lineitem/" in p}
    assert len(read) == len(files), (read, files)  # every file was read, from its end
    assert set(read.values()) == {1}, read


def _copy_table(server, tpch_dir, table: str, prefix: str) -> str:
    server.upload_dir(tpch_dir / table, "tpch", prefix)
    return f"s3://tpch/{prefix}/"


def test_removed_s3_file_fails_the_query(runtime, workers, s3_server, s3_store, s3_tpch, tpch_dir):
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_object_store("s3://", s3_store(), "tpch")
    prefix = f"removed-{runtime.name}"
    url = _copy_table(s3_server, tpch_dir, "orders", prefix)
    ctx.register_parquet("orders", url)
    gone = ctx.sources["orders"].units[1].path
    s3_server.client.delete_object(Bucket="tpch", Key=gone.removeprefix("s3://tpch/"))
    start = time.monotonic()
    with pytest.raises(TaskError) as info:
        ctx.sql("SELECT count(*) FROM orders").to_arrow_table()
    assert time.monotonic() - start < 60
    assert gone in str(info.value) and "register it again" in str(info.value)
    wait_idle(runtime)


def test_removed_local_file_fails_the_query(runtime, workers, tpch_dir, tmp_path):
    """Issue 25: a file deleted after registration must not lose its rows silently."""
    shutil.copytree(tpch_dir / "orders", tmp_path / "orders")
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=workers))
    ctx.register_parquet("orders", tmp_path / "orders")
    gone = ctx.sources["orders"].units[2].path
    (tmp_path / "orders" / gone.rsplit("/", 1)[1]).unlink()
    with pytest.raises(TaskError) as info:
        ctx.sql("SELECT o_orderstatus, count(*) FROM orders GROUP BY 1").to_arrow_table()
    assert gone in str(info.value) and "no longer exists" in str(info.value)
    wait_idle(runtime)


def test_bad_object_store_input_fails_registration_quickly(runtime, s3_server, s3_store, s3_tpch):
    ctx = DistributedContext(runtime=runtime)
    ctx.register_object_store("s3://", s3_store(), "tpch")
    with pytest.raises(PlanningError, match="no .parquet files found at 's3://tpch/nothing/'"):
        ctx.register_parquet("t", "s3://tpch/nothing/")
    ctx.register_object_store("s3://", s3_store("no-such-bucket"), "no-such-bucket")
    with pytest.raises(PlanningError, match="s3://no-such-bucket/x/"):
        ctx.register_parquet("t", "s3://no-such-bucket/x/")
    s3_server.create_bucket("corrupt")
    s3_server.client.put_object(Bucket="corrupt", Key="t/part-0.parquet", Body=b"not parquet")
    ctx.register_object_store("s3://", s3_store("corrupt"), "corrupt")
    with pytest.raises(PlanningError, match="corrupt"):
        ctx.register_parquet("t", "s3://corrupt/t/")
    # Nothing listens on port 9 (discard): refused at once, a few quick retries.
    from distfusion.io.object_store import AmazonS3

    ctx.register_object_store(
        "s3://",
        AmazonS3(bucket_name="away", endpoint="http://127.0.0.1:9", allow_http=True),
        "away",
    )
    start = time.monotonic()
    with pytest.raises(PlanningError, match="s3://away/t/"):
        ctx.register_parquet("t", "s3://away/t/")
    assert time.monotonic() - start < 30


# ---------------------------------------------------------------------- globs
@pytest.fixture(scope="module")
def glob_files(s3_server, s3_tpch, tpch_dir, tmp_path_factory):
    """Local files and their copies below ``s3://tpch/globs/``: ``(local root, S3 root)``.

    ``orders/`` (TPC-H's four Parquet files), ``events/region=<r>/part-<i>.parquet``
    (Hive-partitioned), ``csv/`` and ``json/`` (``a-0``, ``a-1``, ``b-0``).
    """
    root = tmp_path_factory.mktemp("globs")
    shutil.copytree(tpch_dir / "orders", root / "orders")
    for r, region in enumerate(("EU", "US")):
        (root / "events" / f"region={region}").mkdir(parents=True)
        for i in range(2):
            ids = [r * 100 + i * 10 + k for k in range(5)]
            pq.write_table(
                pa.table({"id": ids}), root / "events" / f"region={region}" / f"part-{i}.parquet"
            )
    (root / "csv").mkdir()
    (root / "json").mkdir()
    for stem, n in (("a-0", 3), ("a-1", 4), ("b-0", 5)):
        rows = pa.table({"k": [f"{stem}/{i}" for i in range(n)], "v": list(range(n))})
        pa_csv.write_csv(rows, root / "csv" / f"{stem}.csv")
        text = "".join(json.dumps(r) + "\n" for r in rows.to_pylist())
        (root / "json" / f"{stem}.json").write_text(text)
    s3_server.upload_dir(root, "tpch", "globs")
    return root, "s3://tpch/globs"


GLOBS = (
    # method, glob, arguments, what single-node DataFusion reads the same rows from
    ("register_parquet", "orders/orders.[13].parquet", {}, None),
    (
        "register_parquet",
        "events/region=*/part-1.parquet",
        {"table_partition_cols": [("region", pa.string())]},
        # DataFusion lists no glob below partition directories, even on disk
        ("events", "SELECT * FROM g WHERE id % 100 >= 10"),
    ),
    ("register_csv", "csv/a-*.csv", {}, None),
    ("register_json", "json/a-?.json", {}, None),
)


@pytest.mark.parametrize(("method", "glob", "kwargs", "oracle"), GLOBS, ids=[g[1] for g in GLOBS])
def test_globs_on_s3_read_the_files_they_match(
    runtime, workers, s3_store, glob_files, method, glob, kwargs, oracle
):
    """A glob on S3 reads the objects it matches, as DataFusion reads the same glob on disk.

    Distributed on every runtime, with default settings (a small query too:
    its task reads the files) and with a task per worker; a query that can
    only run on the coordinator is refused naming the table and why.
    """
    local, remote = glob_files
    where, query = oracle or (glob, "SELECT * FROM g")
    single = SessionContext()
    getattr(single, method)("g", str(local / where), **kwargs)
    expected = single.sql(f"SELECT * FROM ({query}) ORDER BY 1").to_arrow_table()
    assert 0 < expected.num_rows
    sql = "SELECT * FROM g ORDER BY 1"
    matched = len(glob_module.glob(str(local / glob)))
    for config in (DistributedConfig(), DistributedConfig(tasks_per_stage=workers)):
        ctx = DistributedContext(runtime=runtime, config=config)
        ctx.register_object_store("s3://", s3_store(), "tpch")
        getattr(ctx, method)("g", f"{remote}/{glob}", **kwargs)
        assert len(ctx.sources["g"].units) == matched
        assert f"scan g ({matched} work units" in ctx.sql(sql).explain()
        assert_same_result(ctx.sql(sql).to_arrow_table(), expected, ordered=True)
    with pytest.raises(PlanningError, match=r"table 'g'.*glob s3://tpch/globs/"):
        ctx.sql("SELECT unnest(make_array(count(*))) AS n FROM g").to_arrow_table()
    wait_idle(runtime)


def test_a_glob_on_s3_matching_nothing_names_it(runtime, s3_store, glob_files):
    ctx = DistributedContext(runtime=runtime)
    ctx.register_object_store("s3://", s3_store(), "tpch")
    with pytest.raises(
        PlanningError, match=r"no .csv files found at 's3://tpch/globs/csv/c-\*.csv'"
    ):
        ctx.register_csv("g", "s3://tpch/globs/csv/c-*.csv")
    assert ctx.table_names() == []
