"""Delta sources without a runtime: file skipping's logic, a unit's file read, storage options.

The tables on every runtime are in tests/contract/test_delta.py; here the
pieces they rest on, on their own: :func:`might_match` over statistics,
:class:`FileRead`'s encoding, the URL DataFusion is given for a key with
``%``, delta-rs's storage options to and from distfusion's stores, and the
source delta-rs's log describes (units, statistics, partition values of
every type, refusals).
"""

from __future__ import annotations

import datetime
import decimal
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.table import ProtocolVersions

from distfusion import DistributedContext, LocalRuntime
from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.sources import FileRead, file_read
from distfusion.protocol.task_plan import TaskPlan
from distfusion.work_unit_feed.filters import And, Comparison, In, IsNull, Not, Or
from distfusion.work_unit_feed.statistics import might_match

UTC = datetime.UTC


# ---------------------------------------------------------------------- might_match
STATS = {
    "x": (10, 20, 0),
    "s": ("apple", "melon", 2),
    "t": (
        datetime.datetime(2024, 1, 1, tzinfo=UTC),
        datetime.datetime(2024, 1, 31, tzinfo=UTC),
        None,
    ),
    "d": (datetime.date(2024, 1, 1), datetime.date(2024, 1, 31), 0),
    "m": (decimal.Decimal("1.50"), decimal.Decimal("9.25"), 0),
    "n": (None, None, 5),  # only NULLs (5 rows)
    "c": (7, 7, 0),  # one value
}


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (Comparison("=", "x", 15), True),
        (Comparison("=", "x", 21), False),
        (Comparison("=", "x", 9), False),
        (Comparison("<", "x", 10), False),
        (Comparison("<=", "x", 10), True),
        (Comparison(">", "x", 20), False),
        (Comparison(">=", "x", 20), True),
        (Comparison(">", "x", 19.5), True),  # an int column against a float literal
        (Comparison("!=", "x", 15), True),
        (Comparison("!=", "c", 7), False),  # every value is 7
        (Comparison("=", "s", "zebra"), False),
        (Comparison("<", "s", "apple"), False),
        (Comparison("=", "s", "banana"), True),
        (Comparison(">", "t", datetime.datetime(2024, 2, 1)), False),  # naive means UTC
        (Comparison("<", "t", datetime.datetime(2024, 1, 2)), True),
        (Comparison("=", "d", datetime.date(2024, 2, 1)), False),
        (Comparison("=", "d", datetime.datetime(2024, 1, 5)), True),  # unordered types: undecided
        (Comparison(">", "m", decimal.Decimal("9.25")), False),
        (Comparison("=", "n", 1), False),  # only NULLs: no comparison is true
        (Comparison("=", "unknown", 1), True),  # no statistics: might
        (In("x", (1, 2, 3)), False),
        (In("x", (1, 12)), True),
        (Not(In("c", (7, 8))), False),
        (Not(In("x", (7, 8))), True),
        (IsNull("x"), False),  # null count 0
        (IsNull("s"), True),
        (IsNull("t"), True),  # unknown null count
        (IsNull("n", negated=True), False),  # with the row count: only NULLs
        (IsNull("x", negated=True), True),
        (Not(IsNull("x")), True),
        (Not(IsNull("n")), False),
        (Not(Comparison("<", "x", 30)), False),  # NOT (x < 30) is x >= 30
        (Not(Comparison(">", "x", 15)), True),
        (And((Comparison(">", "x", 12), Comparison("<", "x", 11))), True),  # bounds only
        (And((Comparison(">", "x", 12), Comparison("=", "s", "zebra"))), False),
        (Or((Comparison(">", "x", 30), Comparison("=", "s", "zebra"))), False),
        (Or((Comparison(">", "x", 30), Comparison("=", "s", "kiwi"))), True),
        (Not(And((Comparison(">=", "x", 10), Comparison("<=", "x", 20)))), False),
        (Not(Or((Comparison(">", "x", 30), Comparison("=", "c", 7)))), False),  # c is 7
        (Not(Or((Comparison(">", "x", 30), Comparison("=", "c", 8)))), True),
    ],
)
def test_might_match(f, expected):
    assert might_match((f,), STATS, num_rows=5) is expected


def test_might_match_without_statistics_or_filters():
    assert might_match((Comparison("=", "x", 1),), None)
    assert might_match((Comparison("=", "x", 1),), {})
    assert might_match((), STATS)
    # a conjunction: every predicate must be possible
    assert not might_match((Comparison(">", "x", 12), Comparison("=", "x", 99)), STATS)
    # without the row count, a column of NULLs only is not known to be one
    assert might_match((IsNull("n", negated=True),), STATS)


