"""``distfusion.tpcds``: the query files, ``query()``, data generation and registration."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import sqlglot
from datafusion import SessionContext

from distfusion import cli, tpcds

TPCGEN = shutil.which("tpcgen-cli") or str(Path(sys.executable).parent / "tpcgen-cli")
needs_tpcgen = pytest.mark.skipif(
    not Path(TPCGEN).exists(),
    reason="tpcgen-cli is not installed (pip install 'distfusion[datagen]')",
)


def test_queries_are_the_99_with_four_in_two_parts():
    assert len(tpcds.QUERIES) == 103
    assert tpcds.QUERIES[:3] == ("q1", "q2", "q3")
    assert tpcds.QUERIES[12:16] == ("q13", "q14a", "q14b", "q15")
    assert tpcds.QUERIES[-1] == "q99"
    for n in (14, 23, 24, 39):
        assert f"q{n}" not in tpcds.QUERIES
    assert len(tpcds.TABLES) == 24


@pytest.mark.parametrize("name", [3, "3", "q3", "Q3", " q3 "])
def test_query_accepts_a_number_or_a_name(name):
    assert tpcds.query(name) == tpcds.query("q3")
    assert "store_sales" in tpcds.query(name)


@pytest.mark.parametrize("name", [14, "q14", 0, 100, "q14c", "x", True, None, 3.0])
def test_query_names_the_valid_names_otherwise(name):
    with pytest.raises(ValueError, match=r"q1\.\.q99, with q14a/q14b, q23a/q23b, q24a/q24b"):
        tpcds.query(name)


@pytest.mark.parametrize("name", tpcds.QUERIES)
def test_query_parses_as_one_spark_sql_statement(name):
    text = tpcds.query(name)
    assert len(sqlglot.parse(text, read="spark")) == 1  # no second statement after a ';'
    sqlglot.parse_one(text, read="spark")


def test_table_path_of_a_missing_table_says_how_to_generate_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="distfusion datagen tpcds"):
        tpcds.table_path(tmp_path, "store_sales")
    assert tpcds.table_path("s3://bucket/sf1/", "item") == "s3://bucket/sf1/item/"


@pytest.fixture(scope="module")
def sf001(tmp_path_factory) -> Path:
    """TPC-DS at scale factor 0.01 (about 1 s), written by ``distfusion datagen tpcds``."""
    if not Path(TPCGEN).exists():
        pytest.skip("tpcgen-cli is not installed (pip install 'distfusion[datagen]')")
    out = tmp_path_factory.mktemp("tpcds")
    assert cli.main(["datagen", "tpcds", "--scale", "0.01", "--out", str(out)]) == 0
    return out


@needs_tpcgen
def test_generated_tables_register_and_have_rows(sf001):
    ctx = SessionContext()
    tpcds.register_tpcds(ctx, sf001)
    counts = {
        t: ctx.sql(f"SELECT count(*) AS n FROM {t}").to_pylist()[0]["n"] for t in tpcds.TABLES
    }
    assert all(n > 0 for n in counts.values()), counts
    assert counts["date_dim"] == 73049  # every day of 1900-2100, at any scale factor
    assert counts["store_sales"] > 20_000


@needs_tpcgen
def test_generate_reports_what_tpcgen_cli_refuses(tmp_path):
    with pytest.raises(RuntimeError, match="tpcgen-cli failed"):
        tpcds.generate(0.01, tmp_path, parts=-1)
