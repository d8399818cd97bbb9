"""Registering a table that is not there fails at once, naming the table and the path.

No runtime is involved: registration happens on the coordinator before any
query (what runtimes promise about bad input is in tests/contract/).
"""

from __future__ import annotations

import pytest

from distfusion import DistributedContext, LocalRuntime, PlanningError


@pytest.fixture
def ctx():
    runtime = LocalRuntime(workers=1)
    yield DistributedContext(runtime=runtime)
    runtime.close()


def test_missing_file_at_registration(tmp_path, ctx):
    missing = tmp_path / "nothing-here.parquet"
    with pytest.raises(PlanningError) as info:
        ctx.register_parquet("m", missing)
    msg = str(info.value)
    assert str(missing) in msg and "'m'" in msg and "no such file or directory" in msg
    assert "m" not in ctx.table_names()
    # The table was not half-registered: a query on it is an unknown-table error.
    with pytest.raises(PlanningError, match="not found"):
        ctx.sql("SELECT * FROM m")
    with pytest.raises(PlanningError, match="no such file or directory"):
        ctx.register_csv("m", tmp_path / "nothing-here.csv")


def test_empty_directory_at_registration(tmp_path, ctx):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlanningError, match="empty"):
        ctx.register_parquet("m", tmp_path / "empty")