# ---------------------------------------------------------------------- units
def test_file_read_round_trip():
    keep = pa.array([True, False, True] * 1000 + [False], pa.bool_())
    read = FileRead({"a": "col-1", "b": None}, keep)
    back = FileRead.from_bytes(read.to_bytes())
    assert back.columns == {"a": "col-1", "b": None}
    assert back.keep.equals(keep)
    assert len(read.to_bytes()) < 200  # a bitmap, compressed
    assert FileRead.from_bytes(b"") == FileRead()
    with pytest.raises(ValueError, match="not a serialised FileRead"):
        FileRead.from_bytes(b'{"keep": 3}')


def test_datafusion_url_keeps_percent_in_keys():
    url = "s3://lake/t/ts=2024-01-01%2010%3A00%3A00/part-0.parquet"
    assert object_store.datafusion_url(url) == (
        "s3://lake/t/ts%3D2024-01-01%252010%253A00%253A00/part-0.parquet"
    )
    assert object_store.datafusion_url("/data/a b%20/x.parquet") == "/data/a b%20/x.parquet"


# ---------------------------------------------------------------------- storage options
def test_storage_options_from_a_registered_store():
    store = object_store.AmazonS3(
        bucket_name="opts-a",
        region="eu-west-1",
        endpoint="http://127.0.0.1:1234",
        allow_http=True,
        access_key_id="AKIDEXAMPLE",
        secret_access_key="SECRETEXAMPLE",
    )
    object_store.register("s3://", store, "opts-a")
    try:
        options = delta.storage_options_for("s3://opts-a/t")
    finally:  # a store with keys: Flight workers without a token would refuse every store
        object_store.deregister("s3://", "opts-a")
    assert options["AWS_REGION"] == "eu-west-1"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:1234"
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_SECRET_ACCESS_KEY"] == "SECRETEXAMPLE"
    assert options["max_retries"] == "3"


def test_store_from_storage_options():
    store = delta.store_from_options(
        "s3://opts-b/t",
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:1234",
            "aws_region": "us-east-1",
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "SECRETEXAMPLE",
        },
    )
    assert store.arguments["bucket_name"] == "opts-b"
    assert store.arguments["allow_http"] is True  # an http:// endpoint
    assert store.arguments["region"] == "us-east-1"
    assert "SECRETEXAMPLE" not in repr(store) and "SECRETEXAMPLE" in store.spec().secrets()
    azure = delta.store_from_options(
        "abfss://box@acct.dfs.core.windows.net/t", {"azure_storage_sas_key": "?sv=1&sig=abc"}
    )
    assert azure.arguments["container_name"] == "box"
    assert azure.arguments["account"] == "acct"
    assert azure.arguments["sas_query_pairs"] == [("sv", "1"), ("sig", "abc")]


def test_load_errors_hide_secrets_and_backtraces(tmp_path):
    with pytest.raises(PlanningError) as info:
        delta.load_delta(
            "t",
            "s3://away/t",
            storage_options={
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "AKIDHIDDEN",
                "AWS_SECRET_ACCESS_KEY": "VERYSECRETVALUE",
            },
        )
    text = str(info.value)
    assert "s3://away/t" in text and "VERYSECRETVALUE" not in text
    assert "\x1b[" not in text and "\n" not in text


def test_a_time_before_the_table_is_refused_not_read_as_its_first_version(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2]}))
    write_deltalake(path, pa.table({"id": [3]}), mode="append")
    ctx = DistributedContext(runtime=LocalRuntime())
    with pytest.raises(PlanningError, match="nothing at .* as of 2024-02-01.*earliest version"):
        ctx.register_delta("old", path, timestamp="2024-02-01T00:00:00Z")
    now = datetime.datetime.now(datetime.UTC)
    ctx.register_delta("now", path, timestamp=now)
    assert ctx.sql("SELECT count(*) AS n FROM now").to_pylist() == [{"n": 3}]


