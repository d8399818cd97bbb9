"""A randomized differential fuzzer: random SQL over random tables, distfusion against DataFusion.

The way SQLancer and DataFusion's own fuzz tests find optimizer bugs: a seeded
generator (:class:`QueryGen`, plain ``random.Random``: a seed and an index give
the same query on every machine) builds small tables with NULLs, duplicates,
skewed keys, an empty table and the Arrow types the planner distinguishes, and
queries over them: joins of every type (inner, left, right, full, semi, anti,
``NOT IN`` over NULLs, non-equi and cross), grouped and global aggregates with
DISTINCT and HAVING, window functions with and without PARTITION BY and frames,
set operations, scalar/IN/EXISTS subqueries (correlated and not), CTEs (also
used twice: joined with themselves, both sides of a ``UNION ALL``, two scalar
subqueries), self joins, ``first_value``/``last_value`` with ``IGNORE NULLS``
(aggregates and windows), ``count(DISTINCT ...)`` over outer joins grouped by
a ``CASE`` with ``IS NULL``, CASE, casts, ORDER BY with LIMIT and OFFSET. Each
query runs on single-node DataFusion (the oracle) and distributed, on 1-4
workers with tiny tasks, a broadcast threshold of 0 or 1 GiB, and forced
shuffles with several tasks per stage (:data:`CONFIGS`), and the results are
compared with :func:`tests.compare.assert_same_result`.

Float columns hold multiples of 0.25 (and NaN, -0.0) so that a sum is exact in
any order: a mismatch is a bug, never rounding. ``LIMIT`` only follows an
``ORDER BY`` of every output column, so the rows kept are determined.

Run ``python -m tests.fuzz_sql --queries 1000 --seed 0`` (``make fuzz``) for a
report; tests/test_fuzz.py runs a fast seeded profile in the default suite.
With ``--keep``, each finding is shrunk (fewer rows, fewer clauses) and saved
under ``tests/fuzz_regressions/``, which tests/test_fuzz_regressions.py replays.
"""

from __future__ import annotations

import argparse
import decimal
import hashlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import sqlglot
from datafusion import SessionContext
from sqlglot import exp

from distfusion import DistributedConfig, DistributedContext
from tests.compare import assert_same_result, is_ordered

GIB = 1024**3


# ----------------------------------------------------------------- tables
def make_tables(seed: int) -> dict[str, pa.Table]:
    """Three tables ``t0``, ``t1``, ``t2`` (``t2`` may be empty) with the same columns.

    Columns: ``k`` int64 key (skewed, NULLs), ``k32`` int32, ``v`` float64
    (multiples of 0.25, NaN, -0.0, NULLs), ``d`` decimal(12,2), ``s`` string
    (duplicates, NULLs), ``sv`` string_view, ``dt`` date32, ``ts``
    timestamp[us], ``tz`` timestamp[ms, UTC], ``b`` bool, ``i8`` int8.
    """
    rnd = random.Random(seed)
    out = {}
    for i, rows in enumerate((rnd.randint(8, 40), rnd.randint(5, 30), rnd.choice([0, 0, 3, 12]))):
        out[f"t{i}"] = _table(rnd, rows)
    return out


def _maybe(rnd: random.Random, value, null_rate: float = 0.15):
    return None if rnd.random() < null_rate else value


def _table(rnd: random.Random, rows: int) -> pa.Table:
    keys = [_maybe(rnd, rnd.choice([1, 1, 1, 2, 2, 3, 4, 5, 7, 9])) for _ in range(rows)]
    floats = []
    for _ in range(rows):
        x = rnd.random()
        floats.append(
            None
            if x < 0.1
            else float("nan")
            if x < 0.15
            else -0.0
            if x < 0.2
            else rnd.randint(-40, 40) / 4
        )
    words = ["a", "b", "bb", "c", "", "Z"]
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "k32": pa.array([_maybe(rnd, rnd.randint(-3, 3)) for _ in range(rows)], pa.int32()),
            "v": pa.array(floats, pa.float64()),
            "d": pa.array(
                [
                    _maybe(rnd, decimal.Decimal(rnd.randint(-9999, 9999)).scaleb(-2))
                    for _ in range(rows)
                ],
                pa.decimal128(12, 2),
            ),
            "s": pa.array([_maybe(rnd, rnd.choice(words)) for _ in range(rows)], pa.string()),
            "sv": pa.array([_maybe(rnd, rnd.choice(words)) for _ in range(rows)], pa.string_view()),
            "dt": pa.array(
                [_maybe(rnd, rnd.randint(19000, 19010)) for _ in range(rows)], pa.date32()
            ),
            "ts": pa.array(
                [_maybe(rnd, rnd.randint(0, 5) * 3_600_000_000) for _ in range(rows)],
                pa.timestamp("us"),
            ),
            "tz": pa.array(
                [_maybe(rnd, rnd.randint(0, 5) * 86_400_000) for _ in range(rows)],
                pa.timestamp("ms", tz="UTC"),
            ),
            "b": pa.array([_maybe(rnd, rnd.random() < 0.5) for _ in range(rows)], pa.bool_()),
            "i8": pa.array([_maybe(rnd, rnd.randint(-5, 5)) for _ in range(rows)], pa.int8()),
        }
    )


