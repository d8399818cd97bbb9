"""Tables on an object store (a real S3-protocol server on 127.0.0.1) on every runtime.

The 22 TPC-H queries read from ``s3://`` equal single-node DataFusion reading
the same files from local disk; a file removed after registration fails the
query naming it (local disk and S3); each file's footer is read once per query
whatever the task count; bad URLs, buckets, endpoints and files fail
registration within seconds, naming what is wrong.
"""

from __future__ import annotations

import shutil
import time

import pytest

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
    from distfusion.object_store import AmazonS3

    ctx.register_object_store(
        "s3://",
        AmazonS3(bucket_name="away", endpoint="http://127.0.0.1:9", allow_http=True),
        "away",
    )
    start = time.monotonic()
    with pytest.raises(PlanningError, match="s3://away/t/"):
        ctx.register_parquet("t", "s3://away/t/")
    assert time.monotonic() - start < 30
