"""File skipping: the units of a read that their statistics prove its filter drops entirely.

A source that knows per-unit statistics before anything runs
(:attr:`~distfusion.sources.TableSource.unit_stats`: a Delta table's log gives
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

from distfusion.planner.prune_partitions import pruned_read
from distfusion.sources import TableSource
from distfusion.work_unit_feed.filters import Filter
from distfusion.work_unit_feed.statistics import might_match

__all__ = ["skip_units"]


def skip_units(
    rel: Rel, source: TableSource, filters: tuple[Filter, ...]
) -> tuple[Rel, TableSource]:
    """``rel`` (a ``ReadRel`` of ``source``) reading only the units ``filters`` might match.

    Returns ``(rel, source)`` unchanged when there is no predicate, the
    source has no statistics, or no unit is ruled out; otherwise the pruned
    read and its table (:func:`~distfusion.planner.prune_partitions.pruned_read`,
    ``explain()`` says "skipped by statistics"), which the caller registers.
    """
    if not filters or not source.unit_stats or not source.units:
        return rel, source
    keep = tuple(
        u for u in source.units if might_match(filters, source.unit_stats.get(u.path), u.num_rows)
    )
    if len(keep) == len(source.units):
        return rel, source
    return pruned_read(rel, source, keep, "skipped by statistics")
