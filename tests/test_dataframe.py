"""The DataFrame API: every transformation, distributed, equals DataFusion's own DataFrame.

Each case builds a query with one function of a context, run once on a
DistributedContext (local runtime, three workers, three tasks per stage, so
that every stage is cut into tasks) and once on the plain DataFusion
``SessionContext`` over the same TPC-H SF0.1 files. The readers
(``read_parquet``, ``read_csv``, ``from_arrow``, ``from_pydict``,
``from_pylist``), ``from_datafusion`` and its refusals, and the errors of bad
input are tested after them.
"""

from __future__ import annotations

import datetime
import re
import warnings

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from datafusion import SessionContext, col, lit
from datafusion import functions as F
from datafusion.expr import Window

from distfusion import DistributedConfig, DistributedContext, DistributedDataFrame, tpch
from distfusion.errors import PlanningError
from tests.compare import assert_same_result
from tests.conftest import REPO

WORKERS = 3


@pytest.fixture(scope="module")
def ctx(runtime_for, tpch_dir):
    context = DistributedContext(
        runtime=runtime_for("local", WORKERS), config=DistributedConfig(tasks_per_stage=WORKERS)
    )
    tpch.register_tpch(context, tpch_dir)
    return context


def _orders_since(c, day: int):
    return c.table("orders").filter(col("o_orderdate") >= lit(datetime.date(1998, 7, day)))


