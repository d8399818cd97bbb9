"""The import structure: every module imports on its own, the layers hold, no cycles.

The layers and the cycle check are import-linter contracts in pyproject.toml
(drawn in docs/architecture.md); function-level imports are kept for optional
dependencies only.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}

# (module, imported module) pairs allowed inside a function: optional dependencies,
# and the Spark task that imports distfusion on the executor on purpose.
LAZY_IMPORTS = {
    ("distfusion.runtime.spark.config", "pyspark"),
    ("distfusion.runtime.spark.session", "pyspark.java_gateway"),
    ("distfusion.runtime.spark.config", "pyspark.sql"),
    ("distfusion.runtime.spark.dataframes", "pyspark.rdd"),
    ("distfusion.runtime.spark.dataframes", "pyspark.serializers"),
    ("distfusion.runtime.spark.dataframes", "pyspark.sql"),
    ("distfusion.runtime.spark.dataframes", "pyspark.sql.pandas.types"),
    ("distfusion.runtime.spark.jobs", "pyspark.traceback_utils"),
    ("distfusion.runtime.spark.runtime", "pyspark.sql"),
    ("distfusion.runtime.spark.session_udfs", "pyspark.sql.conversion"),  # PySpark 4.3's
    ("distfusion.runtime.spark.session_udfs", "pyspark.sql.types"),
    ("distfusion.runtime.spark.shuffle_plane", "pyspark.accumulators"),
    ("distfusion.worker.spark_tasks", "pyspark"),
    # The executor side imports itself inside the task (an executor without
    # distfusion reports it), and its import probe, with the standard library.
    ("distfusion.worker.spark_entries", "distfusion.worker.spark_entries"),
    ("distfusion.worker.spark_entries", "json"),
    ("distfusion.worker.spark_entries", "os"),
    ("distfusion.worker.spark_entries", "socket"),
    ("distfusion.worker.spark_tasks", "distfusion.worker.spark_tasks"),
    # The executors' import probe: what a task needs, imported there on purpose.
    ("distfusion.worker.spark_tasks", "datafusion"),
    ("distfusion.worker.spark_tasks", "pyarrow"),
    # to_pandas(), to_polars(): pandas and polars are no dependencies of the core.
    ("distfusion.context", "pandas"),
    ("distfusion.dataframe.transformations", "polars"),
    # An encrypted Spark data plane's certificate (pip install 'distfusion[spark]').
    ("distfusion.transport.tls", "cryptography"),
    ("distfusion.transport.tls", "cryptography.hazmat.primitives"),
    ("distfusion.transport.tls", "cryptography.hazmat.primitives.asymmetric"),
    ("distfusion.transport.tls", "cryptography.x509.oid"),
    # The Spark runtime's Flight data plane: pyarrow.flight, loaded only when used.
    ("distfusion.runtime.spark.runtime", "distfusion.worker.flight_server"),
    ("distfusion.worker.spark_tasks", "distfusion.transport.flight"),
    ("distfusion.worker.spark_tasks", "distfusion.worker.flight_server"),
    # Spark Connect: pyspark's Connect client (the connect extra).
    ("distfusion.runtime.spark.connect", "pyspark.sql.connect.session"),
    ("distfusion.spark", "pyspark.sql.pandas.types"),
    ("distfusion.spark", "pyspark.sql.types"),
    ("distfusion.spark", "pyspark.sql"),
    ("distfusion.transport.flight", "pyarrow.flight"),
    # A query's UDFs travel by value: cloudpickle (PySpark's copy first), when installed.
    ("distfusion.runtime.spark.jobs", "pyspark"),
    # Delta tables are read through deltalake (delta-rs), loaded only when used.
    ("distfusion.io.delta", "deltalake"),
    # ListingFeed reads URIs pyarrow.fs does not know through fsspec, when installed.
    ("distfusion.work_unit_feed.table", "fsspec"),
    ("distfusion.worker.flight_cli", "distfusion.worker.flight_server"),
    # Table writes: deltalake and pyiceberg commit them, loaded only when used.
    ("distfusion.table_write.iceberg", "pyiceberg.exceptions"),
    ("distfusion.table_write.iceberg", "pyiceberg.io.pyarrow"),
    ("distfusion.table_write.iceberg", "pyiceberg.manifest"),
    ("distfusion.table_write.iceberg", "pyiceberg.table"),
    ("distfusion.table_write.iceberg", "pyiceberg.transforms"),
    ("distfusion.table_write.iceberg", "pyiceberg.typedef"),
    ("distfusion.table_write.iceberg", "pyiceberg.types"),
    ("distfusion.table_write.sql", "deltalake"),
    ("distfusion.table_write.merge", "deltalake"),
    ("distfusion.table_write.sql", "pyiceberg.io.pyarrow"),
    # Mounted catalogs: a pyiceberg catalog is told apart and its errors caught when used.
    ("distfusion.table_write.catalogs", "pyiceberg.catalog"),
    ("distfusion.table_write.catalogs", "pyiceberg.exceptions"),
    ("distfusion.table_write.catalogs", "pyiceberg.transforms"),
    # Iceberg tables: pyiceberg plans them on the coordinator (pip install 'distfusion[iceberg]').
    ("distfusion.io.iceberg.filters", "pyiceberg"),
    ("distfusion.io.iceberg.plan_files", "pyiceberg.manifest"),
    ("distfusion.io.iceberg.plan_files", "pyiceberg.table"),
    ("distfusion.io.iceberg.plan_files", "pyiceberg.table.delete_file_index"),
    ("distfusion.io.iceberg.plan_files", "pyiceberg.transforms"),
    ("distfusion.io.iceberg.plan_files", "pyiceberg.typedef"),
    ("distfusion.io.iceberg.table", "pyiceberg"),
    ("distfusion.io.iceberg.table", "pyiceberg.manifest"),
}


def _modules() -> list[str]:
    names = []
    for path in sorted((SRC / "distfusion").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# Imports each module with no distfusion module loaded yet (third-party packages stay
# loaded: they cost a second per interpreter), so every module is an entry point once.
_IMPORT_EACH = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "distfusion" or m.startswith("distfusion.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc(limit=-3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *_modules()], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _function_imports(module: str) -> set[tuple[str, str]]:
    path = SRC / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                found |= {(module, alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                found.add((module, node.module or ""))
    return found


@pytest.mark.parametrize("module", _modules())
def test_function_level_imports_only_for_optional_dependencies(module):
    assert _function_imports(module) <= LAZY_IMPORTS


def test_context_holds_the_public_api_only():
    """``context.py`` defines the API classes; what runs a query is ``coordinator/``'s."""
    import distfusion.context as context

    defined = {
        name
        for name, obj in vars(context).items()
        if isinstance(obj, type) and obj.__module__ == "distfusion.context"
    }
    assert defined == {"DistributedContext", "DistributedDataFrame", "_ExplainDataFrame"}
    for name in context.__all__:
        assert hasattr(context, name), name


@pytest.mark.parametrize(
    "path",
    sorted((SRC / "distfusion").rglob("*.py")),
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_no_source_file_over_1000_lines(path):
    assert len(path.read_text().splitlines()) <= 1000, f"{path.relative_to(SRC)}: split it"


def test_no_private_name_is_imported_from_another_module():
    """A name shared between modules is public; ``_x`` stays inside its module."""
    private = []
    for path in [*SRC.rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distfusion"):
                private += [
                    f"{path.relative_to(REPO)}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert not private, private
