"""Iceberg tables: filter conversion, stores, registration errors, schema rules (local runtime).

The contract suite (``tests/contract/test_iceberg.py``) reads tables on every
runtime; here what needs no other runtime: which filters prune (never a file
the query's filter keeps), the store made from FileIO properties, what
registration refuses, and how files whose columns cannot be matched fail.
"""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from pyiceberg import expressions as ex
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from distfusion import DistributedContext, LocalRuntime, PlanningError, TaskError
from distfusion.io.iceberg.filters import to_iceberg_expression
from distfusion.io.iceberg.stores import store_from_properties
from distfusion.work_unit_feed.filters import And, Comparison, In, IsNull, Not, Or
from tests.iceberg_tables import (
    append_data_file,
    commit_equality_deletes,
    local_catalog,
    small_table,
)

SCHEMA = Schema(
    NestedField(1, "i", IntegerType(), required=False),
    NestedField(2, "l", LongType(), required=False),
    NestedField(3, "d", DoubleType(), required=False),
    NestedField(4, "f", FloatType(), required=False),
    NestedField(5, "s", StringType(), required=False),
    NestedField(6, "dec", DecimalType(10, 2), required=False),
    NestedField(7, "ts", TimestampType(), required=False),
    NestedField(8, "tz", TimestamptzType(), required=False),
)


def _expr(*filters):
    return to_iceberg_expression(filters, SCHEMA)


def test_filters_convert_to_pyiceberg_expressions():
    assert _expr() == ex.AlwaysTrue()
    assert _expr(Comparison("=", "s", "eu")) == ex.EqualTo("s", "eu")
    assert _expr(Comparison(">=", "l", 5), IsNull("s", negated=True)) == ex.And(
        ex.GreaterThanOrEqual("l", 5), ex.NotNull("s")
    )
    assert _expr(In("s", ("a", "b"))) == ex.In("s", {"a", "b"})
    assert _expr(Or((Comparison("<", "i", 3), Comparison(">", "i", 9)))) == ex.Or(
        ex.LessThan("i", 3), ex.GreaterThan("i", 9)
    )
    assert _expr(Not(Comparison("=", "s", "x"))) == ex.Not(ex.EqualTo("s", "x"))
    assert _expr(Comparison("=", "dec", decimal.Decimal("1.5"))) == ex.EqualTo(
        "dec", decimal.Decimal("1.50")
    )
    naive = datetime.datetime(2024, 1, 2, 3, 4, 5)
    aware = naive.replace(tzinfo=datetime.UTC)
    assert _expr(Comparison("<", "ts", naive)) == ex.LessThan("ts", naive)
    assert _expr(Comparison("<", "tz", aware)) == ex.LessThan("tz", aware)
    assert _expr(Comparison("<", "tz", naive)) == ex.LessThan("tz", naive)  # UTC, as planned


@pytest.mark.parametrize(
    "f",
    [
        Comparison("<", "i", 2.5),  # a float against an int column is not "i < 2"
        Comparison("=", "i", 2**40),  # out of int range
        Comparison("=", "s", 5),  # another kind
        Comparison(">", "d", 1.0),  # NaN sorts above every double in DataFusion
        Comparison("<", "d", 1.0),  # -NaN below
        Comparison("=", "d", float("nan")),
        Comparison("=", "f", 1.0),  # rounded to float
        In("d", (1.0, float("nan"))),
        Comparison("=", "dec", decimal.Decimal("1.234")),  # not representable at scale 2
        Comparison("<", "ts", datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)),
        Comparison("=", "missing", 1),
        Comparison("=", "s", None),
        Or((Comparison("=", "s", "a"), Comparison("=", "s", 5))),  # one branch unknown
        Not(And((Comparison("=", "s", "a"), Comparison("=", "s", 5)))),  # under NOT: exact only
    ],
)
def test_filters_that_could_skip_kept_rows_are_left_out(f):
    assert _expr(f) == ex.AlwaysTrue()


def test_an_unconvertible_conjunct_is_dropped_and_the_rest_prunes():
    got = _expr(
        And((Comparison("=", "s", "a"), Comparison(">", "d", 1.0))), Comparison("<", "i", 2.5)
    )
    assert got == ex.EqualTo("s", "a")
    assert _expr(Comparison("=", "d", 2.0), In("d", (1.0, 2.0))) == ex.And(
        ex.EqualTo("d", 2.0), ex.In("d", {1.0, 2.0})
    )