# name -> (build(context) -> DataFrame, whether the result is ordered). Every
# transformation of the list appears as a key (checked below).
CASES = {
    "select": (
        lambda c: c.table("nation").select("n_name", (col("n_regionkey") * lit(10)).alias("r10")),
        False,
    ),
    "select_exprs": (
        lambda c: c.table("nation").select_exprs("n_name", "n_nationkey + 1 AS next_key"),
        False,
    ),
    "filter": (
        lambda c: c.table("lineitem").filter(col("l_quantity") > lit(45), "l_shipmode = 'AIR'"),
        False,
    ),
    "with_column": (
        lambda c: (
            c.table("orders")
            .select("o_orderkey", "o_orderdate")
            .with_column("o_year", F.date_part(lit("year"), col("o_orderdate")))
        ),
        False,
    ),
    "with_columns": (
        lambda c: c.table("nation").with_columns(
            (col("n_nationkey") * lit(2)).alias("twice"),
            [F.upper(col("n_name")).alias("upper_name")],
            half="n_nationkey / 2",
        ),
        False,
    ),
    "aggregate": (
        lambda c: c.table("lineitem").aggregate(
            [col("l_returnflag"), col("l_linestatus")],
            [
                F.sum(col("l_quantity")).alias("qty"),
                F.avg(col("l_discount")).alias("disc"),
                F.count(col("l_orderkey")).alias("n"),
                F.count(col("l_suppkey"), distinct=True).alias("suppliers"),
            ],
        ),
        False,
    ),
    "aggregate without keys": (
        lambda c: c.table("orders").aggregate(
            None, [F.max(col("o_totalprice")).alias("top"), F.min(col("o_orderdate")).alias("d")]
        ),
        False,
    ),
    "join": (
        lambda c: (
            c.table("customer")
            .select("c_custkey", "c_name")
            .join(_orders_since(c, 1), left_on="c_custkey", right_on="o_custkey", how="left")
        ),
        False,
    ),
    "join on a shared name": (
        lambda c: (
            c.table("nation")
            .with_column_renamed("n_regionkey", "regionkey")
            .join(c.table("region").with_column_renamed("r_regionkey", "regionkey"), on="regionkey")
        ),
        False,
    ),
    "join keeping both keys": (
        lambda c: (
            c.table("nation")
            .with_column_renamed("n_regionkey", "regionkey")
            .filter(col("n_nationkey") < lit(12))
            .join(
                c.table("region").with_column_renamed("r_regionkey", "regionkey"),
                on="regionkey",
                how="full",
                coalesce_duplicate_keys=False,
            )
        ),
        False,
    ),
    "join anti": (
        lambda c: c.table("customer").join(
            c.table("orders"), left_on="c_custkey", right_on="o_custkey", how="anti"
        ),
        False,
    ),
    "join full": (
        lambda c: (
            c.table("supplier")
            .filter(col("s_nationkey") < lit(5))
            .join(
                c.table("nation").filter(col("n_nationkey") > lit(2)),
                left_on="s_nationkey",
                right_on="n_nationkey",
                how="full",
            )
        ),
        False,
    ),
    "join_on": (
        lambda c: (
            _orders_since(c, 1)
            .join_on(
                c.table("lineitem"),
                col("o_orderkey") == col("l_orderkey"),
                col("l_extendedprice") * lit(5) > col("o_totalprice"),
            )
            .select("o_orderkey", "l_linenumber", "l_extendedprice", "o_totalprice")
        ),
        False,
    ),
    "sort": (
        lambda c: c.table("orders").sort(
            col("o_totalprice").sort(ascending=False), col("o_orderkey").sort()
        ),
        True,
    ),
    "sort_by": (lambda c: c.table("supplier").sort_by("s_nationkey", "s_suppkey"), True),
    "limit": (lambda c: c.table("customer").sort("c_custkey").limit(10, offset=5), True),
    "head": (lambda c: c.table("orders").sort("o_orderkey").head(7), True),
    "distinct": (
        lambda c: c.table("lineitem").select("l_shipmode", "l_returnflag").distinct(),
        False,
    ),
    "distinct_on": (
        lambda c: c.table("orders").distinct_on(
            [col("o_orderpriority")],
            [col("o_orderpriority"), col("o_orderkey")],
            [col("o_orderpriority").sort(), col("o_totalprice").sort(ascending=False)],
        ),
        False,
    ),
    "union": (
        lambda c: (
            c.table("nation").select("n_regionkey").union(c.table("region").select("r_regionkey"))
        ),
        False,
    ),
    "union distinct=True": (
        lambda c: (
            c.table("nation")
            .select("n_regionkey")
            .union(c.table("region").select("r_regionkey"), distinct=True)
        ),
        False,
    ),
    "union_distinct": (
        lambda c: (
            c.table("nation")
            .select("n_regionkey")
            .union_distinct(c.table("region").select("r_regionkey"))
        ),
        False,
    ),
    "union_by_name": (
        lambda c: (
            c.table("nation")
            .select(col("n_name").alias("name"), col("n_nationkey").alias("key"))
            .union_by_name(
                c.table("region").select(
                    col("r_regionkey").alias("key"), col("r_name").alias("name")
                )
            )
        ),
        False,
    ),
    "intersect": (
        lambda c: (
            _orders_since(c, 1)
            .select("o_custkey")
            .intersect(_orders_since(c, 20).select("o_custkey"))
        ),
        False,
    ),
    "intersect distinct=True": (
        lambda c: (
            _orders_since(c, 1)
            .select("o_custkey")
            .intersect(_orders_since(c, 20).select("o_custkey"), distinct=True)
        ),
        False,
    ),
    "except_all": (
        lambda c: (
            _orders_since(c, 1)
            .select("o_custkey")
            .except_all(_orders_since(c, 20).select("o_custkey"))
        ),
        False,
    ),
    "except_all distinct=True": (
        lambda c: (
            _orders_since(c, 1)
            .select("o_custkey")
            .except_all(_orders_since(c, 20).select("o_custkey"), distinct=True)
        ),
        False,
    ),
    "drop": (lambda c: c.table("customer").drop("c_comment", "c_address"), False),
    "with_column_renamed": (
        lambda c: c.table("region").with_column_renamed("r_name", "region_name"),
        False,
    ),
    "cast": (
        lambda c: c.table("part").cast({"p_size": pa.float64(), "p_retailprice": pa.float64()}),
        False,
    ),
    "fill_null": (
        lambda c: (
            c.table("supplier")
            .join(
                c.table("nation").filter(col("n_nationkey") < lit(3)),
                left_on="s_nationkey",
                right_on="n_nationkey",
                how="left",
            )
            .select("s_suppkey", "n_name")
            .fill_null("none")
        ),
        False,
    ),
    "fill_nan": (
        lambda c: (
            c.table("nation")
            .select(
                "n_nationkey",
                F.when(col("n_regionkey") == lit(1), lit(float("nan")))
                .otherwise(col("n_regionkey").cast(pa.float64()))
                .alias("x"),
            )
            .fill_nan(-1.0)
        ),
        False,
    ),
    "tail": (lambda c: c.table("region").sort("r_regionkey").tail(2), True),
    "alias": (
        lambda c: (
            c.table("nation")
            .alias("a")
            .join_on(c.table("nation").alias("b"), col("a.n_regionkey") == col("b.n_regionkey"))
            .select(col("a.n_name").alias("left_name"), col("b.n_name").alias("right_name"))
        ),
        False,
    ),
    "getitem": (lambda c: c.table("nation")[["n_name", "n_regionkey"]], False),
    "window through select": (
        lambda c: c.table("orders").select(
            "o_orderkey",
            F.row_number(
                partition_by=[col("o_custkey")],
                order_by=[col("o_orderdate").sort(), col("o_orderkey").sort()],
            ).alias("nth_order"),
            F.sum(col("o_totalprice"))
            .over(Window(partition_by=[col("o_custkey")]))
            .alias("customer_total"),
        ),
        False,
    ),
    "window through with_column": (
        lambda c: c.table("nation").with_column(
            "previous",
            F.lag(
                col("n_name"), 1, partition_by=[col("n_regionkey")], order_by=[col("n_nationkey")]
            ),
        ),
        False,
    ),
    "window without partitions": (
        lambda c: c.table("supplier").with_column(
            "rank", F.rank(order_by=[col("s_acctbal").sort(ascending=False)])
        ),
        False,
    ),
    "window": (
        lambda c: c.table("customer").window(
            F.max(col("c_acctbal")).over(Window(partition_by=[col("c_nationkey")])).alias("best")
        ),
        False,
    ),
    "sql then filter": (
        lambda c: c.sql("SELECT n_name, n_regionkey FROM nation").filter(
            col("n_regionkey") == lit(1)
        ),
        False,
    ),
}

