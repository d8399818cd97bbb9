"""An overwrite of a Delta table with a ``predicate`` over data columns: copy-on-write.

``write_delta(table, mode="overwrite", predicate="day = 'mon' AND id < 10")``
replaces the rows the predicate selects (``deltalake.write_deltalake``'s
meaning, Delta's ``replaceWhere``). When the predicate names only partition
columns, whole files are replaced (:func:`~distfusion.table_write.delta.write_delta`).
Otherwise, files hold rows on both sides, so the candidate files are
rewritten, keeping their rows the predicate does not select, in the same
distributed query and the same commit as the new rows::

    candidates = active files of the version read, narrowed by the predicate's
                 conjuncts over partition columns (all files when it has none)
    query      = new rows  UNION ALL  SELECT cols FROM candidates
                                      WHERE NOT coalesce((predicate), false)
    one commit = remove every candidate file, add every written file

A row where the predicate is NULL is kept (it is not selected), as delta-rs
keeps it. As delta-rs checks, every new row must match the predicate: the
result is counted first (``WHERE NOT coalesce((predicate), false)``), so the
query runs twice; a row outside raises ``ValueError`` before anything is
written. Candidates are pruned by the files' min/max statistics too (for
comparisons of integer and date columns with constants: a file whose range
cannot hold a selected row is left as it is, see :func:`stats_condition`);
string, float and timestamp bounds are not used (delta-rs truncates long
strings' bounds; a NaN is outside a float's bounds and is greater than any
number in DataFusion).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import sqlglot
from datafusion import SessionContext
from sqlglot import exp

from distfusion.errors import PlanningError
from distfusion.io.sources import sql_name

__all__ = ["candidate_files", "over_partitions_only", "replace_where", "stats_condition"]


def _conjuncts(predicate: str) -> list[exp.Expr] | None:
    """The AND-ed parts of ``predicate`` (sqlglot's parse), None when it does not parse."""
    try:
        tree = sqlglot.parse_one(predicate, read="postgres")
    except sqlglot.errors.ParseError:
        return None
    return list(tree.flatten()) if isinstance(tree, exp.And) else [tree]


def _columns(e: exp.Expr) -> set[str]:
    return {c.name if c.this.quoted else c.name.lower() for c in e.find_all(exp.Column)}


def over_partitions_only(predicate: str, parts: tuple[str, ...]) -> bool:
    """Whether ``predicate`` names only the partition columns ``parts`` (or cannot be parsed).

    Example:
        >>> over_partitions_only("day = 'mon' AND id < 3", ("day",))
        False
    """
    conjuncts = _conjuncts(predicate)
    if conjuncts is None:
        return True  # the partition path reports DataFusion's error
    return all(_columns(c) <= set(parts) for c in conjuncts)


def candidate_files(
    dt: Any,
    parts: tuple[str, ...],
    predicate: str,
    files_matching: Callable[[str], list[dict]],
    all_files: Callable[[], list[dict]],
) -> tuple[list[dict], set[int]]:
    """The active files that can hold a row ``predicate`` selects, and their log indexes.

    Narrowed by the predicate's conjuncts over partition columns
    (``files_matching``), then by the files' min/max (:func:`stats_condition`).
    Also used by MERGE (:mod:`distfusion.table_write.merge`) with the ON keys'
    range in the source as ``predicate``.

    Returns:
        ``(files as files_matching gives them, indexes into dt.get_add_actions())``.
    """
    conjuncts = _conjuncts(predicate) or []
    narrowing = [c.sql(dialect="postgres") for c in conjuncts if _columns(c) <= set(parts)]
    where_parts = " AND ".join(f"({c})" for c in narrowing) if narrowing else None
    removed = files_matching(where_parts) if where_parts else all_files()
    may_match = _stats_may_match(conjuncts, dt, parts)
    if may_match is not None:
        removed = [r for r in removed if r["path"] in may_match]
    chosen = {r["path"] for r in removed}
    actions = pa.table(dt.get_add_actions(flatten=True))
    log_paths = [unquote(p) for p in actions["path"].to_pylist()]
    return removed, {i for i, p in enumerate(log_paths) if p in chosen}


def replace_where(
    frame: Any,
    uri: str,
    dt: Any,
    parts: tuple[str, ...],
    predicate: str,
    files_matching: Callable[[str], list[dict]],
    all_files: Callable[[], list[dict]],
) -> tuple[Any, list[dict], Callable[[], None]]:
    """``frame`` with the candidate files' unselected rows, those files, and a cleanup.

    Args:
        frame: the new rows (a DistributedDataFrame with the table's columns).
        uri: the table's root, for messages.
        dt: the ``deltalake.DeltaTable`` at the version the write reads.
        parts: the table's partition columns.
        predicate: SQL over the table's columns.
        files_matching: the active files a predicate over partition columns selects.
        all_files: every active file.

    Returns:
        ``(frame to write, files to remove, cleanup)``; ``cleanup()`` forgets
        the table registered to read the candidates (call it after the write).

    Raises:
        ValueError: ``predicate`` is not SQL over the table's columns, or a
            new row does not match it (nothing written).
    """
    context = frame.context
    removed, keep = candidate_files(dt, parts, predicate, files_matching, all_files)
    new = f"__distfusion_new_{uuid.uuid4().hex}"
    old = f"__distfusion_read_{uuid.uuid4().hex}"
    context.ctx.register_view(new, frame.df)

    def cleanup() -> None:
        for name in (new, old):
            context.deregister_table(name)

    try:
        outside = context.sql(
            f"SELECT count(*) AS n FROM {new} WHERE NOT coalesce(({predicate}), false)"
        ).to_pylist()[0]["n"]
    except PlanningError as exc:
        cleanup()
        msg = f"predicate {predicate!r} for the Delta table at {uri} is not SQL over its columns"
        msg += f": {exc}"
        raise ValueError(msg) from None
    except BaseException:
        cleanup()
        raise
    if outside:
        cleanup()
        msg = (
            f"{outside} row(s) written to the Delta table at {uri} do not match the overwrite "
            f"predicate {predicate!r}; nothing was written"
        )
        raise ValueError(msg)
    try:
        context._register_delta_files(sql_name(old), dt, keep)  # the candidates only
        columns = ", ".join('"' + n.replace('"', '""') + '"' for n in frame.schema().names)
        kept = context.sql(f"SELECT {columns} FROM {old} WHERE NOT coalesce(({predicate}), false)")
        kept = kept.cast({f.name: f.type for f in frame.schema()})
        return frame.union(kept), removed, cleanup
    except BaseException:
        cleanup()
        raise


_BOUNDS = {exp.GT: "max", exp.GTE: "max", exp.LT: "min", exp.LTE: "min"}
_FLIPPED = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}