# ---------------------------------------------------------------------- the source
def test_partition_values_of_every_type_come_from_the_log(tmp_path):
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "s": ["a b", "c/d%e", None],
            "d": pa.array([datetime.date(2024, 1, 1), None, datetime.date(2024, 1, 3)]),
            "i": pa.array([1, None, 3], pa.int32()),
            "ts": pa.array(
                [
                    datetime.datetime(2024, 1, 1, 10, 0, 0, 123456),
                    None,
                    datetime.datetime(2024, 1, 3),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "m": pa.array(
                [decimal.Decimal("1.25"), decimal.Decimal("3.50"), None], pa.decimal128(10, 2)
            ),
            "b": [True, False, None],
        }
    )
    path = str(tmp_path / "t")
    write_deltalake(path, rows, partition_by=["s", "d", "i", "ts", "m", "b"])
    ctx = DistributedContext(runtime=LocalRuntime())
    ctx.register_delta("t", path)
    source = ctx.sources["t"]
    assert source.options["partition_cols"] == ["s", "d", "i", "ts", "m", "b"]
    by_id = {source.unit_stats[u.path]["id"][0]: u for u in source.units}  # one row each
    assert by_id[3].partition_values[0] is None  # NULL, not __HIVE_DEFAULT_PARTITION__
    got = ctx.sql("SELECT * FROM t ORDER BY id").to_arrow_table()
    expected = DeltaTable(path).to_pyarrow_table().sort_by("id")
    assert got.cast(expected.schema).to_pylist() == expected.to_pylist()
    # statistics: a partition column's bounds are its value
    assert source.unit_stats[by_id[2].path]["i"] == (None, None, 1)
    assert source.unit_stats[by_id[1].path]["s"] == ("a b", "a b", 0)


def test_refusals(tmp_path):
    path = str(tmp_path / "nested")
    rows = pa.table({"id": [1], "st": pa.array([{"a": 1}])})
    DeltaTable.create(path, rows.schema, configuration={"delta.columnMapping.mode": "name"})
    write_deltalake(path, rows, mode="append")
    ctx = DistributedContext(runtime=LocalRuntime())
    with pytest.raises(PlanningError, match="column mapping.*'st' holds a struct"):
        ctx.register_delta("nested", path)
    assert "nested" not in ctx.table_names()
    protocol = ProtocolVersions(3, 7, ["catalogManaged"], ["catalogManaged", "deletionVectors"])
    with pytest.raises(PlanningError, match="reader feature.*catalogManaged"):
        delta._check_protocol("t", "/x", protocol)
    with pytest.raises(PlanningError, match="reader version 4"):
        delta._check_protocol("t", "/x", ProtocolVersions(4, 7, None, None))


def test_file_read_of_a_unit(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2]}))
    ctx = DistributedContext(runtime=LocalRuntime())
    ctx.register_delta("t", path)
    (unit,) = ctx.sources["t"].units
    assert unit.num_rows == 2 and unit.path.startswith(str(tmp_path))
    assert file_read(unit) == FileRead()  # a plain file


def test_the_docs_example_runs(tmp_path):
    """docs/delta.md's example (a table on a local S3 server) runs as written."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "delta.md").read_text()
    script = tmp_path / "example.py"
    script.write_text(re.findall(r"```python\n(.*?)```", text, re.S)[-1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 of 6 work units" in done.stdout and "[{'n': 100, 's': 5000}]" in done.stdout


def test_explicit_keys_stay_out_of_plans_and_explain(s3_server):
    """Keys given in storage_options reach the store, never a plan, explain() or an error."""
    s3_server.create_bucket("delta-keys")
    keys = {"AWS_ACCESS_KEY_ID": "AKIDDELTAKEYS", "AWS_SECRET_ACCESS_KEY": "DeltaSecretValue"}
    options = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true", **keys}
    write_deltalake("s3://delta-keys/t", pa.table({"id": [1, 2, 3]}), storage_options=options)
    ctx = DistributedContext(runtime=LocalRuntime())
    try:
        _query_with_keys(ctx, options)
    finally:  # a store with keys: Flight workers without a token would refuse every store
        object_store.deregister("s3://", "delta-keys")


def _query_with_keys(ctx, options: dict) -> None:
    ctx.register_delta("t", "s3://delta-keys/t", storage_options=options)
    assert "DeltaSecretValue" in object_store.registered()["s3://delta-keys"].secrets()
    df = ctx.sql("SELECT sum(id) AS s FROM t")
    assert df.to_pylist() == [{"s": 6}]
    graph = df.stage_graph()
    plans = [TaskPlan.for_task("q", s, 0, (), 1).to_json() for s in graph.stages]
    texts = [df.explain(), df.explain(analyze=True, verbose=True), str(plans)]
    for text in texts:
        assert "DeltaSecretValue" not in text and "AKIDDELTAKEYS" not in text
    with pytest.raises(PlanningError) as info:
        ctx.register_delta("v", "s3://delta-keys/t", version=9, storage_options=options)
    assert "DeltaSecretValue" not in str(info.value)