TRANSFORMATIONS = (
    "select select_exprs filter with_column with_columns aggregate join join_on sort limit "
    "distinct union union_distinct intersect except_all drop with_column_renamed window"
).split()
"""The transformations issue 28 lists (window expressions through ``select``,
``with_column`` and ``window``): each is a case above."""


def test_every_listed_transformation_is_a_case():
    for name in TRANSFORMATIONS:
        assert name in CASES, name
        assert callable(getattr(DistributedDataFrame, name))


def _built(build, c):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # union_distinct, in DataFusion too
        return build(c)


@pytest.mark.parametrize("case", list(CASES))
def test_transformation_equals_datafusion(case, ctx, oracle):
    build, ordered = CASES[case]
    df = _built(build, ctx)
    assert isinstance(df, DistributedDataFrame)
    expected = _built(build, oracle).to_arrow_table()
    assert df.coordinator_only() is None, df.coordinator_only()
    got = df.to_arrow_table()
    assert got.num_rows > 0
    assert_same_result(got, expected, ordered=ordered)


def test_actions(ctx, oracle):
    expected = oracle.table("orders").filter(col("o_orderstatus") == lit("F"))
    df = ctx.table("orders").filter(col("o_orderstatus") == lit("F"))
    assert df.count() == expected.count()
    assert len(df.to_pandas()) == expected.count()
    assert sum(b.num_rows for b in df.execute_stream()) == expected.count()
    top = df.sort(col("o_orderkey")).limit(3)
    assert top.to_pydict() == expected.sort(col("o_orderkey")).limit(3).to_pydict()
    assert top.to_pylist()[0]["o_orderkey"] == top.to_pydict()["o_orderkey"][0]
    assert "Stage" in df.aggregate([col("o_custkey")], [F.count_star()]).explain()


def test_transformations_keep_the_context_and_build_lazily(ctx):
    base = ctx.table("nation")
    derived = base.filter(col("n_regionkey") == lit(2)).select("n_name")
    assert derived.context is ctx and derived is not base
    assert derived.schema().names == ["n_name"]
    assert derived.metrics() is None  # nothing ran
    assert derived.label.startswith("DataFrame Projection")
    assert base.schema().names == ["n_nationkey", "n_name", "n_regionkey", "n_comment"]


