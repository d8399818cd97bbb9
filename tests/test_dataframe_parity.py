"""Parity with ``datafusion.DataFrame`` 55 (issue 41, item 6).

Every public method of DataFusion's DataFrame has a DistributedDataFrame
counterpart (as datafusion-python's ``tests/test_wrapper_coverage.py`` checks
its wrappers), called the same way, or a reason in :data:`NOT_OFFERED`; the
methods added for parity answer as single-node DataFusion does on the same
TPC-H SF0.1 files (the oracle), run on the local runtime with three tasks per
stage so that every query is cut into stages.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import inspect
import json
import sys

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import DataFrame, ParquetWriterOptions, SessionContext, col, lit
from datafusion import functions as F

from distfusion import DistributedConfig, DistributedContext, DistributedDataFrame, tpch
from distfusion.errors import PlanningError
from tests.compare import assert_same_result

WORKERS = 3

NOT_OFFERED: dict[str, str] = {}
"""DataFusion DataFrame methods without a counterpart, with the reason (none left)."""

CALLED_OTHERWISE = {
    "explain": "returns the distributed plan as text; no show_statistics / analyze_level "
    "/ analyze_categories (DataFusion's operator metrics are per task: explain(analyze=True))",
    "write_csv": "(path, mode): one file per task with a header, committed; no DataFusion "
    "write options",
    "write_json": "(path, mode): one file per task, committed; no DataFusion write options",
    "write_parquet": "(path, partition_by, mode): one file per task, committed; options of "
    "DataFusion's writer: write_parquet_with_options",
}
"""Counterparts whose arguments are not DataFusion's (each listed in docs/dataframe.md)."""

PROTOCOLS = ("__getitem__", "__arrow_c_stream__", "__iter__", "__aiter__", "__repr__")


def _public(cls) -> list[str]:
    return [n for n in dir(cls) if not n.startswith("_")] + list(PROTOCOLS) + ["_repr_html_"]


def _parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.fixture(scope="module")
def ctx(runtime_for, tpch_dir):
    context = DistributedContext(
        runtime=runtime_for("local", WORKERS), config=DistributedConfig(tasks_per_stage=WORKERS)
    )
    tpch.register_tpch(context, tpch_dir)
    return context


# ------------------------------------------------------------------ coverage
def test_every_datafusion_method_has_a_counterpart():
    missing = [
        name
        for name in _public(DataFrame)
        if name not in NOT_OFFERED and not callable(getattr(DistributedDataFrame, name, None))
    ]
    assert missing == [], f"no counterpart and no reason in NOT_OFFERED: {missing}"
    stale = [name for name in NOT_OFFERED if hasattr(DistributedDataFrame, name)]
    assert stale == [], f"offered now, remove from NOT_OFFERED: {stale}"


def test_counterparts_take_datafusions_arguments():
    """A call written for DataFusion's method is a call of ours (extra arguments come after)."""
    differ = []
    for name in _public(DataFrame):
        ours = getattr(DistributedDataFrame, name, None)
        if ours is None:
            continue
        theirs = _parameters(getattr(DataFrame, name))
        if _parameters(ours)[: len(theirs)] != theirs:
            differ.append(name)
    assert sorted(differ) == sorted(CALLED_OTHERWISE)


def test_docs_list_what_runs_otherwise():
    from tests.conftest import REPO

    doc = (REPO / "docs" / "dataframe.md").read_text()
    for name in [*CALLED_OTHERWISE, "write_parquet_with_options", "write_table", "execution_plan"]:
        assert f"`{name}(" in doc, name


# ------------------------------------------------------------------ schemas
NOT_NULL_QUERIES = [
    "SELECT o_orderkey, o_custkey FROM orders WHERE o_totalprice > 1000 "
    "ORDER BY o_orderkey LIMIT 5",
    "SELECT c_name, sum(o_totalprice) s, count(*) n FROM orders JOIN customer "
    "ON o_custkey = c_custkey GROUP BY c_name",
    "SELECT o_orderkey, CAST(o_orderkey AS INT) k FROM orders",
]


@pytest.mark.parametrize("query", NOT_NULL_QUERIES)
def test_results_keep_the_plans_not_null(ctx, oracle, query):
    df = ctx.sql(query)
    assert df.coordinator_only() is None and df.runs_in_place() is None
    expected = oracle.sql(query).to_arrow_table().schema
    assert any(not f.nullable for f in expected)
    assert df.to_arrow_table().schema.equals(expected)
    assert pa.Table.from_batches(df.collect()).schema.equals(expected)


# ------------------------------------------------------------------ results
ORDERED = "SELECT n_nationkey, n_name, n_regionkey FROM nation ORDER BY n_nationkey"


