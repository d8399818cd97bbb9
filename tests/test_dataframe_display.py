"""How a DistributedDataFrame shows itself: as DataFusion's does (issue 26, item 7)."""

from __future__ import annotations

import pytest

import distfusion
from distfusion import DistributedConfig, DistributedContext, LocalRuntime, tpch


class _CountingRuntime(LocalRuntime):
    """A local runtime that counts the stage graphs it is handed."""

    def __init__(self) -> None:
        super().__init__(workers=2)
        self.started = 0

    def execute(self, graph):
        self.started += 1
        return super().execute(graph)

    def start_query(self, query_id):
        self.started += 1
        return super().start_query(query_id)


@pytest.fixture
def ctx(tpch_dir):
    runtime = _CountingRuntime()
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=2))
    tpch.register_tpch(ctx, tpch_dir)
    yield ctx
    ctx.close()


def test_repr_shows_the_first_rows_as_datafusion(ctx, oracle):
    """As DataFusion's ``repr`` (issue 41, item 6): the query runs with a LIMIT, once."""
    query = "SELECT l_orderkey, l_quantity FROM lineitem WHERE l_quantity > 45 ORDER BY 1, 2"
    df = ctx.sql(query)
    assert repr(df) == repr(oracle.sql(query))
    assert "Data truncated." in repr(df)
    assert ctx.runtime.started == 2 and df.metrics() is None  # its LIMIT copy ran, twice


def test_repr_html_shows_the_first_rows(ctx):
    df = ctx.sql("SELECT n_nationkey, n_name FROM nation ORDER BY n_nationkey")
    html = df._repr_html_()
    assert html.count("<tr>") == 1 + distfusion.context.HTML_ROWS  # header + rows
    assert "<td>0</td><td>ALGERIA</td>" in html
    assert "Stage" not in html  # the plan is behind explain(format="html")
    assert "Stage" in df.explain(format="html")


def test_show_runs_the_query_with_its_limit(ctx, capsys):
    df = ctx.sql("SELECT l_orderkey FROM lineitem")
    df.show(5)
    assert capsys.readouterr().out.count("\n") >= 5
    assert df._head(5).num_rows == 5
    assert df.metrics() is None  # the query itself never ran whole: its LIMIT 5 copy did


def test_explain_takes_datafusions_argument_order(ctx):
    df = ctx.sql("SELECT count(*) FROM orders")
    assert df.explain(True) == df.explain(verbose=True)  # verbose first, as in DataFusion
    assert ctx.runtime.started == 0  # verbose does not run the query; analyze would


def test_query_cancelled_error_keeps_its_old_name():
    assert distfusion.QueryCancelled is distfusion.QueryCancelledError
    assert issubclass(distfusion.QueryCancelledError, distfusion.DistfusionError)


def test_show_off_a_terminal_prints_what_datafusion_prints(ctx, oracle, capsys):
    """16 columns, none wrapped or cut (issue 41, item 7); pytest's capture is no terminal."""
    for query, num in (
        ("SELECT * FROM lineitem ORDER BY l_orderkey, l_linenumber", 5),  # 16 columns
        ("SELECT n_name, NULL AS nothing FROM nation ORDER BY n_nationkey", 3),
        ("SELECT n_name FROM nation WHERE n_nationkey < 0", 20),  # no rows
    ):
        ctx.sql(query).show(num)
        ours = capsys.readouterr().out
        oracle.sql(query).show(num)
        assert ours == capsys.readouterr().out, query
        assert "…" not in ours
