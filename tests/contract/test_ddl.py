"""DDL and DML through the context give single-node DataFusion's tables and answers.

Each script runs whole on distfusion (``DistributedContext.sql``) and on
DataFusion (``plan_statements``) over the same tables; the last query's results
must be equal. Tables made by SQL are split across tasks (memory tables) or
read as file sources (external Parquet tables), not run on the coordinator.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext, PlanningError
from distfusion.context import plan_statements
from tests.compare import assert_same_result, is_ordered

T = pa.table(
    {"a": pa.array([1, 2, 3, None, 2, 5], pa.int64()), "b": ["x", "y", None, "x", "z", "y"]}
)

SCRIPTS = {
    "create-table-as-select": (
        "CREATE TABLE c AS SELECT a * 2 AS d, b FROM t WHERE a > 1; "
        "SELECT b, sum(d) AS s FROM c GROUP BY b"
    ),
    "create-table-as-values": (
        "CREATE TABLE v AS VALUES (1, 'p'), (2, 'q'), (2, NULL); "
        "SELECT column1, count(column2) AS n FROM v GROUP BY column1"
    ),
    "create-or-replace": (
        "CREATE TABLE c AS SELECT a FROM t; CREATE OR REPLACE TABLE c AS SELECT b FROM t; "
        "SELECT * FROM c"
    ),
    "create-if-not-exists-keeps-the-table": (
        "CREATE TABLE c AS SELECT a FROM t; CREATE TABLE IF NOT EXISTS c AS SELECT 1 AS z; "
        "SELECT * FROM c"
    ),
    "create-view": "CREATE VIEW w AS SELECT a, b FROM t WHERE a > 1; SELECT b, count(*) AS n FROM w GROUP BY b",
    "insert-values": (
        "CREATE TABLE m (x BIGINT, y VARCHAR); INSERT INTO m VALUES (1, 'p'), (2, NULL); "
        "INSERT INTO m VALUES (3, 'q'); SELECT * FROM m ORDER BY x"
    ),
    "insert-select": (
        "CREATE TABLE c AS SELECT a FROM t; INSERT INTO c SELECT a + 10 FROM t WHERE a > 2; "
        "SELECT count(*) AS n, sum(a) AS s FROM c"
    ),
    "insert-into-registered-table": (
        "INSERT INTO t VALUES (7, 'w'); SELECT b, sum(a) AS s FROM t GROUP BY b"
    ),
    "drop-and-create-again": (
        "CREATE TABLE c AS SELECT a FROM t; DROP TABLE c; CREATE TABLE c AS SELECT b FROM t; "
        "SELECT * FROM c"
    ),
    "join-sql-made-tables": (
        "CREATE TABLE l AS SELECT a, b FROM t; CREATE TABLE r AS SELECT a, a * 3 AS z FROM t; "
        "SELECT l.b, sum(r.z) AS s FROM l JOIN r ON l.a = r.a GROUP BY l.b"
    ),
}


@pytest.fixture
def contexts(runtime, workers, tmp_path):
    oracle = SessionContext()
    oracle.register_record_batches("t", [T.to_batches()])
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    ctx.register_table("t", T, max_rows_per_unit=2)
    return ctx, oracle


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_script_gives_datafusions_answer(contexts, name):
    ctx, oracle = contexts
    sql = SCRIPTS[name]
    df = ctx.sql(sql)
    expected = plan_statements(oracle, sql).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, is_ordered(sql))
    assert df.coordinator_only() is None, "tables made by SQL are distributed"


def test_create_table_as_runs_its_query_distributed(contexts, runtime):
    ctx, _ = contexts
    ctx.sql("CREATE TABLE c AS SELECT b, count(*) AS n FROM t GROUP BY b")
    assert len(runtime.executed) == 1, "the query ran as a stage graph"
    assert ctx.sources["c"].format == "memory"
    assert ctx.sql("SELECT sum(n) AS s FROM c").to_pylist() == [{"s": 6}]


def test_insert_is_seen_by_queries_after_it_ran(contexts):
    ctx, _ = contexts
    ctx.sql("CREATE TABLE m (x BIGINT)")
    insert = ctx.sql("INSERT INTO m VALUES (1), (2)")
    assert insert.coordinator_only().startswith("a write")
    assert ctx.sql("SELECT count(*) AS n FROM m").to_pylist() == [{"n": 0}]  # not run yet
    assert insert.to_pylist() == [{"count": 2}]
    assert ctx.sql("SELECT sum(x) AS s FROM m").to_pylist() == [{"s": 3}]


def test_external_parquet_table_is_a_file_source(contexts, tmp_path):
    ctx, _ = contexts
    for i in range(3):
        pq.write_table(pa.table({"k": [i, i + 1], "v": [1.5, 2.5]}), tmp_path / f"p{i}.parquet")
    sql = f"CREATE EXTERNAL TABLE e STORED AS PARQUET LOCATION '{tmp_path}/'"
    ctx.sql(sql)
    assert ctx.sources["e"].format == "parquet"
    assert len(ctx.sources["e"].units) == 3
    oracle = SessionContext()
    oracle.sql(sql)
    query = "SELECT k, sum(v) AS s FROM e GROUP BY k"
    df = ctx.sql(query)
    assert df.coordinator_only() is None
    assert_same_result(df.to_arrow_table(), oracle.sql(query).to_arrow_table(), ordered=False)


def test_external_csv_table_is_read_on_the_coordinator(contexts, tmp_path):
    ctx, _ = contexts
    (tmp_path / "c.csv").write_text("k,v\n1,a\n2,b\n")
    ctx.sql(f"CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '{tmp_path}/c.csv'")
    df = ctx.sql("SELECT k, v FROM e ORDER BY k")
    assert df.to_pylist() == [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    assert "'e'" in df.coordinator_only()


def test_drop_table_forgets_the_source(contexts):
    ctx, _ = contexts
    ctx.sql("CREATE TABLE c AS SELECT a FROM t; DROP TABLE c")
    assert "c" not in ctx.sources
    with pytest.raises(PlanningError, match="not found"):
        ctx.sql("SELECT * FROM c")


def test_a_view_replacing_a_table_is_not_read_as_the_table(contexts):
    ctx, _ = contexts
    ctx.sql("CREATE TABLE c AS SELECT a FROM t; DROP TABLE c; CREATE VIEW c AS SELECT 42 AS a")
    assert "c" not in ctx.sources
    assert ctx.sql("SELECT a FROM c").to_pylist() == [{"a": 42}]


def test_insert_into_a_file_table_says_what_is_supported(contexts, tmp_path):
    ctx, _ = contexts
    pq.write_table(pa.table({"k": [1]}), tmp_path / "p.parquet")
    ctx.register_parquet("p", tmp_path)
    with pytest.raises(PlanningError, match="INSERT INTO takes memory tables"):
        ctx.sql("INSERT INTO p VALUES (2)")


def test_tables_of_another_schema_run_on_the_coordinator(contexts):
    ctx, _ = contexts
    ctx.sql("CREATE SCHEMA s; CREATE TABLE s.t AS SELECT 99 AS a")
    df = ctx.sql("SELECT a FROM s.t")
    assert df.to_pylist() == [{"a": 99}]
    assert "not in the default schema" in df.coordinator_only()
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 6}]


def test_datafusions_ddl_errors_are_its_own(contexts):
    ctx, _ = contexts
    ctx.sql("CREATE TABLE c AS SELECT a FROM t")
    with pytest.raises(PlanningError, match="already exists"):
        ctx.sql("CREATE TABLE c AS SELECT 1 AS z")
    with pytest.raises(PlanningError, match="nope"):
        ctx.sql("CREATE TABLE d AS SELECT * FROM nope")
