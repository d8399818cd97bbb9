"""Size estimates and the task estimator.

Estimates follow Spark's size-only statistics (``sizeInBytes`` without CBO):
bytes to scan come from Parquet footers (uncompressed column-chunk sizes of the
projected columns); a filter keeps the product of its conjuncts' selectivities
(:data:`CONJUNCT_SELECTIVITY`, the textbook defaults of System R: 1/10 for an
equality, 1/3 for a range comparison; :data:`FILTER_SELECTIVITY` otherwise); joins
and aggregates keep their input size (conservative: never under-estimate a
broadcast side by much). They drive two decisions: how many tasks a stage gets,
and whether a join side is small enough to broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from distfusion.substrait_plan.build import filtered_read

__all__ = [
    "Estimate",
    "TaskEstimator",
    "EstimatesFeedTasks",
    "SizesTasksByBytes",
    "DefaultTaskEstimator",
    "FILTER_SELECTIVITY",
    "filter_selectivity",
    "is_selective_scan",
    "selective_scan_bytes",
    "REDUCTION_KEPT",
    "REDUCTION_RATIO",
]

FILTER_SELECTIVITY = 0.5
"""Fraction of rows a predicate keeps when nothing better is known (a guess, as in
most engines without column statistics)."""

CONJUNCT_SELECTIVITY = {
    "equal": 0.1,
    "lt": 1 / 3,
    "lte": 1 / 3,
    "gt": 1 / 3,
    "gte": 1 / 3,
    "like": 0.25,
}
"""Fraction of rows one conjunct keeps, by Substrait function name (Selinger et
al., "Access Path Selection in a Relational Database Management System", 1979)."""

MIN_FILTER_SELECTIVITY = 0.05
"""A filter is never assumed to keep less than this: underestimating a side could
broadcast something large."""


def filter_selectivity(function_names: list[str | None]) -> float:
    """Selectivity of a conjunction whose conjuncts call ``function_names``.

    ``None`` stands for a conjunct that is not a function call.
    """
    sel = 1.0
    for name in function_names:
        sel *= CONJUNCT_SELECTIVITY.get(name or "", FILTER_SELECTIVITY)
    return max(sel, MIN_FILTER_SELECTIVITY)


REDUCTION_KEPT = 0.5
"""A side creates a semi-join reduction only if its filters keep at most this
fraction of its rows (Spark's runtime filter likewise wants a selective filter
on the creation side)."""
REDUCTION_RATIO = 4
"""...and only for a side at least this many times its likely size."""
REDUCTION_SIDE_FACTOR = 10
"""...and only when the side is likely at most this many times
``runtime_filter_bytes`` (every task of the other side reads all of it;
100 MiB by default, the least default ``max_broadcast_bytes``), its keys at
most ``runtime_filter_bytes`` unless broadcasting the side pays."""

VARIABLE_WIDTH_BYTES = 16
"""Bytes assumed for one value of a variable-width type (strings, binary, lists)."""


def value_bytes(data_type) -> int:
    """Bytes one value of Arrow type ``data_type`` likely takes in memory.

    A fixed-width type's own width (a boolean: 1); any other type
    :data:`VARIABLE_WIDTH_BYTES`. For shares of a row, not for sizes.
    """
    try:
        return max(1, data_type.bit_width // 8)
    except ValueError:  # pyarrow: no fixed width
        return VARIABLE_WIDTH_BYTES


def key_share(key_types, row_types) -> float:
    """The share of a row's bytes its key columns take (:func:`value_bytes`), at most 1."""
    row = sum(value_bytes(t) for t in row_types)
    return min(1.0, sum(value_bytes(t) for t in key_types) / row) if row else 1.0


