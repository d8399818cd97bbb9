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

__all__ = ["TABLES", "QUERIES", "query", "table_path", "register_tpch", "generate", "run_generator"]

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
    run_generator("tpchgen-cli", ["parquet"], scale, out, parts)


def run_generator(
    exe_name: str, command: list[str], scale: float, out: str | os.PathLike, parts: int | None
) -> None:
    """Run ``<exe_name> <command> --scale-factor S --parts N --output-dir OUT`` (TPC-H or TPC-DS).

    ``parts`` defaults to 8 per scale factor unit, at least 4.

    Raises:
        RuntimeError: ``exe_name`` is not installed (found on PATH or next to
            this Python), or it fails (its last 2,000 characters of stderr).
    """
    exe = shutil.which(exe_name) or os.path.join(os.path.dirname(sys.executable), exe_name)
    if not os.path.exists(exe):
        msg = f"{exe_name} is not installed: pip install 'distfusion[datagen]' (or {exe_name})"
        raise RuntimeError(msg)
    parts = parts or max(4, int(8 * scale))
    os.makedirs(out, exist_ok=True)
    cmd = [exe, *command, "--scale-factor", str(scale), "--parts", str(parts)]
    cmd += ["--output-dir", os.fspath(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        msg = f"{exe_name} failed ({' '.join(cmd)}): {proc.stderr.strip()[-2000:]}"
        raise RuntimeError(msg)