def test_column_helpers(ctx, oracle):
    left, right = ctx.table("nation"), ctx.table("supplier")
    joined = left.join_on(right, left.col("n_nationkey") == right.column("s_nationkey"))
    got = joined.select(*left.find_qualified_columns("n_name"), "s_name").to_arrow_table()
    o_left, o_right = oracle.table("nation"), oracle.table("supplier")
    expected = (
        o_left.join_on(o_right, o_left.col("n_nationkey") == o_right.column("s_nationkey"))
        .select(*o_left.find_qualified_columns("n_name"), "s_name")
        .to_arrow_table()
    )
    assert_same_result(got, expected, ordered=False)
    expr = ctx.table("nation").parse_sql_expr("n_nationkey * 2")
    assert "n_nationkey" in str(expr)


def test_cache_runs_once_into_a_memory_table(ctx, oracle):
    cached = (
        ctx.table("lineitem")
        .aggregate([col("l_shipmode")], [F.sum(col("l_quantity")).alias("q")])
        .cache()
    )
    assert cached.metrics() is None
    expected = (
        oracle.table("lineitem")
        .aggregate([col("l_shipmode")], [F.sum(col("l_quantity")).alias("q")])
        .to_arrow_table()
    )
    assert_same_result(cached.to_arrow_table(), expected, ordered=False)
    name = cached.explain().split("scan ")[1].split()[0]
    assert ctx.sources[name].format == "memory"


def test_transform_chains_a_function(ctx):
    def only_region(df, key):
        return df.filter(col("n_regionkey") == lit(key))

    assert ctx.table("nation").transform(only_region, 3).count() == 5


def test_unnest_runs_on_the_coordinator(ctx):
    df = ctx.from_pydict({"k": [1, 2], "xs": [[1, 2], [3]]}).unnest_columns("xs")
    assert df.coordinator_only() is not None  # Substrait cannot carry an unnest
    assert sorted(df.to_pydict()["xs"]) == [1, 2, 3]


# ------------------------------------------------------------------ readers
def test_read_parquet_is_a_distributed_source(tpch_dir, oracle, runtime_for):
    ctx = DistributedContext(runtime=runtime_for("local", WORKERS))
    path = tpch.table_path(tpch_dir, "lineitem")
    df = ctx.read_parquet(path).aggregate(
        [col("l_linestatus")], [F.sum(col("l_extendedprice")).alias("total")]
    )
    expected = (
        SessionContext()
        .read_parquet(path)
        .aggregate([col("l_linestatus")], [F.sum(col("l_extendedprice")).alias("total")])
    )
    assert_same_result(df.to_arrow_table(), expected.to_arrow_table(), ordered=False)
    assert "scan lineitem_" in df.explain() and "4 work units" in df.explain()
    (name,) = ctx.table_names()
    assert ctx.sources[name].format == "parquet"


def test_read_parquet_takes_a_list_of_files(tpch_dir, runtime_for):
    import glob

    ctx = DistributedContext(runtime=runtime_for("local", WORKERS))
    files = sorted(glob.glob(f"{tpch.table_path(tpch_dir, 'orders')}/*.parquet"))[:2]
    df = ctx.read_parquet(files)
    assert df.count() == sum(SessionContext().read_parquet(f).count() for f in files)


def test_read_csv(tmp_path, runtime_for):
    table = pa.table({"k": list(range(100)), "v": [f"x{i % 7}" for i in range(100)]})
    for i in range(3):
        pacsv.write_csv(table.slice(i * 30, 40), tmp_path / f"part-{i}.csv")
    ctx = DistributedContext(runtime=runtime_for("local", WORKERS))
    df = ctx.read_csv(str(tmp_path)).aggregate([col("v")], [F.count_star().alias("n")])
    expected = (
        SessionContext().read_csv(str(tmp_path)).aggregate([col("v")], [F.count_star().alias("n")])
    )
    assert_same_result(df.to_arrow_table(), expected.to_arrow_table(), ordered=False)
    assert "3 work units" in df.explain()