def selective_scan_bytes(rel, registry, sources: dict) -> float | None:
    """The estimated output bytes of ``rel`` if it is a selective filtered scan; else None.

    That is projections and filters over one source read (see
    :func:`~distfusion.substrait_plan.build.filtered_read`) whose filters keep at
    most :data:`REDUCTION_KEPT` of the table (:func:`filter_selectivity`); the
    estimate is the projected bytes times that fraction. Spark's runtime filter
    asks the same of its creation side (``isSelectiveFilterOverScan``).
    """
    found = filtered_read(rel, registry)
    if found is None or not found[1]:
        return None
    read, names = found
    source = sources.get(read.read.named_table.names[-1])
    if source is None or source.streamed:  # read once, by its own leaf stage
        return None
    fraction = filter_selectivity(names)
    if fraction > REDUCTION_KEPT:
        return None
    columns = None
    if read.read.HasField("projection"):
        all_names = list(source.schema.names)
        columns = [all_names[i.field] for i in read.read.projection.select.struct_items]
    return source.projected_bytes(columns) * fraction


def is_selective_scan(rel, registry, sources: dict, limit_bytes: int) -> bool:
    """Whether ``rel`` is a selective filtered scan of at most ``limit_bytes`` (0: never).

    See :func:`selective_scan_bytes`; Spark's ``creationSideThreshold`` bounds
    its runtime filters' creation side likewise.
    """
    if limit_bytes <= 0:
        return False
    estimated = selective_scan_bytes(rel, registry, sources)
    return estimated is not None and estimated <= limit_bytes


@dataclass(frozen=True)
class Estimate:
    """Estimated output of a relation: ``rows`` and ``bytes`` (in-memory Arrow size).

    ``rows`` and ``bytes`` are conservative (a join keeps its larger input).
    Two more figures serve decisions that want the likely size instead:

    Attributes:
        kept: fraction of its source rows the relation keeps after the filters
            below it (product over joined sides; 1.0 = unfiltered).
        low_rows: likely rows under the foreign-key join assumption: an equi-join
            keeps the larger side's rows times the smaller side's ``kept`` (each
            row of the larger side matches one row of the smaller side's table,
            which survived its filters with probability ``kept``). None: ``rows``.
    """

    rows: float
    bytes: float
    kept: float = 1.0
    low_rows: float | None = None

    @property
    def low_bytes(self) -> float:
        """Bytes at ``low_rows`` rows."""
        if self.low_rows is None or self.rows <= 0:
            return self.bytes
        return self.bytes * min(1.0, self.low_rows / self.rows)

    def scale(self, factor: float) -> Estimate:
        """The estimate with rows, bytes and ``kept`` multiplied by ``factor``."""
        low = None if self.low_rows is None else self.low_rows * factor
        return Estimate(self.rows * factor, self.bytes * factor, self.kept * factor, low)

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.rows + other.rows, self.bytes + other.bytes)

    def equi_join(self, other: Estimate) -> Estimate:
        """An inner equi-join of this side and ``other``.

        Conservative: the larger side's rows, both sides' bytes. Likely
        (``low_rows``): the larger side's likely rows times the smaller side's
        ``kept`` -- the foreign-key assumption of System R's and most engines'
        estimators when no key statistics are known.
        """
        big, small = (self, other) if self.rows >= other.rows else (other, self)
        big_low = big.rows if big.low_rows is None else big.low_rows
        return Estimate(
            big.rows, self.bytes + other.bytes, self.kept * other.kept, big_low * small.kept
        )


@runtime_checkable
class TaskEstimator(Protocol):
    """Decides how many tasks a stage gets.

    Called by the planner on the coordinator, once per stage, before anything
    runs. The planner caps the result by the number of workers the resolver
    reports (``workers`` is passed for estimators that want to use it).
    """

    def leaf_tasks(self, scan_bytes: int, num_work_units: int, workers: int) -> int:
        """Tasks for a leaf stage scanning ``scan_bytes`` over ``num_work_units`` units."""
        ...

    def shuffle_tasks(self, input_bytes: int, workers: int) -> int:
        """Tasks for a stage fed by a shuffle of about ``input_bytes``."""
        ...

    # Optional abilities: EstimatesFeedTasks, SizesTasksByBytes (below).


@runtime_checkable
class EstimatesFeedTasks(Protocol):
    """A :class:`TaskEstimator` that sizes leaf stages reading a work unit feed (optional).

    Without it the planner uses the count the feed's table source asks for,
    or one task per worker.
    """

    def feed_tasks(self, desired_tasks: int | None, workers: int) -> int:
        """Tasks for a leaf stage reading a feed whose source asks for ``desired_tasks``.

        ``desired_tasks`` None: no wish. The planner caps the result by the workers.
        """
        ...


