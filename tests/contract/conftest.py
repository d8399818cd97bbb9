"""The contract suite: what every runtime of the registry promises, one test per promise.

Every test here takes the ``runtime`` fixture and so runs once per runtime of
:data:`distfusion.runtime.registry.RUNTIMES` (``local``, ``flight``, ``spark``):
a new runtime gets the whole suite by its registry line. A promise a runtime
does not keep yet is declared on the test with :func:`gap`, a strict xfail
naming the exception and the reason (ibis's ``notimpl``): when it is fixed, the
test fails until the gap is removed. Runtime-only behaviour (Spark retries,
Flight TLS and tokens, killed workers) is in ``tests/runtime/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from distfusion.planner.config import RuntimeProfile
from distfusion.runtime.registry import RUNTIMES
from distfusion.stages import StageGraph

WORKERS = {"local": 3, "flight": 3, "spark": 2}
"""Workers of each runtime in the suite (Flight: the session's three worker
processes; Spark: the embedded ``local[2]`` session's slots). Default 2."""


def gap(runtime: str, raises: type[BaseException], reason: str):
    """Declare that ``runtime`` breaks the test's promise, raising ``raises``, because ``reason``."""
    return pytest.mark.gap(runtime=runtime, raises=raises, reason=reason)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gap(runtime, raises, reason): a declared contract gap (strict xfail)"
    )


@pytest.fixture(params=list(RUNTIMES))
def runtime_name(request) -> str:
    """The name of each runtime in the registry, one test per runtime."""
    for mark in request.node.iter_markers("gap"):
        if mark.kwargs["runtime"] == request.param:
            request.applymarker(
                pytest.mark.xfail(
                    raises=mark.kwargs["raises"], reason=mark.kwargs["reason"], strict=True
                )
            )
    return request.param


@pytest.fixture
def workers(runtime_name) -> int:
    return WORKERS.get(runtime_name, 2)


@pytest.fixture
def runtime(runtime_name, workers, runtime_for) -> RecordingRuntime:
    """The session's runtime ``runtime_name``, recording the graphs it is asked to run."""
    rt = RecordingRuntime(runtime_for(runtime_name, workers))
    wait_idle(rt)
    return rt


class RecordingRuntime:
    """The real runtime, wrapped: it records every graph whose head it streams.

    Its profile (``profile()``) is the inner runtime's, so each runtime is
    planned here as it is outside the suite; every other attribute (Spark's
    session, optional abilities) is the inner runtime's too. ``close`` does
    nothing: the inner runtime is shared by the test session.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.executed: list[StageGraph] = []

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def profile(self) -> RuntimeProfile:
        return RuntimeProfile.of(self.inner)

    def num_workers(self) -> int:
        return self.inner.num_workers()

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        self.executed.append(graph)
        return self.inner.execute(graph)

    def start_query(self, query_id: str):
        return _RecordingRun(self, self.inner.start_query(query_id))

    def stats(self) -> dict:
        return self.inner.stats()

    def close(self) -> None:
        pass


class _RecordingRun:
    """A QueryRun that records the graph whose head stage it streams (the rest: the inner run's)."""

    def __init__(self, runtime: RecordingRuntime, inner) -> None:
        self.runtime = runtime
        self.inner = inner

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def run_stages(self, graph: StageGraph, stage_ids: list[int]):
        return self.inner.run_stages(graph, stage_ids)

    def stream_head(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        self.runtime.executed.append(graph)
        return self.inner.stream_head(graph)

    def close(self) -> None:
        self.inner.close()


def idle(runtime) -> bool:
    """True when no worker of ``runtime`` holds a task, a byte or (Flight) a query."""
    return all(
        s["live_tasks"] == 0 and s["bytes_held"] == 0 and s.get("live_queries", 0) == 0
        for s in runtime.stats().values()
    )


def wait_idle(runtime, timeout_s: float = 60.0) -> float:
    """Wait until :func:`idle`; the seconds it took.

    Fails after ``timeout_s`` (wide: a busy machine may take seconds to stop a
    cancelled Spark task).

    Workers free a cancelled query's state asynchronously (a Flight worker on
    its next call, Spark when its job group is cancelled).
    """
    start = time.monotonic()
    while not idle(runtime):
        assert time.monotonic() - start < timeout_s, runtime.stats()
        time.sleep(0.02)
    return time.monotonic() - start
