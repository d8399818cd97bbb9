"""Mounted catalogs (issue 39 item 0): ``ctx.register_catalog`` and ``lake.db.t`` in SQL.

A pyiceberg SQL catalog (SQLite) and a :class:`~distfusion.DeltaDirectoryCatalog`
on local disk. What a query reads is compared with each library's own read of
the same table (pyiceberg's scan, ``DeltaTable.to_pyarrow_table``); every
write is exactly one new snapshot or version; a failed ``CREATE TABLE AS``
leaves no table and no file.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

import distfusion
from distfusion import (
    DeltaDirectoryCatalog,
    DistributedConfig,
    DistributedContext,
    PlanningError,
    TaskError,
)
from distfusion.table_write.catalog_names import find_names, rewrite_names

RUNTIMES = {"local": 3, "flight": 3, "spark": 2}
ROWS = 300


def _rows(n: int = ROWS, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([f"k{i % 3}" for i in ids]),
            "x": pa.array([i * 0.5 if i % 7 else None for i in ids]),
        }
    )


def _fail_at(values: pa.Array) -> pa.Array:
    if pc.any(pc.equal(values, ROWS - 1)).as_py():
        raise RuntimeError("boom in one task")
    return values


FAIL = distfusion.udf(_fail_at, [pa.int64()], pa.int64(), "immutable", name="fail_at_last")


class CountingCatalog(SqlCatalog):
    """A SQL catalog that counts the tables it loads (to see what a statement loads)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loaded: list[tuple] = []

    def load_table(self, identifier):
        self.loaded.append(tuple(identifier))
        return super().load_table(identifier)


def _iceberg(tmp_path) -> CountingCatalog:
    catalog = CountingCatalog(
        "lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("db")
    orders = catalog.create_table(("db", "orders"), schema=_rows().schema)
    orders.append(_rows())
    catalog.create_table(("db", "empty"), schema=_rows().schema)
    catalog.loaded.clear()
    return catalog


def _delta(tmp_path) -> DeltaDirectoryCatalog:
    root = tmp_path / "delta"
    write_deltalake(str(root / "sales" / "orders"), _rows(), partition_by=["p"])
    return DeltaDirectoryCatalog(root)


def _context(runtime, tmp_path) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=3))
    ctx.register_udf(FAIL)
    ctx.register_table("src", _rows(ROWS, 1000), max_rows_per_unit=100)
    return ctx


def _sorted(t: pa.Table) -> list[dict]:
    return sorted(t.to_pylist(), key=lambda r: r["id"])


def _files(path) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs}


# ------------------------------------------------------------------ names in SQL
def test_names_are_found_outside_strings_and_comments_and_rewritten():
    sql = (
        "SELECT lake.db.t.x, 'lake.db.s', \"Q\".y FROM lake.db.t -- lake.db.u\n"
        'JOIN lake."Db".q AS "Q" ON TRUE, other.db.v, lake.db.w WHERE 1 = 1'
    )
    names = find_names(sql, {"lake"})
    assert [n.parts for n in names] == [
        ("lake", "db", "t"),
        ("lake", "db", "t"),
        ("lake", "Db", "q"),
        ("lake", "db", "w"),
    ]
    assert rewrite_names(sql, names) == (
        'SELECT "t".x, \'lake.db.s\', "Q".y FROM "lake.db.t" AS "t" -- lake.db.u\n'
        'JOIN "lake.Db.q" AS "Q" ON TRUE, other.db.v, "lake.db.w" AS "w" WHERE 1 = 1'
    )


def test_a_keyword_namespace_and_an_insert_target():
    sql = "INSERT INTO lake.default.t SELECT * FROM lake.default.t"
    assert rewrite_names(sql, find_names(sql, {"lake"})) == (
        'INSERT INTO "lake.default.t" SELECT * FROM "lake.default.t" AS "t"'
    )


# ------------------------------------------------------------------ Iceberg catalog
@pytest.mark.parametrize("runtime_name", list(RUNTIMES))
def test_iceberg_catalog_tables_read_and_insert_by_name(runtime_name, runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for(runtime_name, RUNTIMES[runtime_name]), tmp_path)
    ctx.register_catalog("lake", catalog)
    assert catalog.loaded == []  # mounting reads nothing

    got = ctx.sql("SELECT orders.id, p, lake.db.orders.x FROM lake.db.orders").to_arrow_table()
    assert catalog.loaded == [("db", "orders")]  # only the table the query names
    assert _sorted(got) == _sorted(catalog.load_table(("db", "orders")).scan().to_arrow())

    before = len(catalog.load_table(("db", "orders")).snapshots())
    count = ctx.sql("INSERT INTO lake.db.orders SELECT * FROM src WHERE id < 1100").to_pylist()
    assert count == [{"count": 100}]
    table = catalog.load_table(("db", "orders"))
    assert len(table.snapshots()) == before + 1
    expected = _sorted(pa.concat_tables([_rows(), _rows(100, 1000)]))
    assert _sorted(table.scan().to_arrow()) == expected
    again = ctx.sql("SELECT * FROM lake.db.orders").to_arrow_table()
    assert _sorted(again) == expected