def test_from_arrow_pydict_pylist(runtime_for):
    ctx = DistributedContext(runtime=runtime_for("local", WORKERS))
    table = pa.table({"a": [1, 2, 3], "b": ["x", "y", "x"]})
    for df in (
        ctx.from_arrow(table),
        ctx.from_arrow(table.to_batches()[0]),
        ctx.from_arrow(pa.RecordBatchReader.from_batches(table.schema, table.to_batches())),
        ctx.from_pydict({"a": [1, 2, 3], "b": ["x", "y", "x"]}),
        ctx.from_pylist([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 3, "b": "x"}]),
        ctx.from_pandas(table.to_pandas()),
    ):
        got = df.aggregate([col("b")], [F.sum(col("a")).alias("s")]).sort("b").to_pydict()
        assert got == {"b": ["x", "y"], "s": [4, 2]}
    named = ctx.from_pydict({"a": [5]}, name="five")
    assert ctx.sql("SELECT a FROM five").to_pydict() == {"a": [5]}
    assert named.to_pydict() == {"a": [5]}


def test_from_arrow_joins_files(ctx, oracle):
    regions = {"r_regionkey": [0, 1, 2], "label": ["af", "am", "as"]}
    got = ctx.table("nation").join(
        ctx.from_pydict(regions), left_on="n_regionkey", right_on="r_regionkey"
    )
    expected = oracle.table("nation").join(
        oracle.from_pydict(regions), left_on="n_regionkey", right_on="r_regionkey"
    )
    assert_same_result(got.to_arrow_table(), expected.to_arrow_table(), ordered=False)


# --------------------------------------------------------- from_datafusion
def test_from_datafusion_distributes_a_plain_dataframe(ctx, oracle):
    plain = ctx.ctx.table("lineitem").aggregate(
        [col("l_returnflag")], [F.sum(col("l_quantity")).alias("q")]
    )
    df = ctx.from_datafusion(plain)
    assert df.coordinator_only() is None and "Stage" in df.explain()
    expected = oracle.table("lineitem").aggregate(
        [col("l_returnflag")], [F.sum(col("l_quantity")).alias("q")]
    )
    assert_same_result(df.to_arrow_table(), expected.to_arrow_table(), ordered=False)
    sql = ctx.from_datafusion(ctx.ctx.sql("SELECT count(*) AS n FROM orders"))
    assert sql.to_pydict() == {"n": [oracle.table("orders").count()]}


def test_from_datafusion_finds_tables_of_any_case_and_qualified(runtime_for):
    ctx = DistributedContext(runtime=runtime_for("local", WORKERS))
    ctx.register_table('"Upper.Case"', pa.table({"a": [1, 2]}))
    ctx.register_table('"T1"', pa.table({"a": [3]}))
    ctx.register_table("t2", pa.table({"a": [4]}))
    for plain, rows in (
        (ctx.ctx.table('"Upper.Case"'), [1, 2]),
        (ctx.ctx.table('"T1"'), [3]),
        (ctx.ctx.sql("SELECT a FROM datafusion.public.t2"), [4]),
    ):
        assert sorted(ctx.from_datafusion(plain).to_pydict()["a"]) == rows


def test_from_datafusion_refuses_another_session_context(ctx, oracle):
    with pytest.raises(PlanningError, match="another SessionContext"):
        ctx.from_datafusion(oracle.table("nation"))  # same table names, another context
    with pytest.raises(PlanningError, match="another SessionContext"):
        ctx.from_datafusion(SessionContext().from_pydict({"a": [1]}))
    with pytest.raises(TypeError, match="datafusion.DataFrame"):
        ctx.from_datafusion(ctx.table("nation"))
    with pytest.raises(TypeError, match="datafusion.DataFrame"):
        ctx.from_datafusion(pa.table({"a": [1]}))


def test_a_dataframe_of_another_context_is_refused_in_a_join(ctx, oracle, runtime_for):
    other = SessionContext().from_pydict({"n_regionkey": [1]})
    # DataFusion joins frames of two contexts; the joined plan scans a table unknown here.
    mixed = ctx.ctx.table("nation").join(other, on="n_regionkey")
    with pytest.raises(PlanningError, match="does not know"):
        ctx.from_datafusion(mixed)
    with pytest.raises(PlanningError, match="another SessionContext"):
        ctx.table("nation").join(
            oracle.table("region"), left_on="n_regionkey", right_on="r_regionkey"
        )
    second = DistributedContext(runtime=runtime_for("local", WORKERS))
    second.register_table("r", pa.table({"r_regionkey": [1]}))
    with pytest.raises(PlanningError, match="another DistributedContext"):
        ctx.table("nation").join(second.table("r"), left_on="n_regionkey", right_on="r_regionkey")
    with pytest.raises(TypeError, match="DataFrame of this context"):
        ctx.table("nation").union(pa.table({"n_regionkey": [1]}))