# ----------------------------------------------------------------- queries
NUMERIC = ["k", "k32", "v", "d", "i8"]
GROUPABLE = ["k", "k32", "s", "sv", "dt", "ts", "tz", "b", "i8", "d", "v"]
ORDERABLE = ["k", "k32", "s", "dt", "ts", "i8", "d"]
JOIN_KEYS = [("k", "k"), ("k32", "k32"), ("s", "s"), ("dt", "dt"), ("k", "i8"), ("sv", "s")]


class QueryGen:
    """Random SQL over ``t0``, ``t1``, ``t2`` from a seed (see the module docs)."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def table(self) -> str:
        return self.r.choice(["t0", "t0", "t1", "t2"])

    def pred(self, a: str) -> str:
        r = self.r
        c = r.choice(
            [
                f"{a}.k > {r.randint(0, 5)}",
                f"{a}.v >= {r.randint(-5, 5)}",
                f"{a}.s IS NULL",
                f"{a}.s <> 'a'",
                f"{a}.b",
                f"NOT {a}.b",
                f"{a}.k IN (1, 3, NULL)",
                f"{a}.k NOT IN (2, 5)",
                f"{a}.d BETWEEN -10 AND 50",
                f"{a}.dt >= DATE '2022-01-05'",
                f"{a}.sv LIKE 'b%'",
                f"{a}.k32 IS NOT NULL",
                f"COALESCE({a}.i8, 0) <> 1",
                f"isnan({a}.v)",
            ]
        )
        if r.random() < 0.3:
            c = f"({c} {r.choice(['AND', 'OR'])} {self.pred(a)})"
        return c

    def scalar(self, a: str) -> str:
        r = self.r
        return r.choice(
            [
                f"{a}.k",
                f"{a}.k + {a}.k32",
                f"{a}.v * 2",
                f"{a}.d",
                f"{a}.d * {a}.k",
                f"{a}.s",
                f"upper({a}.sv)",
                f"CASE WHEN {a}.v > 0 THEN 'p' WHEN {a}.v < 0 THEN 'n' ELSE 'z' END",
                f"CAST({a}.k AS VARCHAR)",
                f"CAST({a}.i8 AS BIGINT)",
                f"CAST({a}.d AS DOUBLE)",
                f"{a}.dt",
                f"{a}.ts",
                f"{a}.tz",
                f"{a}.b",
                f"COALESCE({a}.s, '-')",
                f"length({a}.s)",
                f"{a}.k % 3",
                f"abs({a}.i8)",
                f"date_trunc('day', {a}.ts)",
            ]
        )

    def agg(self, a: str) -> str:
        r = self.r
        n = r.choice(NUMERIC)
        return r.choice(
            [
                "count(*)",
                f"count({a}.{r.choice(GROUPABLE)})",
                f"sum({a}.{n})",
                f"min({a}.{r.choice(ORDERABLE)})",
                # Not over v: DataFusion's grouped min/max over a float with NaN
                # depends on how rows fall into batches (tests/compare.py, rules).
                f"max({a}.{r.choice(ORDERABLE)})",
                f"avg({a}.{n})",
                f"count(DISTINCT {a}.{r.choice(GROUPABLE)})",
                f"sum(DISTINCT {a}.{r.choice(['k', 'k32', 'd', 'i8'])})",
                f"bool_and({a}.b)",
                f"bool_or({a}.b)",
                f"min({a}.s)",
                f"array_length(array_agg({a}.k))",
                f"string_agg({a}.s, ',' ORDER BY {a}.s)",
                f"first_value({a}.k ORDER BY {a}.k, {a}.s)",
                self.ignore_nulls_agg(a),
            ]
        )

    def ignore_nulls_agg(self, a: str) -> str:
        """``first_value``/``last_value`` ``IGNORE NULLS``, ordered by the value itself.

        Ordered by the value first, ties in the order hold equal values: the
        answer does not depend on the input order.
        """
        r = self.r
        c = r.choice(ORDERABLE)
        fn = r.choice(["first_value", "last_value"])
        direction = r.choice(["", " DESC", " NULLS FIRST", " DESC NULLS LAST"])
        return f"{fn}({a}.{c} ORDER BY {a}.{c}{direction}) IGNORE NULLS"

    def from_clause(self) -> tuple[str, list[str]]:
        """A FROM clause and the aliases whose columns are visible."""
        r = self.r
        if r.random() < 0.45:
            return f"{self.table()} a", ["a"]
        ka, kb = r.choice(JOIN_KEYS)
        if r.random() < 0.2:  # a self join: one table, read twice in one plan
            t = self.table()
            jt = r.choice(["JOIN", "LEFT JOIN", "FULL JOIN"])
            return f"{t} a {jt} {t} b ON a.{ka} = b.{kb}", ["a", "b"]
        jt = r.choice(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN", "CROSS JOIN", "JOIN"])
        if jt == "CROSS JOIN":
            return f"{self.table()} a CROSS JOIN {self.table()} b", ["a", "b"]
        on = f"a.{ka} = b.{kb}"
        x = r.random()
        if x < 0.15:
            on = "a.k < b.k"  # non-equi
        elif x < 0.35:
            on += f" AND {self.pred('b')}"
        return f"{self.table()} a {jt} {self.table()} b ON {on}", ["a", "b"]

    def select_query(self, depth: int = 0) -> str:
        r = self.r
        frm, aliases = self.from_clause()
        where = f" WHERE {self.pred(r.choice(aliases))}" if r.random() < 0.6 else ""
        if r.random() < 0.35 and depth < 2:
            where += (" AND " if where else " WHERE ") + self.subquery_pred(aliases[0], depth)
        shape = r.random()
        if shape < 0.4:  # grouped aggregate
            a = r.choice(aliases)
            keys = r.sample(GROUPABLE, r.randint(1, 2))
            gcols = [f"{a}.{k}" for k in keys]
            sel = [f"{g} AS g{i}" for i, g in enumerate(gcols)]
            sel += [f"{self.agg(r.choice(aliases))} AS x{i}" for i in range(r.randint(1, 3))]
            having = f" HAVING count(*) > {r.randint(0, 2)}" if r.random() < 0.3 else ""
            return f"SELECT {', '.join(sel)} FROM {frm}{where} GROUP BY {', '.join(gcols)}{having}"
        if shape < 0.55:  # global aggregate
            sel = [f"{self.agg(r.choice(aliases))} AS x{i}" for i in range(r.randint(1, 3))]
            return f"SELECT {', '.join(sel)} FROM {frm}{where}"
        if shape < 0.75:  # window
            a = r.choice(aliases)
            part = f"PARTITION BY {a}.{r.choice(GROUPABLE)} " if r.random() < 0.7 else ""
            order_cols = r.sample(ORDERABLE, 2)
            order = ", ".join(f"{a}.{c} NULLS FIRST" for c in order_cols)
            fn = r.choice(
                [
                    "row_number()",
                    "rank()",
                    "dense_rank()",
                    f"sum({a}.k)",
                    f"count({a}.s)",
                    f"lag({a}.k)",
                    f"lead({a}.s, 1, 'x')",
                    f"max({a}.d)",
                    "IGNORE_NULLS",
                ]
            )
            if fn == "IGNORE_NULLS":
                # Ordered by the value itself first: rows tied in the order hold
                # equal values, so the default RANGE frame's answer is determined.
                c = r.choice(ORDERABLE)
                fn = f"{r.choice(['first_value', 'last_value'])}({a}.{c}) IGNORE NULLS"
                nulls = r.choice(["NULLS FIRST", "NULLS LAST"])
                order = f"{a}.{c} {r.choice(['ASC', 'DESC'])} {nulls}, {order}"
            frame = ""
            if fn.startswith(("sum", "count", "max")) and r.random() < 0.5:
                frame = r.choice(
                    [
                        " ROWS BETWEEN 1 PRECEDING AND CURRENT ROW",
                        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING",
                        " RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
                    ]
                )
            # Ties in the window order make row_number/lag depend on input order:
            # order by every column that identifies a row well enough, and compare
            # only functions that are order-insensitive under ties.
            if fn in ("row_number()",) or fn.startswith(("lag", "lead")) or "ROWS" in frame:
                fn, frame = r.choice(["rank()", "dense_rank()", f"count({a}.s)"]), ""
            cols = [self.scalar(r.choice(aliases)) for _ in range(r.randint(1, 2))]
            sel = [f"{c} AS c{i}" for i, c in enumerate(cols)]
            sel.append(f"{fn} OVER ({part}ORDER BY {order}{frame}) AS w")
            return f"SELECT {', '.join(sel)} FROM {frm}{where}"
        cols = [self.scalar(r.choice(aliases)) for _ in range(r.randint(1, 3))]
        distinct = "DISTINCT " if r.random() < 0.2 else ""
        return f"SELECT {distinct}{', '.join(f'{c} AS c{i}' for i, c in enumerate(cols))} FROM {frm}{where}"

    def subquery_pred(self, a: str, depth: int) -> str:
        r = self.r
        t = self.table()
        col, other = r.choice([("k", "k"), ("s", "s"), ("k32", "k32"), ("k", "i8")])
        corr = (
            f" AND s.{r.choice(['k', 'k32'])} = {a}.{r.choice(['k', 'k32'])}"
            if r.random() < 0.5
            else ""
        )
        inner_where = f"WHERE {self.pred('s')}" if r.random() < 0.5 else "WHERE TRUE"
        return r.choice(
            [
                f"{a}.{col} IN (SELECT s.{other} FROM {t} s {inner_where}{corr})",
                f"{a}.{col} NOT IN (SELECT s.{other} FROM {t} s {inner_where}{corr})",
                f"EXISTS (SELECT 1 FROM {t} s {inner_where}{corr})",
                f"NOT EXISTS (SELECT 1 FROM {t} s {inner_where}{corr})",
                f"{a}.k > (SELECT avg(s.k) FROM {t} s {inner_where}{corr})",
                f"{a}.k = (SELECT max(s.k) FROM {t} s {inner_where})",
            ]
        )

    def cte_used_twice(self) -> str:
        """A grouped CTE read twice: self-joined, both sides of a UNION ALL, or two subqueries."""
        r = self.r
        key = r.choice(["k", "k32", "s", "dt", "i8"])
        where = f" WHERE {self.pred('a')}" if r.random() < 0.5 else ""
        inner = (
            f"SELECT a.{key} AS g, {self.agg('a')} AS x, count(*) AS n "
            f"FROM {self.from_clause()[0]}{where} GROUP BY a.{key}"
        )
        shape = r.choice(["join", "left", "union", "scalar"])
        if shape == "join":
            return f"WITH c AS ({inner}) SELECT c1.g, c1.x, c2.n FROM c c1 JOIN c c2 ON c1.g = c2.g"
        if shape == "left":
            return (
                f"WITH c AS ({inner}) SELECT c1.g, c1.n, c2.x FROM c c1 "
                "LEFT JOIN c c2 ON c1.n = c2.n + 1"
            )
        if shape == "union":
            return (
                f"WITH c AS ({inner}) SELECT u.g, sum(u.n) AS n FROM "
                "(SELECT g, n FROM c UNION ALL SELECT g, n FROM c WHERE n > 1) u GROUP BY u.g"
            )
        return (
            f"WITH c AS ({inner}) SELECT (SELECT count(*) FROM c) AS n1, "
            "(SELECT sum(n) FROM c) AS n2, (SELECT count(*) FROM c c1 JOIN c c2 ON c1.g = c2.g) AS n3"
        )

    def distinct_counts_over_outer_join(self) -> str:
        """Two ``count(DISTINCT ...)`` over an outer join, grouped by a CASE with ``IS NULL``."""
        r = self.r
        ka, kb = r.choice(JOIN_KEYS)
        jt = r.choice(["LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
        side = r.choice(["a", "b"])
        group = (
            f"CASE WHEN {side}.k IS NULL THEN 'none' WHEN {side}.k > {r.randint(1, 4)} "
            "THEN 'big' ELSE 'small' END"
        )
        d1, d2 = r.sample(GROUPABLE, 2)
        where = f" WHERE {self.pred(r.choice(['a', 'b']))}" if r.random() < 0.3 else ""
        return (
            f"SELECT {group} AS g, count(DISTINCT a.{d1}) AS x0, count(DISTINCT b.{d2}) AS x1, "
            f"count(*) AS n FROM {self.table()} a {jt} {self.table()} b ON a.{ka} = b.{kb}"
            f"{where} GROUP BY {group}"
        )

    def query(self) -> str:
        """One random query (a statement returning rows)."""
        r = self.r
        x = r.random()
        if x < 0.06:
            q = self.cte_used_twice()
        elif x < 0.1:
            q = self.distinct_counts_over_outer_join()
        elif x < 0.12:  # set operation over one-column (or two-column) selects
            cols = r.choice(["k", "s", "k, s", "dt", "d"])
            op = r.choice(
                ["UNION", "UNION ALL", "INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"]
            )
            q = (
                f"SELECT {cols} FROM {self.table()} a WHERE {self.pred('a')} "
                f"{op} SELECT {cols} FROM {self.table()}"
            )
        elif x < 0.25:  # CTE
            inner = self.select_query(1)
            q = f"WITH c AS ({inner}) SELECT * FROM c"
            if r.random() < 0.4:
                q = f"WITH c AS ({inner}) SELECT count(*) AS n FROM c, c AS c2"
        elif x < 0.32:  # scalar subquery in the select list
            t, a = self.table(), "a"
            corr = f" WHERE s.k = {a}.k" if r.random() < 0.6 else ""
            q = (
                f"SELECT {a}.k, {a}.s, (SELECT {self.agg('s')} FROM {self.table()} s{corr}) AS sq "
                f"FROM {t} {a}"
            )
        else:
            q = self.select_query()
        if r.random() < 0.25:
            q = f"SELECT * FROM ({q}) q ORDER BY ALL_COLUMNS"
            if r.random() < 0.6:
                q += f" LIMIT {r.randint(0, 6)}"
                if r.random() < 0.5:
                    q += f" OFFSET {r.randint(0, 3)}"
        return q


def _order_all(sql: str, ctx: SessionContext) -> str:
    """Replace the ``ALL_COLUMNS`` placeholder with every output column (a total order)."""
    if "ALL_COLUMNS" not in sql:
        return sql
    inner = sql[len("SELECT * FROM (") : sql.index(") q ORDER BY ALL_COLUMNS")]
    names = ctx.sql(inner).schema().names
    cols = ", ".join(f'q."{n}" NULLS FIRST' for n in names)
    return sql.replace("ALL_COLUMNS", cols)


# ----------------------------------------------------------------- running
@dataclass
class Report:
    """What a fuzz run found."""

    ran: int = 0
    agreed: int = 0
    invalid: int = 0  # the oracle itself rejected the query (a generator miss)
    coordinator: int = 0  # ran whole on the coordinator (coordinator_only())
    mismatches: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agreed / self.ran if self.ran else 1.0


CONFIGS = [
    (1, DistributedConfig(tasks_per_stage=1, broadcast_threshold_bytes=0)),
    (2, DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=GIB, bytes_per_task=64)),
    (3, DistributedConfig(tasks_per_stage=3, broadcast_threshold_bytes=0, runtime_filter_bytes=0)),
    (4, DistributedConfig(bytes_per_task=16, broadcast_threshold_bytes=GIB)),
    (4, DistributedConfig(tasks_per_stage=4, broadcast_threshold_bytes=0, adaptive=False)),
    # Forced shuffles: no broadcast, every shuffle an adaptive decision, several tasks.
    (
        2,
        DistributedConfig(tasks_per_stage=3, broadcast_threshold_bytes=0, adaptive_shuffle_bytes=1),
    ),
    (
        3,
        DistributedConfig(
            tasks_per_stage=4,
            broadcast_threshold_bytes=0,
            adaptive_shuffle_bytes=1,
            bytes_per_task=16,
        ),
    ),
    # In place (the tables are small): DataFusion runs the plan the join rules rewrote.
    (2, DistributedConfig(in_place_rewrite_bytes=0)),
]
"""(workers, config) pairs: many tasks, both join strategies, static and adaptive,
forced shuffles, in place over the join rules. Saved regression cases name a
config by its index: append only."""


def contexts(tables: dict[str, pa.Table], runtime_for) -> tuple[SessionContext, list]:
    """The oracle and one distributed context per :data:`CONFIGS` entry."""
    oracle = SessionContext()
    for name, t in tables.items():
        oracle.register_record_batches(name, [t.to_batches() or [_empty(t)]])
    dist = []
    for workers, config in CONFIGS:
        ctx = DistributedContext(runtime=runtime_for(workers), config=config)
        for name, t in tables.items():
            ctx.register_table(name, t, max_rows_per_unit=4)
        dist.append(ctx)
    return oracle, dist


def _empty(t: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=t.schema)


def check(
    oracle: SessionContext, ctx: DistributedContext, sql: str, report: Report | None = None
) -> str | None:
    """None when distfusion agrees with DataFusion on ``sql``; else what differed.

    ``report.coordinator`` counts the queries that ran on the coordinator.

    Raises:
        ValueError: DataFusion itself rejects ``sql`` (not a finding).
    """
    try:
        expected = oracle.sql(sql).to_arrow_table()
    except Exception as exc:
        raise ValueError(str(exc)) from exc
    try:
        df = ctx.sql(sql)
        got = df.to_arrow_table()
        if report is not None and df.coordinator_only() is not None:
            report.coordinator += 1
        assert_same_result(got, expected, is_ordered(sql))
    except AssertionError as exc:
        return f"mismatch: {str(exc)[:500]}"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:500]}"
    return None


# ---------------------------------------------------------- shrink and keep
REGRESSIONS = Path(__file__).parent / "fuzz_regressions"
"""Shrunk findings, one directory each, replayed by tests/test_fuzz_regressions.py."""


def shrink(
    tables: dict[str, pa.Table],
    sql: str,
    fails: Callable[[dict[str, pa.Table], str], bool],
    budget_s: float = 120.0,
) -> tuple[dict[str, pa.Table], str]:
    """A smaller failing case: fewer rows, then a smaller query, while ``fails`` holds.

    Rows: each table is cut by delta debugging (drop halves, quarters, ...
    single rows) as long as ``fails(tables, sql)`` stays true. Query: parsed
    with sqlglot, clauses are dropped (WHERE, HAVING, ORDER BY, LIMIT, OFFSET,
    DISTINCT, one conjunct of an AND, one select item, one side of a set
    operation) greedily while it still fails. Stops after ``budget_s``
    seconds with the smallest case so far.
    """
    deadline = time.monotonic() + budget_s
    tables = dict(tables)
    for name in list(tables):
        chunk = max(1, tables[name].num_rows // 2)
        while chunk >= 1 and time.monotonic() < deadline:
            t, start, cut = tables[name], 0, False
            while start < t.num_rows and time.monotonic() < deadline:
                rest = pa.concat_tables([t.slice(0, start), t.slice(start + chunk)])
                if fails({**tables, name: rest}, sql):
                    tables[name], t, cut = rest, rest, True
                else:
                    start += chunk
            if not cut:
                chunk //= 2
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for candidate in _smaller_queries(sql):
            if time.monotonic() >= deadline:
                break
            if fails(tables, candidate):
                sql, changed = candidate, True
                break
    return tables, sql


def _smaller_queries(sql: str) -> Iterator[str]:
    """``sql`` with one clause less, each way sqlglot can write it (invalid ones fail to run)."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.ParseError:
        return
    removable = (exp.Where, exp.Having, exp.Order, exp.Limit, exp.Offset, exp.Distinct)
    for i, node in enumerate(list(tree.walk())):
        variants = []
        if isinstance(node, removable):
            variants.append(None)
        elif isinstance(node, exp.And):
            variants += [node.left, node.right]
        elif isinstance(node, exp.Union | exp.Intersect | exp.Except):
            variants += [node.left, node.this if node.this is not node.left else node.right]
        for variant in variants:
            copy = tree.copy()
            target = list(copy.walk())[i]
            if variant is None:
                target.pop()
            else:
                target.replace(variant.copy())
            yield copy.sql(dialect="postgres")
        if isinstance(node, exp.Select) and len(node.expressions) > 1:
            for j in range(len(node.expressions)):
                copy = tree.copy()
                list(copy.walk())[i].expressions[j].pop()
                yield copy.sql(dialect="postgres")


