"""File skipping: the units of a read that their statistics prove its filter drops entirely.

A source that knows per-unit statistics before anything runs
(:attr:`~distfusion.io.sources.TableSource.unit_stats`: a Delta table's log gives
every file's min, max and null count per column, and its partition values as
bounds) is read by the units that might hold a row the read's filter keeps.
The filter comes as plain predicates (:mod:`distfusion.planner.scan_filters`:
the conjuncts pushed into the scan, or those of the filter right above it, with
what cannot be expressed left out), and each unit is tested with
:func:`~distfusion.work_unit_feed.statistics.might_match`. As in
:mod:`~distfusion.planner.prune_partitions`, the pruned read gets a table of
its own, and every filter still runs in the tasks: skipping only ever drops
rows the filter would drop.
"""

from __future__ import annotations

from substrait.proto import Rel

from distfusion.io.sources import TableSource
from distfusion.planner.prune_partitions import pruned_read
from distfusion.work_unit_feed.filters import And, Filter, Not, Or
from distfusion.work_unit_feed.statistics import might_match

__all__ = ["skip_units"]


def skip_units(
    rel: Rel, source: TableSource, filters: tuple[Filter, ...]
) -> tuple[Rel, TableSource]:
    """``rel`` (a ``ReadRel`` of ``source``) reading only the units ``filters`` might match.

    Returns ``(rel, source)`` unchanged when there is no predicate, the
    source has no statistics, or no unit is ruled out; otherwise the pruned
    read and its table (:func:`~distfusion.planner.prune_partitions.pruned_read`),
    which the caller registers. ``explain()`` says "partitions pruned" for
    the units the predicates on partition columns alone rule out, "skipped
    by statistics" for those the others do.
    """
    if not filters or not source.unit_stats or not source.units:
        return rel, source
    partition_cols = set(source.options.get("partition_cols") or ())
    on_partitions = tuple(f for f in filters if _columns(f) <= partition_cols)
    if on_partitions:
        rel, source = _skip(rel, source, on_partitions, "partitions pruned")
    return _skip(rel, source, filters, "skipped by statistics")


def _skip(rel: Rel, source: TableSource, filters: tuple[Filter, ...], how: str):
    keep = tuple(
        u for u in source.units if might_match(filters, source.unit_stats.get(u.path), u.num_rows)
    )
    if len(keep) == len(source.units):
        return rel, source
    return pruned_read(rel, source, keep, how)


def _columns(f: Filter) -> set[str]:
    """The columns predicate ``f`` reads."""
    if isinstance(f, And | Or):
        return set().union(*(_columns(c) for c in f.children))
    if isinstance(f, Not):
        return _columns(f.child)
    return {f.column}
