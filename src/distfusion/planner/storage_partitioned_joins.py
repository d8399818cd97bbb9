"""Storage-partitioned joins: two tables stored in key order joined file range by file range.

A table written in key order (TPC-H's ``orders`` and ``lineitem`` by order
key, a table clustered or Z-ordered by its key) has files whose key ranges,
known from their Parquet footers, barely overlap. A join on that key then
needs no exchange: cut one side's files into groups of consecutive key ranges,
give each group's task the other side's files whose ranges overlap the group's,
and every pair of matching rows meets in exactly one task. This is Spark's
storage-partitioned join (SPARK-37375) for tables without declared buckets,
and Hive's sort-merge-bucket join without buckets: the layout is read from the
statistics.

The side cut into groups (the *grouped* side) must have files that do not
share a key value across groups: its files are merged into clusters of
overlapping ranges first. Files of the other side (the *spanning* side) that
straddle two groups are read by both tasks. That is exact whenever a row of
the spanning side appears in the output only with a match:

- inner joins and semi joins: a match lies in one group, so the straddling
  row's output is made once, where its match is;
- left anti, left outer, single and mark joins keep every left row: the left
  side must be the grouped one (and the mirror image for right joins);
- full outer joins never qualify.

A spanning file overlapping no group holds no row that can match and is not
read; NULL keys never match under ``=`` (a null-safe key disqualifies the
join). The rule applies when both sides are scans (filters and projections
over one Parquet table each, read by several tasks) joined on an integer column
of each, the grouped side has at least two clusters, and reading straddling
files twice adds at most :data:`MAX_SPANNING_SHARE` of the spanning side. It
runs before the broadcast and shuffle choices: a join with no exchange beats
both, and the stage no longer waits for a broadcast side (TPC-H Q4 at SF10
on Spark: three rounds of tasks became one; docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pyarrow as pa
from substrait.proto import Expression, JoinRel, Rel

from distfusion.io.sources import TableSource
from distfusion.planner.estimate import Estimate
from distfusion.planner.fragment import Fragment
from distfusion.planner.walk_host import WalkHost
from distfusion.substrait_plan.build import is_field_ref
from distfusion.substrait_plan.lineage import read_column
from distfusion.substrait_plan.walk import (
    has_subquery,
    read_rels,
    rel_kind,
    relations,
    set_children,
)
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = ["MAX_SPANNING_SHARE", "StoragePartitionedJoins", "group_units"]

_J = JoinRel
MAX_SPANNING_SHARE = 0.25
"""Most extra bytes of the spanning side that straddling files may add (a fraction of it)."""

# Join type -> the sides that may be grouped (the others' unmatched rows are dropped).
_GROUPABLE = {
    _J.JOIN_TYPE_INNER: ("left", "right"),
    _J.JOIN_TYPE_LEFT_SEMI: ("left", "right"),
    _J.JOIN_TYPE_RIGHT_SEMI: ("left", "right"),
    _J.JOIN_TYPE_LEFT: ("left",),
    _J.JOIN_TYPE_LEFT_ANTI: ("left",),
    _J.JOIN_TYPE_LEFT_SINGLE: ("left",),
    _J.JOIN_TYPE_LEFT_MARK: ("left",),
    _J.JOIN_TYPE_RIGHT: ("right",),
    _J.JOIN_TYPE_RIGHT_ANTI: ("right",),
    _J.JOIN_TYPE_RIGHT_SINGLE: ("right",),
    _J.JOIN_TYPE_RIGHT_MARK: ("right",),
}
_PLAIN = {"read", "filter", "project"}

Range = tuple  # (min, max, null_count); min and max None when unknown or all null


def unit_range(source: TableSource, unit: WorkUnit, column: str) -> Range:
    """``(min, max, null_count)`` of ``column`` in ``unit``: from a lakehouse log or the footer."""
    stats = source.unit_stats.get(unit.path) or source.key_ranges.get(unit.path) or {}
    lo, hi, nulls = stats.get(column) or (None, None, None)
    if not (_is_int(lo) and _is_int(hi)):  # unknown, all NULL, or not an integer bound
        lo = hi = None
    return lo, hi, nulls if _is_int(nulls) else None


def group_units(
    grouped: list[tuple[WorkUnit, Range]], tasks: int
) -> list[tuple[list[WorkUnit], object, object]] | None:
    """Cut ``grouped`` units into at most ``tasks`` groups of consecutive key ranges.

    Returns ``[(units, low, high)]`` in key order, each group's units and the
    key range they cover; units holding only NULL keys join the first group.
    Units whose ranges overlap stay in one group. None when a unit's range is
    unknown, or fewer than two groups can be made.
    """
    ranged, all_null = [], []
    for unit, (lo, hi, nulls) in grouped:
        if lo is None or hi is None:
            if not _all_null(unit, nulls):
                return None  # unknown range
            all_null.append(unit)
        else:
            ranged.append((lo, hi, unit))
    ranged.sort(key=lambda r: (r[0], r[1]))
    clusters: list[list] = []  # [low, high, units, bytes]
    for lo, hi, unit in ranged:
        if clusters and lo <= clusters[-1][1]:
            c = clusters[-1]
            c[1] = max(c[1], hi)
            c[2].append(unit)
            c[3] += unit.size_bytes
        else:
            clusters.append([lo, hi, [unit], unit.size_bytes])
    tasks = min(tasks, len(clusters))
    if tasks < 2:
        return None
    total = sum(c[3] for c in clusters) or 1
    groups: list[list] = []
    done = 0
    for c in clusters:
        # A cluster goes to the group its midpoint (in bytes) falls in.
        index = min(tasks - 1, int((done + c[3] / 2) * tasks / total))
        done += c[3]
        if groups and groups[-1][3] == index:
            g = groups[-1]
            g[0].extend(c[2])
            g[2] = c[1]
        else:
            groups.append([list(c[2]), c[0], c[1], index])
    if len(groups) < 2:
        return None
    groups[0][0].extend(all_null)
    return [(g[0], g[1], g[2]) for g in groups]


class StoragePartitionedJoins(WalkHost):
    """The planner's storage-partitioned joins (a mixin of the planner's walk).

    Uses the planner's ``config``, ``oracle``, ``sources`` and ``aligned_units``
    (source name -> each task's units, read by ``_scans``).
    """

    def _storage_partitioned(
        self,
        rel: Rel,
        join_type: int,
        left: Fragment,
        right: Fragment,
        keys: list[tuple[Expression, Expression]],
        reducible: bool,
        est: Estimate,
    ) -> Fragment | None:
        """``rel`` run in one stage over file ranges of both sides, or None (see the module).

        ``est``: the join's output estimate.
        """
        sides = _GROUPABLE.get(join_type)
        if not self.config.storage_partitioned_joins or not sides:
            return None
        if not keys or not reducible:
            return None
        left_scan, right_scan = self._plain_scan(left), self._plain_scan(right)
        if left_scan is None or right_scan is None or left_scan == right_scan:
            return None
        scans = {"left": left_scan, "right": right_scan}
        frags = {"left": left, "right": right}
        for lk, rk in keys:
            found = {
                side: self._scan_column(frags[side], scans[side], key)
                for side, key in (("left", lk), ("right", rk))
            }
            columns = {side: c for side, c in found.items() if c is not None}
            if len(columns) < len(found):
                continue
            # The larger side is grouped (its files are read once), where the join allows.
            order = sorted(sides, key=lambda s: -self.sources[scans[s]].size_bytes)
            for side in order:
                other = "right" if side == "left" else "left"
                tasks = min(max(left.tasks, right.tasks), self.config.task_cap)
                planned = self._aligned(rel, frags, scans, columns, (side, other), tasks, est)
                if planned is not None:
                    return planned
        return None

    def _plain_scan(self, frag: Fragment) -> str | None:
        """The one source table ``frag`` reads split across tasks, if it is a plain scan.

        Plain: filters and projections over one read of a file table, no stage
        input, no broadcast scan, no subquery.
        """
        if frag.inputs or frag.replicated or frag.passthrough is not None:
            return None
        if any(rel_kind(r) not in _PLAIN for r in relations(frag.rel)) or has_subquery(frag.rel):
            return None
        reads = list(read_rels(frag.rel))
        if len(reads) != 1 or not reads[0].read.HasField("named_table"):
            return None
        name = reads[0].read.named_table.names[-1]
        source = self.sources.get(name)
        if source is None or source.format != "parquet" or name in self.aligned_units:
            return None
        return name

    def _scan_column(self, frag: Fragment, name: str, key: Expression) -> str | None:
        """The integer column of source ``name`` that join key ``key`` of ``frag`` passes on."""
        column = is_field_ref(key)
        traced = None if column is None else read_column(frag.rel, column)
        if traced is None or traced[0].split(".")[-1] != name:
            return None
        field = self.sources[name].schema.field(traced[1])
        return field.name if pa.types.is_integer(field.type) else None

    def _aligned(
        self,
        rel: Rel,
        frags: dict[str, Fragment],
        scans: dict[str, str],
        columns: dict[str, str],
        sides: tuple[str, str],
        tasks: int,
        est: Estimate,
    ) -> Fragment | None:
        """The join in one stage, ``sides`` (grouped, spanning) by key range; or None."""
        side, other = sides
        source, spanning = self.sources[scans[side]], self.sources[scans[other]]
        cut = group_units([(u, unit_range(source, u, columns[side])) for u in source.units], tasks)
        if cut is None:
            return None
        spans: list[list[WorkUnit]] = [[] for _ in cut]
        for unit in spanning.units:
            lo, hi, nulls = unit_range(spanning, unit, columns[other])
            if lo is None and _all_null(unit, nulls):
                continue  # only NULL keys: matches nothing
            for i, (_, glo, ghi) in enumerate(cut):
                if lo is None or hi is None or not (hi < glo or lo > ghi):
                    spans[i].append(unit)
        read = sum(u.size_bytes for s in spans for u in s)
        if read > spanning.size_bytes * (1 + MAX_SPANNING_SHARE):
            return None
        per_task = {side: tuple(tuple(g[0]) for g in cut), other: tuple(tuple(s) for s in spans)}
        new = {}
        for s in ("left", "right"):
            new[s] = self._aligned_read(
                frags[s].rel, self.sources[scans[s]], per_task[s], columns[s]
            )
        joined = set_children(rel, [new["left"], new["right"]])
        return Fragment(joined, len(cut), est)

    def _aligned_read(
        self,
        rel: Rel,
        source: TableSource,
        task_units: tuple[tuple[WorkUnit, ...], ...],
        column: str,
    ) -> Rel:
        """``rel`` reading ``source`` as a table of its own whose tasks read ``task_units``.

        ``column``: the key whose ranges cut the units (``explain()`` says so).
        """
        table = source.options.get("table", source.name)
        # Named by the units' positions, not their paths: the same plan wherever the files are.
        position = {u.path: i for i, u in enumerate(source.units)}
        layout = ";".join(",".join(str(position[u.path]) for u in units) for units in task_units)
        digest = hashlib.sha1(f"{source.name}:{layout}".encode()).hexdigest()[:12]
        alias = f"{table}__ranges_{digest}"
        kept = {u.path: u for units in task_units for u in units}
        previous = source.options.get("pruned")
        how = f"files by {column} range"
        options = {
            **source.options,
            "table": table,
            "all_units": source.options.get("all_units", len(source.units)),
            "pruned": how if previous is None else f"{previous}, {how}",
        }
        if alias not in self.aligned_units:  # the same ranges of another read: one table
            aligned = replace(source, name=alias, units=tuple(kept.values()), options=options)
            self.sources[alias] = aligned
            self.oracle.register_empty(alias, aligned.schema)
            self.aligned_units[alias] = task_units
        out = Rel()
        out.CopyFrom(rel)
        for m in read_rels(out):
            names = m.read.named_table.names
            if names[-1] == source.name:
                del names[:]
                names.append(alias)
        return out


def _all_null(unit: WorkUnit, nulls: int | None) -> bool:
    """Whether ``unit``'s ``nulls`` NULL keys are all its rows."""
    return nulls is not None and unit.num_rows is not None and nulls >= unit.num_rows


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
