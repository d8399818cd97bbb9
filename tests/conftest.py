"""Shared fixtures: TPC-H data generated with tpchgen-cli, the single-node oracle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from datafusion import SessionContext

from distfusion import tpch

REPO = Path(__file__).resolve().parent.parent
TPCH_SCALE = float(os.environ.get("DISTFUSION_TEST_SCALE", "0.1"))


@pytest.fixture(scope="session")
def tpch_dir() -> Path:
    """TPC-H at scale factor 0.1 (4 Parquet files per table), generated once and cached
    under ``data/`` (set ``DISTFUSION_TEST_DATA`` to use another directory).
    """
    path = Path(os.environ.get("DISTFUSION_TEST_DATA", REPO / "data" / f"tpch-sf{TPCH_SCALE:g}"))
    marker = path / ".complete"
    if not marker.exists():
        tpch.generate(TPCH_SCALE, path, parts=4)
        marker.touch()
    return path


@pytest.fixture(scope="session")
def oracle(tpch_dir) -> SessionContext:
    """Single-node DataFusion over the same files: the reference for every result."""
    ctx = SessionContext()
    tpch.register_tpch(ctx, tpch_dir)
    return ctx


def _local(request, workers: int):
    from distfusion import LocalRuntime

    return LocalRuntime(workers=workers)


FLIGHT_WORKERS = 3


@pytest.fixture(scope="session")
def flight_workers():
    """URLs of three Flight worker processes on 127.0.0.1 (free ports), started once
    per session and stopped at its end, even after a failure.
    """
    from tests.flight_cluster import start_workers, stop_workers

    procs = start_workers(FLIGHT_WORKERS)
    try:
        yield [p.url for p in procs]
    finally:
        stop_workers(procs)


def _flight(request, workers: int):
    from distfusion.runtime.flight import FlightRuntime

    return FlightRuntime(request.getfixturevalue("flight_workers")[:workers])


@pytest.fixture(scope="session")
def spark_session():
    """The one SparkSession of the test session: embedded ``local[2]``, where Spark
    retries failed task attempts (see :class:`~distfusion.runtime.spark.SparkRuntime`).
    """
    from distfusion.runtime.spark import SparkRuntime

    runtime = SparkRuntime(master="local[2]")
    yield runtime.spark
    runtime.close()


def _spark(request, workers: int):
    # Spark owns the task slots (2, from local[2]); ``workers`` only sizes the plan.
    from distfusion.runtime.spark import SparkRuntime

    return SparkRuntime(spark=request.getfixturevalue("spark_session"))


# Runtime name -> factory(request, workers). Each runtime module's tests extend this
# (spark, flight); the correctness suite runs over every entry.
RUNTIME_FACTORIES = {"local": _local, "flight": _flight, "spark": _spark}


@pytest.fixture(scope="session")
def runtime_for(request):
    """``runtime_for(name, workers)``: a runtime, created once per session and closed at the end."""
    cache: dict = {}

    def get(name: str, workers: int):
        key = (name, workers)
        if key not in cache:
            cache[key] = RUNTIME_FACTORIES[name](request, workers)
        return cache[key]

    yield get
    for runtime in cache.values():
        runtime.close()