def test_table_takes_a_catalog_name(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    got = ctx.table("lake.db.orders").filter("id < 10").to_arrow_table()
    assert _sorted(got) == _sorted(_rows(10))
    with pytest.raises(PlanningError, match=r"lake\.db\.nope does not exist"):
        ctx.table("lake.db.nope")


def test_each_statement_reads_the_current_snapshot(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    query = "SELECT count(*) AS n FROM lake.db.orders"
    assert ctx.sql(query).to_pylist() == [{"n": ROWS}]
    catalog.load_table(("db", "orders")).append(_rows(10, 5000))  # another writer
    assert ctx.sql(query).to_pylist() == [{"n": ROWS + 10}]


def test_an_unknown_table_or_namespace_names_what_exists(runtime_for, tmp_path):
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", _iceberg(tmp_path))
    with pytest.raises(PlanningError, match=r"lake\.db\.nope does not exist.*\(empty, orders\)"):
        ctx.sql("SELECT * FROM lake.db.nope")
    with pytest.raises(PlanningError, match=r"no namespace 'nons' \(its namespaces: db\)"):
        ctx.sql("SELECT * FROM lake.nons.t")
    with pytest.raises(PlanningError, match="dropped through the catalog"):
        ctx.sql("DROP TABLE lake.db.orders")
    with pytest.raises(TypeError, match="pyiceberg Catalog or a distfusion.DeltaDirectoryCatalog"):
        ctx.register_catalog("x", object())


def test_show_tables_lists_the_catalogs_tables(runtime_for, tmp_path):
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", _iceberg(tmp_path))
    ctx.register_catalog("dl", _delta(tmp_path))
    ctx.sql("SELECT * FROM lake.db.orders").collect()  # loaded: not listed under its bare name
    rows = ctx.sql("SHOW TABLES").to_pylist()
    ours = [(r["table_catalog"], r["table_schema"], r["table_name"]) for r in rows]
    assert ("datafusion", "public", "src") in ours
    assert ("lake", "db", "orders") in ours and ("lake", "db", "empty") in ours
    assert ("dl", "sales", "orders") in ours
    assert not [t for t in ours if "." in t[2]]
    assert ctx.sql("SHOW TABLES IN dl").to_pylist() == [
        {
            "table_catalog": "dl",
            "table_schema": "sales",
            "table_name": "orders",
            "table_type": "BASE TABLE",
        }
    ]


def test_create_table_as_makes_a_partitioned_iceberg_table(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    ctx.sql("CREATE TABLE lake.db.t PARTITIONED BY (p) AS SELECT * FROM src").collect()
    table = catalog.load_table(("db", "t"))
    assert [f.name for f in table.schema().fields] == ["id", "p", "x"]
    assert not any(f.required for f in table.schema().fields)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("p", "identity")]
    assert len(table.snapshots()) == 1
    assert _sorted(table.scan().to_arrow()) == _sorted(_rows(ROWS, 1000))
    assert ctx.sql("SELECT count(*) AS n FROM lake.db.t").to_pylist() == [{"n": ROWS}]
    with pytest.raises(PlanningError, match="already exists"):
        ctx.sql("CREATE TABLE lake.db.t AS SELECT 1 AS id")
    ctx.sql("CREATE TABLE IF NOT EXISTS lake.db.t AS SELECT 1 AS id").collect()
    assert len(catalog.load_table(("db", "t")).snapshots()) == 1


def test_a_failed_create_table_as_leaves_no_iceberg_table(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    before = _files(tmp_path / "warehouse")
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql("CREATE TABLE lake.db.t AS SELECT fail_at_last(id - 1000) AS id FROM src")
    assert not catalog.table_exists(("db", "t"))
    assert _files(tmp_path / "warehouse") == before
    with pytest.raises(PlanningError, match=r"PARTITIONED BY column\(s\) \['q'\]"):
        ctx.sql("CREATE TABLE lake.db.t PARTITIONED BY (q) AS SELECT * FROM src")
    assert not catalog.table_exists(("db", "t"))


# ------------------------------------------------------------------ Delta directory
@pytest.mark.parametrize("runtime_name", ["local", "flight"])
def test_delta_directory_tables_read_insert_and_merge_by_name(runtime_name, runtime_for, tmp_path):
    catalog = _delta(tmp_path)
    ctx = _context(runtime_for(runtime_name, RUNTIMES[runtime_name]), tmp_path)
    ctx.register_catalog("dl", catalog)
    uri = str(tmp_path / "delta" / "sales" / "orders")
    got = ctx.sql("SELECT * FROM dl.sales.orders").to_arrow_table()
    assert _sorted(got.select(["id", "p", "x"])) == _sorted(
        DeltaTable(uri).to_pyarrow_table().select(["id", "p", "x"])
    )
    ctx.sql("INSERT INTO dl.sales.orders (id, p, x) SELECT * FROM src").collect()
    dt = DeltaTable(uri)
    assert dt.version() == 1
    assert dt.to_pyarrow_table().num_rows == 2 * ROWS
    merge = (
        "MERGE INTO dl.sales.orders AS t USING (SELECT 1 AS id, 'k1' AS p, -1.0 AS x) AS s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET x = s.x"
    )
    ctx.sql(merge).collect()
    dt = DeltaTable(uri)
    assert dt.version() == 2
    assert pc.filter(dt.to_pyarrow_table(), pc.equal(dt.to_pyarrow_table()["id"], 1))[
        "x"
    ].to_pylist() == [-1.0]
    assert ctx.sql("SELECT count(*) AS n FROM dl.sales.orders").to_pylist() == [{"n": 2 * ROWS}]


def test_create_table_as_makes_a_delta_table_or_nothing(runtime_for, tmp_path):
    catalog = _delta(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("dl", catalog)
    ctx.sql("CREATE TABLE dl.sales.t PARTITIONED BY (p) AS SELECT * FROM src").collect()
    dt = DeltaTable(str(tmp_path / "delta" / "sales" / "t"))
    assert dt.version() == 0
    assert dt.metadata().partition_columns == ["p"]
    assert _sorted(dt.to_pyarrow_table().select(["id", "p", "x"])) == _sorted(_rows(ROWS, 1000))
    with pytest.raises(PlanningError, match=r"dl\.sales\.t already exists"):
        ctx.sql("CREATE TABLE dl.sales.t AS SELECT 1 AS id")
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql("CREATE TABLE dl.new.u AS SELECT fail_at_last(id - 1000) AS id FROM src")
    assert not os.path.exists(tmp_path / "delta" / "new" / "u")
    with pytest.raises(PlanningError, match=r"dl\.sales\.zz does not exist.*\(orders, t\)"):
        ctx.sql("SELECT * FROM dl.sales.zz")


def test_create_table_using_delta_location_as(runtime_for, tmp_path):
    ctx = _context(runtime_for("local", 3), tmp_path)  # no catalog mounted
    path = str(tmp_path / "made")
    ctx.sql(
        f"CREATE TABLE made USING delta PARTITIONED BY (p) LOCATION '{path}' AS SELECT * FROM src"
    )
    dt = DeltaTable(path)
    assert dt.version() == 0 and dt.metadata().partition_columns == ["p"]
    assert _sorted(dt.to_pyarrow_table().select(["id", "p", "x"])) == _sorted(_rows(ROWS, 1000))
    assert ctx.sql("SELECT count(*) AS n FROM made").to_pylist() == [{"n": ROWS}]
    with pytest.raises(PlanningError, match="a Delta table is already at"):
        ctx.sql(f"CREATE TABLE again USING delta LOCATION '{path}' AS SELECT 1 AS id")
    ctx.sql(f"CREATE TABLE IF NOT EXISTS again USING delta LOCATION '{path}' AS SELECT 1 AS id")
    assert DeltaTable(path).version() == 0
    assert ctx.sql("SELECT count(*) AS n FROM again").to_pylist() == [{"n": ROWS}]
    failed = str(tmp_path / "failed")
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql(
            f"CREATE TABLE f USING delta LOCATION '{failed}' "
            "AS SELECT fail_at_last(id - 1000) AS id FROM src"
        )
    assert not os.path.exists(failed) and "f" not in ctx.table_names()


def test_create_table_as_with_partition_transforms(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    ctx.register_catalog("dl", _delta(tmp_path))
    query = "SELECT id, p, CAST('2024-01-01' AS DATE) + CAST(id % 40 AS INT) AS d FROM src"
    ctx.sql(f"CREATE TABLE lake.db.t PARTITIONED BY (days(d), truncate(2, p)) AS {query}")
    table = catalog.load_table(("db", "t"))
    fields = [(f.name, str(f.transform)) for f in table.spec().fields]
    assert fields == [("d_day", "day"), ("p_trunc_2", "truncate[2]")]
    expected = ctx.sql(query).to_arrow_table()
    assert _sorted(table.scan().to_arrow()) == _sorted(expected)
    assert len(table.snapshots()) == 1
    with pytest.raises(PlanningError, match=r"bucket\(4, id\) is not supported"):
        ctx.sql("CREATE TABLE lake.db.u PARTITIONED BY (bucket(4, id)) AS SELECT * FROM src")
    with pytest.raises(PlanningError, match="partitions by columns only"):
        ctx.sql(f"CREATE TABLE dl.sales.u PARTITIONED BY (days(d)) AS {query}")
    assert not catalog.table_exists(("db", "u"))


# ------------------------------------------------------------------ CREATE OR REPLACE
def test_create_or_replace_a_delta_table_is_one_overwrite_commit(runtime_for, tmp_path):
    catalog = _delta(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("dl", catalog)
    uri = str(tmp_path / "delta" / "sales" / "orders")
    old = _sorted(DeltaTable(uri).to_pyarrow_table().select(["id", "p", "x"]))
    assert ctx.sql("SELECT count(*) AS n FROM dl.sales.orders").to_pylist() == [{"n": ROWS}]
    ctx.sql(
        """CREATE OR REPLACE TABLE dl.sales.orders PARTITIONED BY (odd) AS
        SELECT id, id % 2 AS odd, CAST(x AS VARCHAR) AS xs FROM src WHERE id < 1100"""
    ).collect()
    dt = DeltaTable(uri)
    assert dt.version() == 1  # one commit: new schema, partitioning and rows
    assert dt.metadata().partition_columns == ["odd"]
    assert dt.schema().to_arrow().names == ["id", "odd", "xs"]
    got = pa.table(dt.to_pyarrow_table()).select(["id", "odd", "xs"])
    expected = [
        {"id": r["id"], "odd": r["id"] % 2, "xs": None if r["x"] is None else str(r["x"])}
        for r in _rows(100, 1000).to_pylist()
    ]
    assert _sorted(got) == expected
    paths = pa.table(dt.get_add_actions())["path"].to_pylist()
    assert paths and all(f.startswith("odd=") for f in paths)  # every old file removed
    old_version = pa.table(DeltaTable(uri, version=0).to_pyarrow_table()).select(["id", "p", "x"])
    assert _sorted(old_version) == old  # time travel still reads the replaced rows
    assert ctx.sql("SELECT count(*) AS n FROM dl.sales.orders").to_pylist() == [{"n": 100}]
    # the query may read the table it replaces
    ctx.sql(
        "CREATE OR REPLACE TABLE dl.sales.orders AS SELECT id FROM dl.sales.orders WHERE odd = 1"
    ).collect()
    dt = DeltaTable(uri)
    assert dt.version() == 2 and dt.metadata().partition_columns == []
    assert sorted(pa.table(dt.to_pyarrow_table())["id"].to_pylist()) == list(range(1001, 1100, 2))
    # a failed query replaces nothing and leaves no file
    files = _files(uri)
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql(
            "CREATE OR REPLACE TABLE dl.sales.orders AS SELECT fail_at_last(id - 1000) AS id "
            "FROM src"
        )
    assert DeltaTable(uri).version() == 2 and _files(uri) == files
    # a table that does not exist is created
    ctx.sql("CREATE OR REPLACE TABLE dl.sales.fresh AS SELECT 1 AS id").collect()
    assert DeltaTable(str(tmp_path / "delta" / "sales" / "fresh")).version() == 0
    with pytest.raises(PlanningError, match="OR REPLACE and IF NOT EXISTS"):
        ctx.sql("CREATE OR REPLACE TABLE IF NOT EXISTS dl.sales.fresh AS SELECT 1 AS id")


def test_create_or_replace_an_iceberg_table_is_refused_saying_what_to_do(runtime_for, tmp_path):
    catalog = _iceberg(tmp_path)
    ctx = _context(runtime_for("local", 3), tmp_path)
    ctx.register_catalog("lake", catalog)
    snapshot = catalog.load_table(("db", "orders")).current_snapshot().snapshot_id
    with pytest.raises(PlanningError, match="INSERT OVERWRITE lake.db.orders.*drop_table"):
        ctx.sql("CREATE OR REPLACE TABLE lake.db.orders AS SELECT 1 AS id")
    assert catalog.load_table(("db", "orders")).current_snapshot().snapshot_id == snapshot
    # a table that does not exist is created, as CREATE TABLE AS does
    ctx.sql("CREATE OR REPLACE TABLE lake.db.t PARTITIONED BY (p) AS SELECT * FROM src").collect()
    table = catalog.load_table(("db", "t"))
    assert _sorted(table.scan().to_arrow()) == _sorted(_rows(ROWS, 1000))
