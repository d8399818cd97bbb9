"""Each extra of distfusion, installed alone in a fresh venv, runs its feature.

``pip install 'distfusion[spark]'`` once lacked pandas, which PySpark's
``mapInArrow`` (``to_spark()``) requires: the test extra brought it, so the
suite never saw it. Here each extra (and the core alone) is installed from a
wheel of this checkout into a venv without system site packages, and a
script under ``tests/extras/`` runs its feature once there.

Installing takes 1-2 minutes per venv from the package mirror, so the tests
run only with ``DISTFUSION_CHECK_EXTRAS=1`` (``.ci/run`` sets it; they are in
the default selection, not ``slow``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO

CHECKS = Path(__file__).parent / "extras"
EXTRAS = ["core", "spark", "connect", "datagen", "delta", "iceberg"]

pytestmark = pytest.mark.skipif(
    os.environ.get("DISTFUSION_CHECK_EXTRAS") != "1",
    reason="installs each extra into a fresh venv (1-2 min each): set DISTFUSION_CHECK_EXTRAS=1",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout (no dependencies), built once."""
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)]
    subprocess.run(cmd, check=True, timeout=600)
    return next(out.glob("distfusion-*.whl"))


def _clean_env() -> dict[str, str]:
    """This environment without what would point the venv at this checkout or this venv."""
    env = dict(os.environ)
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        env.pop(var, None)
    return env


def _venv_with(path: Path, wheel: Path, extra: str) -> Path:
    """A fresh venv at ``path`` holding distfusion with ``extra`` ("core": none); its python."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    spec = str(wheel) if extra == "core" else f"{wheel}[{extra}]"
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
        timeout=1200,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"pip install {spec}:\n{proc.stderr[-4000:]}"
    return python


def _iceberg_table(directory: Path) -> tuple[str, int]:
    """An Iceberg table written here (its SQL catalog is no part of the extra); metadata, rows."""
    from tests.iceberg_tables import local_catalog

    directory.mkdir()
    catalog = local_catalog("extras", directory)
    catalog.create_namespace("db")
    data = pa.table({"k": pa.array([i % 5 for i in range(100)], pa.int64()), "v": list(range(100))})
    table = catalog.create_table("db.t", schema=data.schema)
    table.append(data)
    table.append(data.slice(0, 10))
    return table.metadata_location, 110


@pytest.mark.parametrize("extra", EXTRAS)
def test_an_extra_alone_runs_its_feature(extra, wheel, tmp_path):
    python = _venv_with(tmp_path / "venv", wheel, extra)
    work = tmp_path / "work"
    work.mkdir()
    args = [str(work)]
    if extra == "iceberg":
        metadata, rows = _iceberg_table(tmp_path / "iceberg")
        args += [metadata, str(rows)]
    proc = subprocess.run(
        [str(python), str(CHECKS / f"check_{extra}.py"), *args],
        cwd=work,  # not the checkout: distfusion comes from the venv
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{extra}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip().splitlines()[-1] == "ok"
