"""The Iceberg side of ``MERGE INTO``: which data files a merge replaces, and reading them.

:class:`~distfusion.table_write.merge.TableMerges` runs a MERGE into an Iceberg
table as it runs one into a Delta table (one distributed query, the same
clauses and checks: :mod:`distfusion.table_write.merge`), copy-on-write over
the table's data files::

    table.refresh()                        snapshot S: what the merge reads and replaces
    the source's ON keys -> (min, max)     one query over the source (merge.py)
      -> c >= min AND c <= max             a pyiceberg expression per key
      -> table.scan(expr).plan_files()     pyiceberg's pruning: partition values,
                                           column bounds -> the candidate files
                                           (+ every file with position deletes)
    MergeTargetFiles: the target table as exactly the candidate files of S
    the merge query over it and the source -> new Parquet files (write_iceberg)
    one overwrite snapshot, parent S: delete_data_file(each candidate),
                                      append_data_file(each new file)

The files read and the files deleted are the same set by construction: the
feed plans every live file of S (no pruning by the query's filters) and keeps
those whose path is a candidate's. A file no source key can match is neither
read nor rewritten: it keeps its path in the new snapshot. A file that has
position deletes is always rewritten (read with its deletes applied), so the
rows the merge reports are exact: the new files' rows plus the untouched
files' record counts.

Concurrency is pyiceberg's (0.12): the snapshot producer's commit asserts the
branch is still at S; when another commit landed in between, pyiceberg
refreshes, validates the window since S (every file deleted here still
live, no new deletes against them, and, with the table's default
``serializable`` isolation, no data file added since S) and commits on the
new head, or raises ``ValidationException``: the merge then fails with
:class:`~distfusion.table_write.files.TableWriteError` and its files are deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from distfusion.io.iceberg.filters import to_iceberg_expression
from distfusion.io.iceberg.table import IcebergTable
from distfusion.work_unit_feed.feed import FeedContext
from distfusion.work_unit_feed.filters import Comparison
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = ["MergeFiles", "MergeTargetFiles", "key_filter", "merge_files"]


@dataclass(frozen=True)
class MergeFiles:
    """The data files of snapshot ``snapshot_id`` a merge reads, rewrites and deletes.

    Attributes:
        snapshot_id: the snapshot planned (None: the table has none).
        replaced: the candidates' pyiceberg ``DataFile`` entries.
        paths: their ``file_path`` values.
        untouched_rows: record count of the other live data files (rows kept as they are).
        total: live data files in the snapshot.
        filter: what pruned (the pyiceberg expression's text), or None: every
            file is a candidate.
    """

    snapshot_id: int | None
    replaced: list
    paths: frozenset[str]
    untouched_rows: int
    total: int
    filter: str | None


def key_filter(schema: Any, ranges: list[tuple[str, Any, Any]]) -> Any:
    """The pyiceberg expression "each key column within the source's range", or None.

    ``ranges``: ``(target column, min, max)`` of each ON key over the source,
    none of them None. Each becomes ``column >= min AND column <= max`` and
    goes through :func:`~distfusion.io.iceberg.filters.to_iceberg_expression`
    (the query filters' converter): a bound of another kind than its column
    (a float, a string for a date column) is left out, as are ranges on
    floating-point columns. None when no key converts (nothing to prune by).

    Example:
        >>> from pyiceberg.schema import Schema
        >>> from pyiceberg.types import DoubleType, LongType, NestedField
        >>> s = Schema(NestedField(1, "id", LongType()), NestedField(2, "x", DoubleType()))
        >>> key_filter(s, [("id", 3, 9), ("x", 0.5, 1.5)])
        And(left=GreaterThanOrEqual(term=Reference(name='id'), literal=LongLiteral(3)), \
right=LessThanOrEqual(term=Reference(name='id'), literal=LongLiteral(9)))
        >>> key_filter(s, [("x", 0.5, 1.5)]) is None
        True
    """
    filters = tuple(
        Comparison(op, column, value)
        for column, lo, hi in ranges
        for op, value in ((">=", lo), ("<=", hi))
    )
    expr = to_iceberg_expression(filters, schema)
    return None if type(expr).__name__ == "AlwaysTrue" else expr


def merge_files(table: Any, ranges: list[tuple[str, Any, Any]] | None) -> MergeFiles:
    """The data files of ``table``'s current snapshot a merge with key ``ranges`` rewrites.

    ``ranges``: ``(target column, min, max)`` of each ON key over the source
    (``min`` None: no source row has that key, so no file can match); None
    when the ON condition has no key: every live data file. Pruning is
    pyiceberg's (``table.scan(row_filter=...).plan_files()``: partition
    values and column bounds, :func:`key_filter`'s expression); files with
    position deletes are always candidates.
    """
    snapshot = table.current_snapshot()
    if snapshot is None:
        return MergeFiles(None, [], frozenset(), 0, 0, None)
    sid = snapshot.snapshot_id
    tasks = list(table.scan(snapshot_id=sid).plan_files())
    chosen, used = tasks, None
    if ranges and any(lo is None or hi is None for _, lo, hi in ranges):
        chosen, used = [t for t in tasks if t.delete_files], "no source key"
    elif ranges:
        expr = key_filter(table.schema(), ranges)
        if expr is not None:
            scan = table.scan(row_filter=expr, snapshot_id=sid)
            hits = {t.file.file_path for t in scan.plan_files()}
            chosen = [t for t in tasks if t.file.file_path in hits or t.delete_files]
            used = str(expr)
    paths = frozenset(t.file.file_path for t in chosen)
    untouched = sum(t.file.record_count for t in tasks if t.file.file_path not in paths)
    return MergeFiles(sid, [t.file for t in chosen], paths, untouched, len(tasks), used)


class MergeTargetFiles(IcebergTable):
    """An Iceberg table read as exactly some data files of its current snapshot.

    A MERGE registers its target so (:class:`~distfusion.table_write.merge.TableMerges`):
    the query reads the files the commit deletes, and no other. Workers read
    it as an :class:`~distfusion.io.iceberg.IcebergTable` (same ``to_bytes``).

    Args:
        table: the pyiceberg ``Table``, at the snapshot ``files`` was planned on.
        files: :func:`merge_files`' result for it.
        name: the table's name in errors.

    Raises:
        PlanningError: as :class:`~distfusion.io.iceberg.IcebergTable`.
    """

    def __init__(self, table: Any, files: MergeFiles, *, name: str) -> None:
        super().__init__(table, name=name)  # the current snapshot and schema: the merge's
        assert self.snapshot_id == files.snapshot_id, "planned on another snapshot"
        self.paths = files.paths
        self.estimated_bytes = sum(f.file_size_in_bytes for f in files.replaced)

    def _discover(self, ctx: FeedContext) -> Iterator[WorkUnit]:
        """Every live data file of the snapshot whose path is one of :attr:`paths`."""
        unfiltered = cast(FeedContext, _Unfiltered(ctx))  # a proxy: ctx's attributes but filters
        for unit in super()._discover(unfiltered):
            if json.loads(unit.data)["file_path"] in self.paths:
                yield unit


class _Unfiltered:
    """``ctx`` without its filters: a merge's target files are read whatever the query filters."""

    def __init__(self, ctx: FeedContext) -> None:
        self._ctx = ctx
        self.filters = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)
