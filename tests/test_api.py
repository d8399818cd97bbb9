"""The public API: what ``distfusion`` exports is documented and importable without Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import distfusion

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


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
