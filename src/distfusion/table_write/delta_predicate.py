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
written. Not yet: pruning candidates by min/max statistics.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import sqlglot
from sqlglot import exp

from distfusion.errors import PlanningError
from distfusion.sources import sql_name

__all__ = ["over_partitions_only", "replace_where"]


def _conjuncts(predicate: str) -> list[exp.Expression] | None:
    """The AND-ed parts of ``predicate`` (sqlglot's parse), None when it does not parse."""
    try:
        tree = sqlglot.parse_one(predicate, read="postgres")
    except sqlglot.errors.ParseError:
        return None
    return list(tree.flatten()) if isinstance(tree, exp.And) else [tree]


def _columns(e: exp.Expression) -> set[str]:
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
    conjuncts = _conjuncts(predicate) or []
    narrowing = [c.sql(dialect="postgres") for c in conjuncts if _columns(c) <= set(parts)]
    where_parts = " AND ".join(f"({c})" for c in narrowing) if narrowing else None
    removed = files_matching(where_parts) if where_parts else all_files()
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
        context.register_delta(sql_name(old), dt)
        columns = ", ".join('"' + n.replace('"', '""') + '"' for n in frame.schema().names)
        kept = context.sql(
            f"SELECT {columns} FROM {old} WHERE {where_parts or 'TRUE'} "
            f"AND NOT coalesce(({predicate}), false)"
        )
        kept = kept.cast({f.name: f.type for f in frame.schema()})
        return frame.union(kept), removed, cleanup
    except BaseException:
        cleanup()
        raise