def test_execute_stream_yields_datafusions_record_batches(ctx, oracle):
    ours = ctx.sql(ORDERED).execute_stream()
    theirs = oracle.sql(ORDERED).execute_stream()
    assert isinstance(ours, datafusion.RecordBatchStream)
    first = ours.next()
    assert isinstance(first, datafusion.RecordBatch)
    assert isinstance(theirs.next(), datafusion.RecordBatch)
    batches = [first.to_pyarrow()] + [b.to_pyarrow() for b in ours]
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    got = pa.Table.from_batches(batches)
    assert got.equals(oracle.sql(ORDERED).to_arrow_table())
    assert pa.record_batch(first).equals(first.to_pyarrow())  # __arrow_c_array__
    assert first.num_rows == len(first) == first.to_pyarrow().num_rows


def test_iteration_sync_and_async(ctx, oracle):
    df = ctx.sql(ORDERED)
    expected = oracle.sql(ORDERED).to_arrow_table()
    assert pa.Table.from_batches([b.to_pyarrow() for b in df]).equals(expected)

    async def read() -> list[pa.RecordBatch]:
        return [b.to_pyarrow() async for b in df]

    assert pa.Table.from_batches(asyncio.run(read())).equals(expected)


def test_arrow_c_stream(ctx, oracle):
    query = "SELECT o_orderkey, o_totalprice FROM orders WHERE o_orderkey < 1000"
    expected = pa.table(oracle.sql(query))
    got = pa.table(ctx.sql(query))
    assert got.schema.equals(expected.schema)
    assert_same_result(got, expected, ordered=False)
    reader = pa.RecordBatchReader.from_stream(ctx.sql(query), schema=expected.schema)
    assert reader.read_all().num_rows == expected.num_rows
    empty = "SELECT n_name FROM nation WHERE n_nationkey < 0"
    assert pa.table(ctx.sql(empty)).schema.equals(pa.table(oracle.sql(empty)).schema)


@pytest.mark.parametrize(
    "query",
    [
        ORDERED,  # 25 rows: the first 10, then "Data truncated."
        "SELECT r_regionkey, r_name FROM region ORDER BY r_regionkey",
        "SELECT n_name FROM nation WHERE n_nationkey < 0",
    ],
)
def test_repr_shows_data_as_datafusion(ctx, oracle, query):
    assert repr(ctx.sql(query)) == repr(oracle.sql(query))


def test_default_str_repr_is_datafusions(ctx, oracle):
    batches = oracle.sql(ORDERED).collect()
    schema = batches[0].schema
    assert DistributedDataFrame.default_str_repr(
        batches, schema, True, "u"
    ) == DataFrame.default_str_repr(batches, schema, True, "u")


def test_collect_column_and_partitions(ctx, oracle):
    got = ctx.sql(ORDERED).collect_column("n_name")
    expected = oracle.sql(ORDERED).collect_column("n_name")
    assert isinstance(got, pa.Array) and got.equals(expected)
    with pytest.raises(PlanningError, match="collect_column"):
        ctx.table("nation").collect_column("nope")
    (part,) = ctx.sql(ORDERED).collect_partitioned()
    assert pa.Table.from_batches(part).equals(oracle.sql(ORDERED).to_arrow_table())
    (stream,) = ctx.sql(ORDERED).execute_stream_partitioned()
    got = pa.Table.from_batches([b.to_pyarrow() for b in stream])
    assert got.equals(oracle.sql(ORDERED).to_arrow_table())


def test_to_polars_without_polars_names_the_package(ctx, monkeypatch):
    monkeypatch.setitem(sys.modules, "polars", None)  # as when it is not installed
    with pytest.raises(ImportError, match="pip install polars"):
        ctx.table("nation").to_polars()


def test_to_polars_with_polars(ctx, oracle):
    pl = pytest.importorskip("polars")
    got = ctx.sql(ORDERED).to_polars()
    assert isinstance(got, pl.DataFrame)
    assert got.to_arrow().to_pydict() == oracle.sql(ORDERED).to_polars().to_arrow().to_pydict()


# ------------------------------------------------------------------ describe
def test_describe_tpch_table(ctx, oracle):
    got = ctx.table("customer").describe()
    assert isinstance(got, DistributedDataFrame)
    expected = oracle.table("customer").describe().to_arrow_table()
    table = got.to_arrow_table()
    assert table.schema.equals(expected.schema)
    assert_same_result(table, expected, ordered=True)


def test_describe_every_kind_of_column(ctx):
    data = pa.table(
        {
            "i": pa.array([1, 2, None], pa.int32()),
            "s": ["a", None, "c"],
            "flag": [True, False, None],
            "day": [datetime.date(2020, 1, 1), None, datetime.date(2021, 5, 6)],
            "at": pa.array([datetime.datetime(2020, 1, 1, 1, 2, 3)] * 3, pa.timestamp("us")),
            "price": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("3.25")]),
            "Odd.Name": [1.5, None, 2.5],
            "nothing": pa.nulls(3),
        }
    )
    got = ctx.from_arrow(data).describe().to_arrow_table()
    expected = SessionContext().from_arrow(data).describe().to_arrow_table()
    assert got.schema.equals(expected.schema)
    assert_same_result(got, expected, ordered=True)


