"""Fixtures of the planner tests: LocalRuntimes, and contexts over the small tables."""

from __future__ import annotations

import pytest

from distfusion import LocalRuntime
from tests.planner.helpers import (
    LARGE,
    SMALL,
    TABLES,
    make_contexts,
)


@pytest.fixture(scope="package")
def runtimes():
    """One LocalRuntime per worker count 1..4, closed after the last planner test."""
    rts = {n: LocalRuntime(workers=n) for n in range(1, 5)}
    yield rts
    for rt in rts.values():
        rt.close()


@pytest.fixture
def small(runtimes):
    """Contexts over t, u, e on 4 workers, 4 tasks per stage, small sides broadcast."""
    return make_contexts(runtimes[4], TABLES, **SMALL)


@pytest.fixture
def large(runtimes):
    """As ``small``, but no equi-join side is ever broadcast."""
    return make_contexts(runtimes[4], TABLES, **LARGE)
