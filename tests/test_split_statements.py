"""``split_statements``: SQL text into statements, with sqlglot's tokenizer.

A ``;`` splits only between tokens: not inside comments, quoted strings,
quoted identifiers, dollar-quoted or escape strings. Each piece is checked
against DataFusion itself where it can be run.
"""

from __future__ import annotations

import pytest
from datafusion import SessionContext

from distfusion import tpch
from distfusion.coordinator.statements import plan_statements, split_statements

CASES = {
    "block-comment": ("SELECT 1 /* ; */ ; SELECT 'a;b'", ["SELECT 1", "SELECT 'a;b'"]),
    "nested-comment": ("SELECT 1 /* a /* ; */ ; */; SELECT 2", ["SELECT 1", "SELECT 2"]),
    "line-comment": ("SELECT 1 -- x; y\n; SELECT 2 -- z;", ["SELECT 1", "SELECT 2"]),
    "doubled-quote": ("SELECT 'it''s;'; SELECT 2", ["SELECT 'it''s;'", "SELECT 2"]),
    "backslash-is-literal": (r"SELECT 'a\', 'b;c'; SELECT 2", [r"SELECT 'a\', 'b;c'", "SELECT 2"]),
    "escape-string": (r"SELECT E'a\';b'; SELECT 2", [r"SELECT E'a\';b'", "SELECT 2"]),
    "dollar-quoted": ("SELECT $$a;b$$; SELECT 2", ["SELECT $$a;b$$", "SELECT 2"]),
    "tagged-dollar": ("SELECT $t$a;$$b$t$; SELECT 3", ["SELECT $t$a;$$b$t$", "SELECT 3"]),
    "quoted-identifier": ('SELECT 1 AS "x;y"; SELECT 2', ['SELECT 1 AS "x;y"', "SELECT 2"]),
    "empty-statements": (";; SELECT 1 ;\n; /* only */ ; SELECT 2;", ["SELECT 1", "SELECT 2"]),
    "inner-comment-kept": ("SELECT 1 /* c */ + 1", ["SELECT 1 /* c */ + 1"]),
    "nothing": ("  -- just a comment\n", []),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_statements(name):
    sql, expected = CASES[name]
    assert split_statements(sql) == expected


@pytest.mark.parametrize("name", [n for n, (_, stmts) in CASES.items() if stmts])
def test_every_piece_runs_on_datafusion(name):
    ctx = SessionContext()
    for stmt in split_statements(CASES[name][0]):
        assert len(ctx.sql(stmt).collect()) == 1


def test_string_values_survive():
    ctx = SessionContext()
    got = [
        ctx.sql(s).to_pylist()[0]["v"]
        for s in split_statements(r"SELECT 'a;b' AS v; SELECT E'c\';d' AS v; SELECT $x$e;f$x$ AS v")
    ]
    assert got == ["a;b", "c';d", "e;f"]


def test_unterminated_text_is_left_to_datafusion():
    assert split_statements("SELECT 'abc; SELECT 2") == ["SELECT 'abc; SELECT 2"]
    with pytest.raises(Exception, match="Unterminated string literal"):
        plan_statements(SessionContext(), "SELECT 'abc; SELECT 2")


@pytest.mark.parametrize("q", tpch.QUERIES)
def test_tpch_queries_split_into_their_statements(q):
    stmts = split_statements(tpch.query(q))
    assert len(stmts) == (3 if q == 15 else 1)
    assert all(s.split()[0].lower() in ("select", "with", "create", "drop") for s in stmts)