@runtime_checkable
class SizesTasksByBytes(Protocol):
    """A :class:`TaskEstimator` with :class:`DefaultTaskEstimator`'s sizing fields (optional).

    The planner reads them to decide whether a join's probe side keeps its
    tasks (``planner/distribute_joins.py``); without them it does.
    """

    tasks_per_stage: int | None
    wave_bytes_per_task: int | None


@dataclass(frozen=True)
class DefaultTaskEstimator:
    """One task per ``bytes_per_task`` of input, at most one per worker.

    Attributes:
        bytes_per_task: target bytes each task processes (default 16 MiB: at
            TPC-H SF1, lineitem's projected columns then fill every worker of a
            small cluster while ``nation`` stays a single task).
        tasks_per_stage: when set, every stage asks for exactly this many tasks
            (leaf stages at most one per work unit); for tests.
        wave_bytes_per_task: for runtimes whose stages may have more tasks than
            workers (Spark: slots bound concurrency, not tasks). None (default):
            unused. Set: a stage that needs more tasks than ``workers`` at
            ``bytes_per_task`` gets tasks of this many bytes instead, at least
            ``workers`` of them, rounded up to whole waves (a multiple of
            ``workers``) so that no wave runs half empty. Tasks past the slot
            count add no parallelism, only per-task cost: scheduling, reading
            every broadcast and building its hash table again, one more output
            piece per consumer (``SparkRuntime.wave_bytes_per_task`` gives the
            measurements).
        shuffle_bytes_per_task: ``bytes_per_task`` of stages fed by a shuffle;
            None (default): ``bytes_per_task``. For runtimes where a leaf stage
            of one task is cheaper than several (on Spark a query whose every
            stage has one task runs wholly on the driver, no Spark job), while a
            stage reading a shuffle is distributed anyway and should fill the
            slots (``SparkRuntime.shuffle_bytes_per_task``).
    """

    bytes_per_task: int = 16 * 1024 * 1024
    tasks_per_stage: int | None = None
    wave_bytes_per_task: int | None = None
    shuffle_bytes_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.bytes_per_task <= 0:
            msg = f"bytes_per_task must be positive, got {self.bytes_per_task}"
            raise ValueError(msg)
        if self.tasks_per_stage is not None and self.tasks_per_stage < 1:
            msg = f"tasks_per_stage must be at least 1, got {self.tasks_per_stage}"
            raise ValueError(msg)
        for name in ("wave_bytes_per_task", "shuffle_bytes_per_task"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                msg = f"{name} must be positive, got {value}"
                raise ValueError(msg)

    def _tasks(self, nbytes: int, workers: int, bytes_per_task: int) -> int:
        if self.tasks_per_stage:
            return self.tasks_per_stage
        n = math.ceil(nbytes / bytes_per_task)
        if self.wave_bytes_per_task is None or n <= workers or workers < 1:
            return n
        n = max(math.ceil(nbytes / self.wave_bytes_per_task), workers)
        return math.ceil(n / workers) * workers

    def leaf_tasks(self, scan_bytes: int, num_work_units: int, workers: int) -> int:
        """``min(units, ceil(bytes / bytes_per_task))``, at least 1 (``wave_bytes_per_task``)."""
        return max(1, min(self._tasks(scan_bytes, workers, self.bytes_per_task), num_work_units))

    def feed_tasks(self, desired_tasks: int | None, workers: int) -> int:
        """Tasks of a leaf stage reading a work unit feed: the source's wish.

        ``tasks_per_stage`` when set, else ``desired_tasks``, else one per
        worker (a feed's size is unknown before it runs); at least 1. The
        planner caps it by the workers.
        """
        return max(1, self.tasks_per_stage or desired_tasks or workers)

    def shuffle_tasks(self, input_bytes: int, workers: int) -> int:
        """``ceil(bytes / shuffle_bytes_per_task)``, at least 1 (see ``wave_bytes_per_task``)."""
        size = self.shuffle_bytes_per_task or self.bytes_per_task
        return max(1, self._tasks(input_bytes, workers, size))