def _stat(bound: str, column: str) -> str:
    return '"' + f"{bound}.{column}".replace('"', '""') + '"'


def _constant(e: exp.Expr) -> str | None:
    return None if any(True for _ in e.find_all(exp.Column)) else e.sql(dialect="postgres")


def stats_condition(e: exp.Expr, columns: set[str]) -> str | None:
    """SQL over ``min.<c>`` / ``max.<c>`` true when a file's bounds may hold a row ``e`` selects.

    None when ``e`` says nothing usable (every file may match). Only
    comparisons (``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``) of one of
    ``columns`` with a constant, under AND and OR, are used; a missing bound
    (NULL) means the file may match.

    Example:
        >>> stats_condition(sqlglot.parse_one("id > 3 AND p = 'a'"), {"id"})
        'coalesce("max.id" > 3, TRUE)'
    """
    if isinstance(e, exp.Paren):
        return stats_condition(e.this, columns)
    if isinstance(e, exp.And | exp.Or):
        lhs, rhs = (stats_condition(x, columns) for x in (e.left, e.right))
        if isinstance(e, exp.And):
            kept = [x for x in (lhs, rhs) if x is not None]
            if len(kept) < 2:
                return kept[0] if kept else None
            return " AND ".join(f"({x})" for x in kept)
        return None if lhs is None or rhs is None else f"({lhs}) OR ({rhs})"
    if isinstance(e, exp.Between) and isinstance(e.this, exp.Column):
        low, high = _constant(e.args["low"]), _constant(e.args["high"])
        c = _column(e.this, columns)
        if c is None or low is None or high is None:
            return None
        return (
            f"coalesce({_stat('max', c)} >= {low}, TRUE) "
            f"AND coalesce({_stat('min', c)} <= {high}, TRUE)"
        )
    kind = type(e)
    if kind not in _FLIPPED or not isinstance(e, exp.Binary):  # the keys are all Binary
        return None
    left, right = e.left, e.right
    if not isinstance(left, exp.Column):
        left, right, kind = right, left, _FLIPPED[kind]
    c = _column(left, columns) if isinstance(left, exp.Column) else None
    value = _constant(right)
    if c is None or value is None:
        return None
    if kind is exp.EQ:
        return (
            f"coalesce({_stat('min', c)} <= {value}, TRUE) "
            f"AND coalesce({_stat('max', c)} >= {value}, TRUE)"
        )
    op = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}[kind]
    return f"coalesce({_stat(_BOUNDS[kind], c)} {op} {value}, TRUE)"


def _column(c: exp.Column, columns: set[str]) -> str | None:
    name = c.name if c.this.quoted else c.name.lower()
    return name if name in columns else None


def _stats_may_match(
    conjuncts: list[exp.Expr], dt: Any, parts: tuple[str, ...]
) -> set[str] | None:
    """Paths of the active files whose bounds may hold a selected row; None: no pruning."""
    if not conjuncts:
        return None
    actions = pa.table(dt.get_add_actions(flatten=True))
    columns = {}
    for name in actions.column_names:
        bound, _, column = name.partition(".")
        t = actions.schema.field(name).type
        if bound == "min" and f"max.{column}" in actions.column_names and column not in parts:
            if pa.types.is_integer(t) or pa.types.is_date(t):
                columns[column] = t
    conditions = [stats_condition(c, set(columns)) for c in conjuncts]
    conditions = [c for c in conditions if c is not None]
    if not conditions:
        return None
    paths = pa.array([unquote(p) for p in actions["path"].to_pylist()], pa.string())
    files = {"path": paths}
    for c in columns:
        files[f"min.{c}"] = actions[f"min.{c}"]
        files[f"max.{c}"] = actions[f"max.{c}"]
    table = pa.table(files)
    ctx = SessionContext()
    ctx.register_record_batches(
        "files", [table.to_batches() or [pa.RecordBatch.from_pylist([], table.schema)]]
    )
    where = " AND ".join(f"({c})" for c in conditions)
    out = ctx.sql(f"SELECT path FROM files WHERE {where}").to_arrow_table()
    return set(out["path"].to_pylist())
