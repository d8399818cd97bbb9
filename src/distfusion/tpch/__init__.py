"""TPC-H: the 22 queries, table registration and data generation with ``tpchgen-cli``.

The queries use the specification's validation parameters (see
``queries/README.md``). Data comes from ``tpchgen-cli`` (PyPI), which writes
``<out>/<table>/<table>.<n>.parquet`` with several files per table.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import resources

__all__ = ["TABLES", "QUERIES", "query", "register_tpch", "generate"]

TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")
QUERIES = tuple(range(1, 23))


def query(n: int) -> str:
    """The SQL text of TPC-H query ``n`` (1..22); Q15 holds three statements.

    Raises:
        ValueError: ``n`` is not in 1..22.
    """
    if n not in QUERIES:
        msg = f"TPC-H has queries 1..22, not {n}"
        raise ValueError(msg)
    return resources.files(__package__).joinpath("queries", f"q{n}.sql").read_text()


def table_path(data_dir: str | os.PathLike, table: str, suite: str = "tpch") -> str:
    """Where ``table`` lives under ``data_dir``: a directory of files, or one file.

    ``suite`` (``"tpch"`` or ``"tpcds"``) names the ``distfusion datagen``
    command the error suggests.

    Under an object store URL (``s3://bucket/tpch-sf1``), the directory
    ``<url>/<table>/`` (not checked here: registering it lists it).

    Raises:
        FileNotFoundError: neither ``<dir>/<table>/`` nor ``<dir>/<table>.parquet`` exists.
    """
    if "://" in os.fspath(data_dir):
        return f"{os.fspath(data_dir).rstrip('/')}/{table}/"
    for candidate in (os.path.join(data_dir, table), os.path.join(data_dir, f"{table}.parquet")):
        if os.path.exists(candidate):
            return candidate
    title = {"tpch": "TPC-H", "tpcds": "TPC-DS"}.get(suite, suite)
    msg = (
        f"{title} table {table!r} not found under {os.fspath(data_dir)!r}; generate it with "
        f"`distfusion datagen {suite} --scale 1 --out {os.fspath(data_dir)}`"
    )
    raise FileNotFoundError(msg)


def register_tpch(ctx, data_dir: str | os.PathLike) -> None:
    """Register the eight TPC-H tables found under ``data_dir`` in ``ctx``.

    ``ctx`` is anything with ``register_parquet(name, path)``: a
    :class:`~distfusion.DistributedContext` or a DataFusion ``SessionContext``.

    Raises:
        FileNotFoundError: a table is missing.
    """
    for table in TABLES:
        ctx.register_parquet(table, table_path(data_dir, table))


def generate(scale: float, out: str | os.PathLike, parts: int | None = None) -> None:
    """Write TPC-H at scale factor ``scale`` as Parquet under ``out`` with ``tpchgen-cli``.

    Args:
        scale: scale factor (1 is about 1 GB of CSV, 6 million lineitem rows).
        out: target directory (created).
        parts: files per table (default: 8 per scale factor unit, at least 4).

    Raises:
        RuntimeError: ``tpchgen-cli`` is not installed or fails.
    """
    exe = shutil.which("tpchgen-cli") or os.path.join(
        os.path.dirname(sys.executable), "tpchgen-cli"
    )
    if not os.path.exists(exe):
        msg = "tpchgen-cli is not installed: pip install 'distfusion[datagen]' (or tpchgen-cli)"
        raise RuntimeError(msg)
    parts = parts or max(4, int(8 * scale))
    os.makedirs(out, exist_ok=True)
    cmd = [
        exe,
        "parquet",
        "--scale-factor",
        str(scale),
        "--parts",
        str(parts),
        "--output-dir",
        os.fspath(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        msg = f"tpchgen-cli failed ({' '.join(cmd)}): {proc.stderr.strip()[-2000:]}"
        raise RuntimeError(msg)