# -------------------------------------------------------------- bad input
def test_bad_input_fails_when_built_with_datafusions_message(ctx):
    with pytest.raises(PlanningError, match="filter: .*No field named nope"):
        ctx.table("nation").filter(col("nope") > lit(1))
    with pytest.raises(PlanningError, match="table 'nope'"):
        ctx.table("nope")
    with pytest.raises(ValueError, match="left_on"):
        ctx.table("nation").join(ctx.table("region"), left_on="n_regionkey")
    with pytest.raises(PlanningError, match="union"):
        ctx.table("nation").union(ctx.table("region"))
    with pytest.raises(TypeError):
        ctx.table("nation").filter(42)
    with pytest.raises(PlanningError, match="EXPLAIN cannot be transformed"):
        ctx.sql("EXPLAIN SELECT * FROM nation").filter(col("plan_type") == lit("x"))


def test_readers_refuse_options_they_do_not_apply(ctx, tpch_dir):
    path = tpch.table_path(tpch_dir, "nation")
    with pytest.raises(ValueError, match="file_sort_order is not supported"):
        ctx.read_parquet(path, file_sort_order=[["n_nationkey"]])
    with pytest.raises(ValueError, match="parquet_pruning, skip_metadata are not supported"):
        ctx.read_parquet(path, None, False, ".parquet", False)
    with pytest.raises(ValueError, match="file_compression_type"):
        ctx.read_csv(path, file_compression_type="gzip")
    with pytest.raises(PlanningError, match="no Parquet file|cannot register"):
        ctx.read_parquet(str(tpch_dir / "missing"))
    with pytest.raises(TypeError, match="Arrow data"):
        ctx.from_arrow([1, 2, 3])
    ctx.from_pydict({"a": [1]}, name="taken")
    with pytest.raises(PlanningError, match="exists already"):
        ctx.from_pydict({"a": [1]}, name="taken")
    ctx.deregister_table("taken")


# ------------------------------------------------------------------- docs
def test_the_readme_example_runs_and_equals_datafusion(tpch_dir, oracle, capsys):
    readme = (REPO / "README.md").read_text()
    section = readme.split("## DataFrame API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    code = code.replace('"data/tpch-sf1/', f'"{tpch_dir}/')
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "Stage 2" in out and "1-URGENT" in out
    df = namespace["df"]
    expected = oracle.sql(
        "SELECT o_orderpriority, sum(l_extendedprice) AS revenue, count(*) AS lines "
        "FROM lineitem JOIN orders ON l_orderkey = o_orderkey WHERE l_quantity > 45 "
        "GROUP BY o_orderpriority ORDER BY o_orderpriority"
    ).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, ordered=True)
    df.context.close()


def test_the_first_example_of_the_doc_runs(tpch_dir, oracle, capsys):
    text = (REPO / "docs" / "dataframe.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    code = code.replace('"data/tpch-sf1/', f'"{tpch_dir}/')
    namespace: dict = {}
    exec(compile(code, "docs/dataframe.md", "exec"), namespace)
    shown = capsys.readouterr().out  # as DataFusion's show(): a header line, then a line a row
    assert shown.startswith("DataFrame()\n") and shown.count("\n| ") == 1 + 10
    expected = oracle.sql(
        "SELECT o_custkey, sum(o_totalprice) AS spent, rank() OVER (ORDER BY sum(o_totalprice) DESC) "
        "AS rank FROM orders WHERE o_orderdate >= DATE '1998-01-01' GROUP BY o_custkey "
        "ORDER BY rank LIMIT 10"
    ).to_arrow_table()
    got = namespace["per_customer"].filter(col("rank") <= lit(10)).sort(col("rank"))
    assert got.to_arrow_table().column("spent") == expected.column("spent")
    namespace["ctx"].close()
