"""Spark SQL test-input files through the PySpark drop-in, with Spark as the oracle.

Each ``*.sql`` file of tests/spark_sql_inputs/ (and of the directory in
``DISTFUSION_SPARK_SQL_INPUTS``, e.g. a checkout's
``sql/core/src/test/resources/sql-tests/inputs``) is cut into statements, in
the format of Spark's own SQL test inputs: ``CREATE ... VIEW``, ``SET`` and
other statements that are not queries run on Spark itself, in file order;
every query is one test case, ``<file>:<line>``, comparing
``distfusion.spark.sql(spark, q)`` with ``spark.sql(q)`` on the same session
(never with golden files):

- Spark raises: the drop-in raises too (when planned or when collected);
- else the same column names, the same Arrow types (Spark's types, as
  ``toArrow()`` gives them) and the same rows, bit for bit (floats too), in
  order where the query has a top-level ``ORDER BY`` (rows tying on every
  sort key in any order), else as a multiset.

A query may run natively or on Spark SQL (a fallback: equal by construction);
the counts of both are printed and must match docs/spark.md. Session settings
a file changes are restored after it.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import sqlglot
import sqlglot.errors

import distfusion.spark
from distfusion.coordinator.statements import split_statements
from tests.compare import order_keys

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "tests" / "spark_sql_inputs"
_SETUP = re.compile(r"(?is)^\s*(create|set|drop|insert|use|cache|uncache|reset)\b")
_QUERY = re.compile(r"(?is)^\s*(\(\s*)*(select|with|values|from|table)\b")
_NONDETERMINISTIC = re.compile(
    r"(?i)\b(rand|randn|random|uuid|shuffle|current_\w+|now|localtimestamp|"
    r"input_file_\w+|monotonically_increasing_id|spark_partition_id)\b"
)


@dataclass(frozen=True)
class Statement:
    """One statement of an input file: its text, 1-based line, and whether it is a query."""

    file: str
    line: int
    sql: str
    query: bool

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def read_inputs(directory: Path) -> list[Statement]:
    """The statements of every ``*.sql`` file of ``directory`` (sorted), setup and queries.

    Statements neither setup nor query (``EXPLAIN``, ``DESC``, ...) and queries
    calling nondeterministic functions are left out.
    """
    out = []
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        pos = 0
        for sql in split_statements(text):
            start = text.find(sql, pos)
            pos = start + len(sql)
            line = text.count("\n", 0, start) + 1
            if _SETUP.match(sql):
                out.append(Statement(path.name, line, sql, query=False))
            elif _QUERY.match(sql) and not _NONDETERMINISTIC.search(sql):
                out.append(Statement(path.name, line, sql, query=True))
    return out


def _statements() -> list[Statement]:
    out = read_inputs(INPUTS)
    extra = os.environ.get("DISTFUSION_SPARK_SQL_INPUTS")
    if extra:
        out += read_inputs(Path(extra))
    return out


STATEMENTS = _statements()
QUERIES = [s for s in STATEMENTS if s.query]
RUNS: dict[str, str] = {}
"""Query id -> how it ran: ``native``, ``spark`` (a fallback) or ``error`` (Spark rejects it)."""


class FileSession:
    """The setup statements of one input file run on Spark, up to the query under test.

    Settings a ``SET`` changes are restored and the views a file made are
    dropped when another file starts, or when the module ends.
    """

    def __init__(self, spark) -> None:
        self.spark = spark
        self.file: str | None = None
        self.done = -1  # index in STATEMENTS of the last setup statement run
        self.conf: dict[str, str | None] = {}
        self.views: set[str] = set()

    def before(self, query: Statement) -> None:
        index = STATEMENTS.index(query)
        if query.file != self.file or index < self.done:
            self.reset()
            self.file = query.file
            self.done = next(i for i, s in enumerate(STATEMENTS) if s.file == query.file) - 1
        for i in range(self.done + 1, index):
            statement = STATEMENTS[i]
            if not statement.query:
                self._run(statement.sql)
        self.done = index

    def _run(self, sql: str) -> None:
        setting = re.match(r"(?is)^\s*set\s+([\w.]+)\s*=", sql)
        if setting and setting.group(1) not in self.conf:
            key = setting.group(1)
            self.conf[key] = self.spark.conf.get(key, None)
        view = re.match(r"(?is)^\s*create\s+(or\s+replace\s+)?temp(orary)?\s+view\s+(\w+)", sql)
        if view:
            self.views.add(view.group(3))
        try:
            self.spark.sql(sql).collect()
        except Exception:  # noqa: S110 (Spark rejects a setup statement: its queries show it)
            pass

    def reset(self) -> None:
        for key, value in self.conf.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)
        for view in self.views:
            self.spark.catalog.dropTempView(view)
        self.conf, self.views, self.file = {}, set(), None


@pytest.fixture(scope="module")
def inputs_session(spark_session):
    session = FileSession(spark_session)
    yield session
    session.reset()
    if RUNS:
        counts = Counter(RUNS.values())
        print(f"\nSpark SQL test inputs: {dict(counts)} of {len(RUNS)} queries")  # noqa: T201


def _value(v):
    """A value compared bit for bit: NaN equal to NaN, -0.0 apart from 0.0."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else v.hex())
    if isinstance(v, list):
        return ("list", tuple(_value(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((k, _value(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def _rows(table: pa.Table) -> list[tuple]:
    columns = [c.to_pylist() for c in table.columns]
    return [tuple(_value(v) for v in row) for row in zip(*columns, strict=True)]


def _sorted(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=repr)


def assert_same_rows(got: pa.Table, expected: pa.Table, sql: str) -> None:
    """Equal rows: as a multiset, and in order on the sort keys of a top-level ``ORDER BY``.

    Rows that tie on every sort key may come in any order in both engines;
    a sort by what the result does not hold is checked as a multiset only,
    ``LIMIT`` without ``ORDER BY`` (any rows) by its row count.
    """
    try:
        tree = sqlglot.parse_one(sql, dialect="spark")
    except sqlglot.errors.SqlglotError:
        tree = None
    if tree is not None and tree.args.get("limit") and not tree.args.get("order"):
        assert got.num_rows == expected.num_rows  # any rows: LIMIT without ORDER BY
        return
    g, e = _rows(got), _rows(expected)
    assert _sorted(g) == _sorted(e), f"got {got.to_pylist()}, expected {expected.to_pylist()}"
    if tree is None or tree.args.get("order") is None:
        return
    keys = order_keys(sql, expected.column_names)
    if keys is None:  # sorted by what the result does not hold: ties may come in any order
        return
    assert [tuple(r[k] for k in keys) for r in g] == [tuple(r[k] for k in keys) for r in e], (
        f"order: got {got.to_pylist()}, expected {expected.to_pylist()}"
    )


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_input_query_answers_as_spark(inputs_session, query):
    inputs_session.before(query)
    spark, sql = inputs_session.spark, query.sql
    try:
        expected = spark.sql(sql).toArrow()
    except Exception as spark_error:  # Spark's own: the drop-in must not answer either
        RUNS[query.id] = "error"
        try:
            distfusion.spark.sql(spark, sql).to_arrow_table()
        except Exception:  # noqa: S110 (Spark's class or distfusion's)
            return
        pytest.fail(f"Spark raises, the drop-in answers: {str(spark_error)[:300]}")
    df = distfusion.spark.sql(spark, sql)
    RUNS[query.id] = "spark" if df.fallback else "native"
    got = df.to_arrow_table()
    assert got.column_names == expected.column_names
    assert got.schema.types == expected.schema.types, (got.schema, expected.schema)
    assert_same_rows(got, expected, sql)


def counts_line(runs: dict[str, str]) -> str:
    """The sentence of docs/spark.md that counts how the committed inputs' queries ran."""
    counts = Counter(runs.values())
    files = len({q.file for q in QUERIES if q.id in runs})
    return (
        f"{len(runs)} queries in {files} files: {counts['native']} run natively, "
        f"{counts['spark']} on Spark SQL, {counts['error']} fail in Spark and in the drop-in."
    )


def test_counts_in_docs_are_the_inputs():
    """docs/spark.md states how the committed inputs ran (after every case above ran)."""
    ours = {q.id for q in QUERIES if (INPUTS / q.file).exists()}
    runs = {k: v for k, v in RUNS.items() if k in ours}
    if len(runs) < len(ours):
        pytest.skip("not every input query ran in this session (-k or a failure)")
    text = (ROOT / "docs" / "spark.md").read_text()
    match = re.search(r"<!-- spark-inputs:start -->\n(.*?)\n<!-- spark-inputs:end -->", text, re.S)
    assert match, "docs/spark.md lacks the spark-inputs markers"
    assert match.group(1).strip() == counts_line(runs), (
        f"docs/spark.md's counts differ; paste: {counts_line(runs)}"
    )
