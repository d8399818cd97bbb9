"""The public API: what ``distfusion`` exports is documented and importable without Spark."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import distfusion

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_every_export_exists_and_has_a_docstring():
    for name in distfusion.__all__:
        obj = getattr(distfusion, name)
        assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


def test_runtimes_and_extension_points_are_in_the_readme():
    for name in (
        "DistributedContext",
        "LocalRuntime",
        "SparkRuntime",
        "FlightRuntime",
        "StaticWorkerResolver",
        "DynamicWorkerResolver",
        "WorkerTransport",
        "TaskEstimator",
        "DistributedConfig",
        "PlanningError",
        "TaskError",
    ):
        assert name in distfusion.__all__
        assert name in README, f"{name} is exported but the README never mentions it"


def test_import_does_not_load_pyspark_or_flight():
    """Optional heavy dependencies load only in the runtime that needs them."""
    code = (
        "import sys, distfusion; "
        "print(sorted(m for m in ('pyspark', 'pyarrow.flight') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _parameters(fn) -> list[tuple[str, object, object]]:
    """(name, kind, default) of every parameter: a signature without its annotations."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_dataframe_api_mirrors_datafusions_signatures():
    """Every DataFrame method and reader named as DataFusion's takes DataFusion's arguments."""
    from datafusion import DataFrame, SessionContext

    from distfusion.dataframe import Readers, Transformations

    pairs = [(Transformations, DataFrame), (Readers, SessionContext)]
    compared = 0
    for ours, theirs in pairs:
        for name, fn in vars(ours).items():
            if name.startswith("_") and name != "__getitem__" or not callable(fn):
                continue
            if hasattr(theirs, name):
                assert _parameters(fn) == _parameters(getattr(theirs, name)), name
                compared += 1
    assert compared >= 40


def test_dataframe_api_is_documented():
    from distfusion.dataframe import Readers, Transformations

    doc = (REPO / "docs" / "dataframe.md").read_text()
    for cls in (Transformations, Readers):
        for name in vars(cls):
            if not name.startswith("_"):
                assert f"{name}(" in doc, f"{name} is not in docs/dataframe.md"