# ------------------------------------------------------------------ partitioning
def test_repartition_keeps_the_query_distributed(ctx, oracle):
    def build(c, by_hash: bool):
        orders = c.table("orders")
        orders = (
            orders.repartition_by_hash(col("o_custkey"), num=4)
            if by_hash
            else orders.repartition(4)
        )
        return orders.aggregate([col("o_custkey")], [F.count_star().alias("n")])

    for by_hash in (False, True):
        df = build(ctx, by_hash)
        plan = df.explain()
        assert "Repartition" not in plan and "shuffle" in plan, plan
        expected = build(oracle, by_hash).to_arrow_table()
        assert_same_result(df.to_arrow_table(), expected, ordered=False)
    with pytest.raises(PlanningError, match="repartition_by_hash"):
        ctx.table("orders").repartition_by_hash(col("nope"), num=2)


# ------------------------------------------------------------------ plans and views
def test_plan_accessors_are_datafusions(ctx):
    df = ctx.table("nation").filter(col("n_regionkey") == lit(1))
    assert isinstance(df.logical_plan(), datafusion.LogicalPlan)
    assert df.logical_plan().display_indent() == df.df.logical_plan().display_indent()
    assert (
        df.optimized_logical_plan().display_indent()
        == df.df.optimized_logical_plan().display_indent()
    )
    assert isinstance(df.execution_plan(), datafusion.ExecutionPlan)


def test_into_view_and_register_view_are_distributed(ctx, oracle):
    def view(c):
        return c.table("lineitem").filter(col("l_quantity") > lit(45))

    query = "SELECT l_returnflag, count(*) AS n FROM {} GROUP BY l_returnflag"
    ctx.register_table("big_lines", view(ctx).into_view())
    ctx.register_view("big_lines_2", view(ctx))
    oracle.register_table("big_lines_oracle", view(oracle).into_view())
    try:
        expected = oracle.sql(query.format("big_lines_oracle")).to_arrow_table()
        for name in ("big_lines", "big_lines_2"):
            df = ctx.sql(query.format(name))
            assert df.coordinator_only() is None and "shuffle" in df.explain()
            assert_same_result(df.to_arrow_table(), expected, ordered=False)
    finally:
        oracle.deregister_table("big_lines_oracle")
        ctx.deregister_table("big_lines")
        ctx.deregister_table("big_lines_2")


# ------------------------------------------------------------------ writes and reads
def test_write_json_then_read_json(ctx, oracle, tmp_path):
    query = "SELECT o_orderkey, o_orderdate, o_totalprice, o_comment FROM orders"
    written = ctx.sql(query).write_json(tmp_path / "out")
    assert written and all(f.relpath.endswith(".json") for f in written)
    expected = oracle.sql(query).to_arrow_table()
    back = SessionContext().read_json(str(tmp_path / "out"))
    assert back.count() == expected.num_rows
    # Each line as DataFusion's write_json writes it.
    oracle.sql(query).write_json(str(tmp_path / "theirs.json"))
    theirs = sorted((tmp_path / "theirs.json").read_text().splitlines())
    ours = sorted(
        line for f in written for line in (tmp_path / "out" / f.relpath).read_text().splitlines()
    )
    assert ours == theirs
    assert json.loads(ours[0])["o_orderkey"] > 0
    got = ctx.read_json(tmp_path / "out")
    assert isinstance(got, DistributedDataFrame)
    assert f"{len(written)} work units" in got.explain()
    assert_same_result(
        got.to_arrow_table(),
        SessionContext().read_json(str(tmp_path / "out")).to_arrow_table(),
        ordered=False,
    )


def test_read_json_refuses_options_it_does_not_apply(ctx, tmp_path):
    with pytest.raises(ValueError, match="file_compression_type"):
        ctx.read_json(tmp_path, file_compression_type="gzip")


def test_write_table_inserts_into_a_memory_table(ctx, oracle):
    ctx.from_pydict({"k": [-1], "name": ["none"]}, name="nations_copy")
    try:
        ctx.table("nation").select(
            col("n_nationkey").alias("k"), col("n_name").alias("name")
        ).write_table("nations_copy")
        got = ctx.sql("SELECT count(*) AS n, sum(k) AS s FROM nations_copy").to_pydict()
        assert got == {"n": [26], "s": [sum(range(25)) - 1]}
    finally:
        ctx.deregister_table("nations_copy")
    with pytest.raises(PlanningError, match="read from parquet files"):
        ctx.table("nation").write_table("region")
    with pytest.raises(ValueError, match="write_options"):
        ctx.table("nation").write_table("region", write_options=datafusion.DataFrameWriteOptions())


def test_write_parquet_with_options_applies_them(ctx, oracle, tmp_path):
    path = tmp_path / "nation.parquet"
    ctx.sql(ORDERED).write_parquet_with_options(
        path, ParquetWriterOptions(compression="snappy", max_row_group_size=10)
    )
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 3
    assert meta.row_group(0).column(0).compression == "SNAPPY"
    assert pq.read_table(path).to_pydict() == oracle.sql(ORDERED).to_pydict()