def test_store_from_fileio_properties():
    props = {
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.access-key-id": "AKIAEXAMPLE",
        "s3.secret-access-key": "very-secret-key",
        "client.region": "eu-west-1",
    }
    store = store_from_properties("s3://lake/warehouse/t", props)
    spec = dict(store.spec().arguments)
    assert spec["bucket_name"] == "lake" and spec["endpoint"] == "http://127.0.0.1:9000"
    assert spec["allow_http"] is True and spec["region"] == "eu-west-1"
    assert spec["access_key_id"] == "AKIAEXAMPLE"
    assert "very-secret-key" not in repr(store) and "very-secret-key" not in repr(store.spec())
    bare = dict(store_from_properties("s3a://other/t", {}).spec().arguments)
    assert bare["bucket_name"] == "other" and bare["allow_http"] is False
    assert bare.get("access_key_id") is None  # each worker takes its own credentials
    assert store_from_properties("file:///tmp/wh/t", props) is None
    assert store_from_properties("/tmp/wh/t", props) is None
    with pytest.raises(ValueError, match="hdfs://"):
        store_from_properties("hdfs://nn/wh/t", props)


@pytest.fixture
def catalog(tmp_path):
    return local_catalog("unit", tmp_path)


@pytest.fixture
def ctx():
    return DistributedContext(runtime=LocalRuntime(workers=2))


def test_snapshot_selection_errors(catalog, ctx):
    t = small_table(catalog, "db.t", parts=2)
    first = t.snapshots()[0]
    with pytest.raises(PlanningError, match="has no snapshot 12345"):
        ctx.register_iceberg("t", t, snapshot_id=12345)
    with pytest.raises(PlanningError, match="not both"):
        ctx.register_iceberg("t", t, snapshot_id=first.snapshot_id, as_of=first.timestamp_ms)
    with pytest.raises(PlanningError, match="no snapshot at or before"):
        ctx.register_iceberg("t", t, as_of=first.timestamp_ms - 1000)
    ctx.register_iceberg("t", t, as_of=first.timestamp_ms)
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 5}]


def test_equality_deletes_are_refused_naming_the_file(catalog, ctx):
    t = small_table(catalog, "db.eq", parts=2)
    path = commit_equality_deletes(t, 1, [3], Record("r0"))
    with pytest.raises(PlanningError, match="equality delete files") as info:
        ctx.register_iceberg("t", t)
    assert path in str(info.value) and "rather than return deleted rows" in str(info.value)


def test_corrupt_manifest_list_fails_registration_naming_it(catalog, ctx):
    t = small_table(catalog, "db.bad", parts=1)
    manifest_list = t.current_snapshot().manifest_list
    with open(manifest_list.removeprefix("file://"), "wb") as f:
        f.write(b"garbage")
    with pytest.raises(PlanningError, match="cannot read the manifest list") as info:
        ctx.register_iceberg("t", t)
    assert manifest_list in str(info.value)


def test_a_nested_rename_is_refused_naming_column_and_file(catalog, ctx):
    catalog.create_namespace_if_not_exists("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(
            2,
            "info",
            StructType(NestedField(3, "source", StringType(), required=False)),
            required=False,
        ),
    )
    t = catalog.create_table("db.nested", schema=schema)
    info = pa.struct([pa.field("source", pa.string())])
    t.append(pa.table({"id": pa.array([1], pa.int64()), "info": pa.array([{"source": "a"}], info)}))
    ctx.register_iceberg("t", t)
    assert ctx.sql("SELECT info FROM t").to_pylist() == [{"info": {"source": "a"}}]
    with t.update_schema() as u:
        u.rename_column("info.source", "origin")
    ctx.register_iceberg("t", t)
    path = next(iter(t.scan().plan_files())).file.file_path.removeprefix("file://")
    with pytest.raises(TaskError, match="column 'info' of data file") as err:
        ctx.sql("SELECT * FROM t").to_arrow_table()
    assert path in str(err.value)


def test_files_without_field_ids_need_the_tables_name_mapping(catalog, ctx):
    t = small_table(catalog, "db.mapped", parts=1)
    plain = pa.table({"region": ["r9"], "id": pa.array([99], pa.int64())})  # no field ids
    path = append_data_file(t, plain, Record("r9")).removeprefix("file://")
    ctx.register_iceberg("t", t)
    with pytest.raises(TaskError, match="has no Parquet field ids") as err:
        ctx.sql("SELECT * FROM t").to_arrow_table()
    assert path in str(err.value)
    with t.transaction() as tx:
        tx.set_properties(
            {"schema.name-mapping.default": t.schema().name_mapping.model_dump_json()}
        )
    ctx.register_iceberg("t", t)
    got = ctx.sql("SELECT id, region FROM t ORDER BY id").to_pylist()
    assert got[-1] == {"id": 99, "region": "r9"} and len(got) == 6
    assert t.scan().to_arrow().num_rows == 6