def save_case(tables: dict[str, pa.Table], sql: str, config: int, what: str) -> Path:
    """Keep a (shrunk) finding under :data:`REGRESSIONS`; returns its directory.

    Files: ``query.sql``, ``config.txt`` (the :data:`CONFIGS` index), ``finding.txt``
    and one Arrow IPC file per table.
    """
    digest = hashlib.sha1(sql.encode()).hexdigest()[:10]
    case = REGRESSIONS / f"case-{digest}"
    case.mkdir(parents=True, exist_ok=True)
    (case / "query.sql").write_text(sql + "\n")
    (case / "config.txt").write_text(f"{config}\n")
    (case / "finding.txt").write_text(what + "\n")
    for name, t in tables.items():
        with pa.OSFile(str(case / f"{name}.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t)
    return case


def load_case(case: Path) -> tuple[dict[str, pa.Table], str, int]:
    """``(tables, sql, config index)`` of a case :func:`save_case` wrote."""
    tables = {}
    for f in sorted(case.glob("*.arrow")):
        with pa.memory_map(str(f)) as source:
            tables[f.stem] = pa.ipc.open_file(source).read_all()
    sql = (case / "query.sql").read_text().strip()
    return tables, sql, int((case / "config.txt").read_text())


def fails_with(config: int, runtime_for) -> Callable[[dict[str, pa.Table], str], bool]:
    """``fails(tables, sql)``: distfusion with :data:`CONFIGS` ``[config]`` disagrees with DataFusion."""

    def fails(tables: dict[str, pa.Table], sql: str) -> bool:
        oracle, dist = contexts(tables, runtime_for)
        try:
            return check(oracle, dist[config], sql) is not None
        except ValueError:  # DataFusion rejects the smaller query: not the same failure
            return False

    return fails


def run(seed: int, queries: int, runtime_for, tables_every: int = 50, keep: bool = False) -> Report:
    """Fuzz ``queries`` queries from ``seed``; new tables every ``tables_every`` queries.

    ``keep``: each finding is shrunk (:func:`shrink`) and saved as a regression
    case (:func:`save_case`), replayed by every ``make test`` from then on.
    """
    report = Report()
    tables: dict[str, pa.Table] = {}
    gen = QueryGen(seed)
    oracle = dist = None
    for i in range(queries):
        if i % tables_every == 0:
            tables = make_tables(seed * 100_003 + i)
            oracle, dist = contexts(tables, runtime_for)
        sql = gen.query()
        try:
            sql = _order_all(sql, oracle)
            finding = check(oracle, dist[i % len(dist)], sql, report)
        except ValueError:
            report.invalid += 1
            continue
        report.ran += 1
        if finding is None:
            report.agreed += 1
        else:
            report.mismatches.append((i, sql, finding))
            if keep:
                config = i % len(dist)
                small, small_sql = shrink(tables, sql, fails_with(config, runtime_for))
                print(f"kept as {save_case(small, small_sql, config, finding)}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep", action="store_true", help="shrink each finding and save it under tests/"
    )
    args = parser.parse_args(argv)
    from distfusion import LocalRuntime

    runtimes: dict[int, LocalRuntime] = {}

    def runtime_for(workers: int) -> LocalRuntime:
        if workers not in runtimes:
            runtimes[workers] = LocalRuntime(workers=workers)
        return runtimes[workers]

    start = time.perf_counter()
    report = run(args.seed, args.queries, runtime_for, keep=args.keep)
    for i, sql, finding in report.mismatches:
        print(f"--- query {i}: {sql}\n    {finding}")
    print(
        f"seed {args.seed}: {report.ran} queries ran ({report.invalid} rejected by DataFusion "
        f"itself, not counted), {report.agreed} agreed ({100 * report.agreement:.1f}%), "
        f"{len(report.mismatches)} mismatches; {report.coordinator} ran on the coordinator; "
        f"{time.perf_counter() - start:.0f} s"
    )
    for rt in runtimes.values():
        rt.close()
    return 1 if report.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
