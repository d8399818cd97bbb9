"""A task's inputs as streams DataFusion pulls batch by batch (streamed exchanges).

A consumer task reads each producer partition as the producer writes it
(:meth:`~distfusion.worker.worker.Worker.execute_partition` yields batches as
they arrive). To run the fragment over those streams without collecting them
first, each input is registered as a ``pyarrow.dataset.Dataset`` whose
fragments pull from Python: datafusion-python's ``DatasetExec`` makes one
DataFusion partition per fragment and calls the fragment's batch iterator once
per batch (``Python::with_gil(|py| iter.next())``), so a hash join's probe side,
a filter or a partial aggregate starts on the first batch, and several
partitions each pull their own stream::

    producer partitions of input i   (url, task, partition) reads, split round-robin
        ├─ read 0, read 2, ... ──> stream 0 ──> DatasetExec partition 0 ─┐
        └─ read 1, read 3, ... ──> stream 1 ──> DatasetExec partition 1 ─┴─> fragment

(``SessionContext.from_arrow`` and ``register_record_batches`` read everything
before planning: they are what a materialised input uses.)

Three limits of pulling from Python, and what this module does about them:

- **A streamed input has no statistics** (``DatasetExec`` reports them
  unknown), and DataFusion picks a hash join's build side and mode from
  statistics: :func:`stream_plan` reads a join's build side whole first and
  streams its probe side only behind a small build side.

- **A waiting pull holds a tokio thread.** DataFusion polls ``DatasetExec``
  on datafusion-python's one tokio runtime; a pull waiting for the producer
  blocks the thread polling it. When every runtime thread waits, nothing else
  in the process runs -- not even the producer task the pull waits for (the
  local runtime, or a Flight worker running both): a deadlock. The runtime
  has ``TOKIO_WORKER_THREADS`` threads (tokio reads the variable when the
  runtime starts; the cores when unset). With
  ``DISTFUSION_STREAM_EXCHANGES=1`` (:data:`STREAM_EXCHANGES`), importing
  distfusion sets it to the cores plus :data:`EXTRA_TOKIO_THREADS` when
  unset (at import: tokio reads it once, when DataFusion's runtime starts,
  which may be before any distfusion object exists), and a task streams an input only
  when its partitions fit in the threads beyond the cores that other streams
  do not hold (:class:`PullSlots`); otherwise it reads the input whole first,
  as before. A process whose DataFusion started before distfusion was
  imported counts the cores only. Producers in other processes (the Flight
  runtime's head stage) need none of this process's threads: their inputs
  stream through every thread but one.
- **Filters pushed into a dataset scan run in pyarrow** (``DatasetExec`` hands
  them to the scanner as exact), which has no kernels for ``string_view``.
  A task with a streamed input therefore runs without the logical
  ``push_down_filter`` rule: the fragment was optimised on the coordinator
  already, and its filters stay DataFusion operators over the scan.

Cancellation: a pull that waits checks its ``cancelled()`` every 0.1 s and
raises :class:`~distfusion.errors.QueryCancelledError`, which fails DataFusion's
stream wherever it pulls -- a join's probe side, an aggregate, a sort -- so
the task's DataFusion work stops at its next pull. Inputs read whole are
*replayed* the same way (:meth:`InputBinding.replay`) where
:func:`stream_plan` allows it, so a task over them stops as soon: DataFusion
runs a fragment over memory tables without returning to Python, and an
aggregate over a join yields nothing until its input ends. A replay hands its
batches out in slices sized so that DataFusion works about :data:`PULL_SECONDS`
on each (:func:`paced`), so even a join making millions of rows of one input
batch stops within a fraction of a second. DataFusion reports the
error as text; :attr:`InputBinding.error` keeps the Python exception so the
task raises the producer's own error (a :class:`~distfusion.errors.TaskError`
with its stage and worker) or the cancellation.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
from substrait.proto import Plan

from distfusion.errors import QueryCancelledError
from distfusion.protocol.environment import environment_switches
from distfusion.substrait_plan.walk import children, rel_kind, relations, source_tables

__all__ = [
    "EXTRA_TOKIO_THREADS",
    "MAX_BUILD_BYTES",
    "InputBinding",
    "InputStreams",
    "PullSlots",
    "STREAM_EXCHANGES",
    "metered",
    "StreamDataset",
    "StreamPlan",
    "pull_slots",
    "stream_plan",
    "streams_task_inputs",
]

EXTRA_TOKIO_THREADS = 4
"""Tokio threads beyond the cores that distfusion asks datafusion-python's runtime
for (``TOKIO_WORKER_THREADS``): at most this many DataFusion partitions of a process
wait on streamed inputs at once (more are read whole). More runnable threads
than cores slow every query; four cost little (docs/benchmarks.md, "Streamed
exchanges")."""

MAX_BUILD_BYTES = 4 * 1024 * 1024
"""A join's probe side is streamed only when its build side, read whole first, is at
most this many Arrow bytes (see :func:`stream_plan`)."""

STREAM_EXCHANGES = environment_switches().stream_exchanges
"""Whether importing distfusion gives DataFusion's runtime the threads streamed inputs need
(``DISTFUSION_STREAM_EXCHANGES=1``, :func:`~distfusion.protocol.environment.environment_switches`).

A process setting, read at import: tokio fixes its threads when DataFusion's
runtime starts, which may be before any distfusion object exists.

Off by default: the extra tokio threads slow every DataFusion query of the
process, single-node ones included (docs/benchmarks.md, "Streamed
exchanges"). Without them
only inputs whose producers run in other processes are streamed (the Flight
runtime's head stage; see :class:`PullSlots`) unless ``TOKIO_WORKER_THREADS``
is set above the cores by the user; producers still hand out their batches
as they make them and Flight streams them."""


def streams_task_inputs(setting: bool | None) -> bool:
    """Whether a task on a worker streams its inputs (the head stage always does).

    ``setting``: the task plan's (``TaskPlan.stream_inputs``, from
    ``DistributedConfig.stream_task_inputs`` or the coordinator's environment);
    None: this process's ``DISTFUSION_STREAM_TASK_INPUTS=1``, read now
    (:func:`~distfusion.protocol.environment.environment_switches`). Off by
    default: streaming every task's inputs gained nothing over reading them
    whole (docs/benchmarks.md, "Streamed exchanges"), and with one slot per
    worker a consumer task starts after its producers anyway.
    """
    if setting is not None:
        return setting
    return bool(environment_switches().stream_task_inputs)


PULL_SECONDS = 0.05
"""How long DataFusion may work on one pulled batch (seconds) before the next pulls
are sliced smaller (see :func:`paced`). A pull is where a cancelled task stops, so
this bounds how late it stops, even for a join whose probe rows each match thousands
of build rows (docs/benchmarks.md, "Cancellation")."""

FIRST_SLICE_ROWS = 64
"""Rows of the first batch a stream hands DataFusion; each pull it works on within
half of :data:`PULL_SECONDS` doubles the next slice, up to whole batches."""

_TOKIO_ENV = "TOKIO_WORKER_THREADS"
_JOINS = {"join", "cross", "hash_join", "merge_join", "nested_loop_join"}


def _cores() -> int:
    return max(1, os.cpu_count() or 1)


def _running_tokio_threads() -> int:
    """Threads named by tokio in this process now (workers and blocking threads; Linux only)."""
    count = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    count += f.read().startswith("tokio-r")
            except OSError:
                continue
    except OSError:
        return 0
    return count


_STARTED_BEFORE = _running_tokio_threads() > 0
"""DataFusion's runtime ran before distfusion was imported: its thread count is unknown."""

if STREAM_EXCHANGES and _TOKIO_ENV not in os.environ:  # read when DataFusion's runtime starts
    os.environ[_TOKIO_ENV] = str(_cores() + EXTRA_TOKIO_THREADS)


def _tokio_threads() -> int:
    """Worker threads of datafusion-python's tokio runtime (the cores when unknown)."""
    if _STARTED_BEFORE:
        return _cores()
    try:
        return int(os.environ.get(_TOKIO_ENV, "")) or _cores()
    except ValueError:
        return _cores()


@dataclass(frozen=True)
class StreamPlan:
    """Which inputs of a fragment may be streamed (:func:`stream_plan`).

    Attributes:
        whole: input tables read whole first (a join's build side, an input
            read in a subquery, or every input of a plan that cannot be read).
        gated: input table -> the input tables whose bytes, read whole, must
            not pass :data:`MAX_BUILD_BYTES` for it to be streamed (a join's
            probe side and the inputs of its build side). Other inputs are
            streamed.
    """

    whole: frozenset[str]
    gated: dict[str, frozenset[str]]

    def streams(
        self, table: str, whole_bytes: dict[str, int], own_bytes: int | None = None
    ) -> bool:
        """Whether ``table`` is streamed, given the bytes of the inputs read whole so far.

        ``own_bytes``: the bytes of ``table`` itself when it is in memory
        already (a replayed input): a probe side at least as large as the
        build side it meets streams too, since DataFusion would not swap the
        sides then either (it builds on the smaller side).
        """
        if table in self.whole:
            return False
        gate = self.gated.get(table)
        if gate is None:
            return True
        if any(t not in whole_bytes for t in gate):
            return False
        build = sum(whole_bytes[t] for t in gate)
        return build <= MAX_BUILD_BYTES or (own_bytes is not None and own_bytes >= build)


def stream_plan(fragment: bytes, tables: list[str]) -> StreamPlan:
    """Which of the input ``tables`` of Substrait ``fragment`` may be streamed.

    DataFusion picks a hash join's build side and mode from its inputs'
    statistics (``JoinSelection``: the smaller side builds, a small one is
    collected once). A streamed input has none (``DatasetExec`` reports
    unknown statistics), so streaming a join's inputs would let the fragment's
    left side build whatever its size: TPC-H got slower. The rule keeps
    DataFusion's choices:

    - every input under a join's left (build) side is read whole (a memory
      table, exact statistics), and so is every input read in a subquery
      (decorrelated into a join);
    - an input under a join's right (probe) side is streamed when the left
      side reads only inputs and those, read whole, hold at most
      :data:`MAX_BUILD_BYTES`: DataFusion then collects the small left side
      and probes with the stream, as it would (it swaps sides only for a
      right side smaller still);
    - an input under no join (unions, filters, aggregates, sorts) is streamed.

    A fragment that cannot be parsed reads every input whole.
    """
    names = set(tables)
    try:
        plan = Plan()
        plan.ParseFromString(fragment)
        root = plan.relations[0].root.input
        whole = set(source_tables(root, names))  # every input; those not in a subquery removed:
        direct = {
            r.read.named_table.names[-1]
            for r in relations(root)
            if rel_kind(r) == "read" and len(r.read.named_table.names)
        }
        whole -= direct
        gated: dict[str, set[str]] = {}
        for rel in relations(root):
            if rel_kind(rel) not in _JOINS:
                continue
            left, *right = children(rel)
            build = set(source_tables(left, names))
            whole |= build
            only_inputs = all(
                rel_kind(r) != "read"
                or (len(r.read.named_table.names) and r.read.named_table.names[-1] in names)
                for r in relations(left)
            )
            for side in right:
                for t in source_tables(side, names):
                    if not only_inputs:
                        whole.add(t)
                    else:
                        gated.setdefault(t, set()).update(build)
    except Exception:  # a plan this walk does not know: nothing streamed, as before
        return StreamPlan(frozenset(names), {})
    return StreamPlan(frozenset(whole), {t: frozenset(g) for t, g in gated.items()})


class PullSlots:
    """How many DataFusion partitions of this process may wait on a streamed input at once.

    A streamed input partition may hold a tokio thread while it waits for its
    producer. Counted per process (every task and the head stage share
    datafusion-python's runtime), in two limits:

    - producers that may run in this process (the local runtime, a worker's
      tasks): the threads beyond the cores, so that waits never take a core
      from the producers (none unless ``TOKIO_WORKER_THREADS`` was raised);
    - producers in other processes (the Flight runtime's head stage): every
      thread but one. Nothing here runs the producers, so a wait costs no
      work; the thread left free keeps everything else in the process going.

    Args:
        slots: the first limit; None: the runtime's threads minus the cores,
            read on first use (0 when DataFusion started with the cores only).
        remote_slots: the second; None: the runtime's threads minus one.
    """

    def __init__(self, slots: int | None = None, remote_slots: int | None = None) -> None:
        self._slots = slots
        self._remote_slots = remote_slots
        self._used = 0
        self._lock = threading.Lock()

    def take(self, n: int, remote: bool = False) -> int:
        """Take ``n`` slots if free (``remote``: as many as are free, up to ``n``).

        Returns:
            How many were taken.
        """
        with self._lock:
            if self._slots is None:
                self._slots = max(0, _tokio_threads() - _cores())
            if self._remote_slots is None:
                self._remote_slots = max(0, _tokio_threads() - 1)
            free = (self._remote_slots if remote else self._slots) - self._used
            taken = max(0, min(n, free)) if remote else (n if n <= free else 0)
            self._used += taken
            return taken

    def give_back(self, n: int) -> None:
        """Return ``n`` slots taken by :meth:`take`."""
        with self._lock:
            self._used = max(0, self._used - n)

    @property
    def used(self) -> int:
        """Slots taken now."""
        return self._used


pull_slots = PullSlots()
"""The process's :class:`PullSlots`."""


def metered(
    meter, read_input: Callable[[int], list[pa.RecordBatch] | InputStreams]
) -> Callable[[int], list[pa.RecordBatch] | InputStreams]:
    """``read_input`` counted by ``meter`` (a :class:`~distfusion.metrics.task.TaskMeter`).

    An input read as a list is timed and counted at once; each batch of
    :class:`InputStreams` is counted, and the wait for it timed, as it is pulled.
    """

    def timed(i: int, open_):
        def read():
            start = time.perf_counter()
            for batch in open_():
                meter.count_input(i, batch, time.perf_counter() - start)
                yield batch
                start = time.perf_counter()

        return read

    def read(i: int) -> list[pa.RecordBatch] | InputStreams:
        start = time.perf_counter()
        got = read_input(i)
        if isinstance(got, InputStreams):
            return InputStreams(timed(i, o) for o in got.opens)
        meter.input_wait_s += time.perf_counter() - start
        for batch in got:
            meter.count_input(i, batch)
        return got

    return read


class InputStreams:
    """One input of a task as streams: one opener per producer partition it reads.

    ``opens[k]()`` starts reading the k-th producer partition (in the order of
    :meth:`~distfusion.protocol.task_plan.TaskPlan.input_reads`) and returns
    its batches as an iterator; it is called when the stream reading it gets
    there, not before.
    """

    def __init__(self, opens: Iterable[Callable[[], Iterable[pa.RecordBatch]]]) -> None:
        self.opens = list(opens)
        self._whole: list[pa.RecordBatch] | None = None

    def read_all(self) -> list[pa.RecordBatch]:
        """Every batch of every producer partition, in order (the input read whole, once)."""
        if self._whole is None:
            self._whole = [b for open_ in self.opens for b in open_()]
        return self._whole


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema`` (columns matched by position, cast when the types differ)."""
    if batch.schema.equals(schema):
        return batch
    pairs = zip(batch.columns, schema, strict=True)
    columns = [c if c.type == f.type else c.cast(f.type) for c, f in pairs]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _Stream:
    """The batches of some producer partitions in turn, kept for a run again when asked.

    :meth:`batches` may be called again (a task run again after DataFusion's
    "Resources exhausted"): the new pass replays what was read, then reads
    on. Pulls are serialised: the pull of an abandoned pass may still wait
    on a tokio thread (DataFusion drops a failed stream only after that pull
    returns); its batch is kept for the new pass (an abandoned pass that is
    behind the trimmed batches pulls, so its batch still lands there).
    """

    def __init__(
        self,
        opens: list[Callable[[], Iterable[pa.RecordBatch]]],
        schema: pa.Schema,
        binding: InputBinding,
        keep: bool,
    ) -> None:
        self._opens = iter(opens)
        self._it: Iterator[pa.RecordBatch] | None = None
        self._schema = schema
        self._binding = binding
        self._kept: list[pa.RecordBatch] | None = [] if keep else None
        self._trim = False  # stop_keeping was called
        self._dropped = 0  # batches trimmed from the front of _kept
        self._passes = 0
        self._lock = threading.Lock()

    def _pull(self) -> pa.RecordBatch | None:
        """The next non-empty batch of the producer partitions (None at their end); lock held."""
        while True:
            try:
                self._binding.check()
                if self._it is None:
                    open_ = next(self._opens, None)
                    if open_ is None:
                        return None
                    self._it = iter(open_())
                batch = next(self._it, None)
            except BaseException as exc:
                self._binding.failed(exc)
                raise
            if batch is None:
                self._it = None
            elif batch.num_rows:
                return _conform(batch, self._schema)

    def stop_keeping(self) -> None:
        """Keep no batch the live pass has read (no pass may follow).

        The kept list is trimmed, not dropped: a batch an abandoned pass
        pulls afterwards is still appended there, and the live pass reads it
        from there, so none is lost.
        """
        with self._lock:
            self._trim = self._kept is not None

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._passes += 1
        this_pass = self._passes
        if this_pass > 1 and (self._kept is None or self._trim):
            msg = "a streamed input cannot be read twice"
            raise RuntimeError(msg)
        i = 0  # batches this pass has read
        while True:
            with self._lock:
                kept = self._kept
                if kept is None:
                    batch = self._pull()
                else:
                    live = this_pass == self._passes  # not a pass abandoned by a failed run
                    if self._trim and live and i > self._dropped:  # read: not needed again
                        del kept[: i - self._dropped]
                        self._dropped = i
                    j = i - self._dropped
                    if 0 <= j < len(kept):  # read before (a run again, or an abandoned pull)
                        batch = kept[j]
                    else:
                        batch = self._pull()
                        if batch is not None:
                            kept.append(batch)
            if batch is None:
                return
            i += 1
            yield batch


class _Replay:
    """Batches already in memory, handed out in paced slices with a cancellation check each.

    DataFusion works on a memory table's batches without returning to
    Python, so a cancelled task over it ran on until its fragment yielded (an
    aggregate over a join: the end of the task). Read through this instead,
    the next pull raises QueryCancelledError. Replaying never waits, so it holds
    no tokio thread and takes no pull slot.
    """

    def __init__(self, batches: list[pa.RecordBatch], binding: InputBinding) -> None:
        self._batches = batches
        self._binding = binding

    def stop_keeping(self) -> None:
        """Nothing kept: the batches are the input read whole."""

    def batches(self) -> Iterator[pa.RecordBatch]:
        return paced(iter(self._batches), self._binding)


def paced(batches: Iterator[pa.RecordBatch], binding: InputBinding) -> Iterator[pa.RecordBatch]:
    """``batches`` in slices sized so DataFusion works about :data:`PULL_SECONDS` on each.

    The slice starts at :data:`FIRST_SLICE_ROWS` rows and doubles after every
    pull DataFusion came back from within half of ``PULL_SECONDS``; after two
    slow pulls in a row it shrinks to the rows DataFusion worked through in
    ``PULL_SECONDS`` (at least one). Two, because one slow pull is more often a
    sort or aggregate spilling than a fan-out, and a slice of a batch counts
    as its whole batch in DataFusion's memory accounting. Only the time this
    generator is suspended counts. Every slice checks the task's cancellation
    first.

    Replays only: DataFusion's batch coalescing holds batches of under half
    its batch size until more rows come, so a streamed input's first slices
    would wait there for rows its producer has not made yet
    (tests/runtime/test_streaming.py), where a whole batch passes through.
    """
    cap, slow, half = FIRST_SLICE_ROWS, False, PULL_SECONDS / 2
    for batch in batches:
        offset, rows = 0, batch.num_rows
        while offset < rows:
            binding.check()
            piece = batch if offset == 0 and cap >= rows else batch.slice(offset, cap)
            offset += piece.num_rows
            handed = time.perf_counter()
            yield piece
            took = time.perf_counter() - handed
            if took <= half:
                cap, slow = min(2 * cap, 1 << 30), False
            elif took > PULL_SECONDS:
                if slow:
                    cap = max(1, int(piece.num_rows * PULL_SECONDS / took))
                slow = True


class _Scan:
    """What ``DatasetExec`` asks a fragment's scanner for: the projected schema and the batches."""

    def __init__(self, schema: pa.Schema, columns: list[str] | None, source) -> None:
        self._columns = columns
        self._source = source
        self.projected_schema = (
            schema if columns is None else pa.schema([schema.field(c) for c in columns])
        )

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self._source():
            yield batch if self._columns is None else batch.select(self._columns)


class _Fragment:
    def __init__(self, schema: pa.Schema, stream: _Stream | _Replay) -> None:
        self._schema = schema
        self._stream = stream

    def scanner(self, schema=None, columns=None, filter=None, **_):  # noqa: A002 - pyarrow's name
        if filter is not None:  # push_down_filter is off for streamed inputs: never happens
            msg = f"a streamed input got a filter to apply: {filter}"
            raise NotImplementedError(msg)
        return _Scan(self._schema, columns, self._stream.batches)


class StreamDataset(ds.Dataset):
    """A ``pyarrow.dataset.Dataset`` whose fragments are streams DataFusion pulls per batch.

    Only what ``SessionContext.register_dataset`` and datafusion-python's
    ``DatasetExec`` call is implemented: ``schema``, ``scanner`` (for the
    projected schema) and ``get_fragments``; each fragment's
    ``scanner(...).to_batches()`` is one DataFusion partition. Subclassing
    ``Dataset`` passes datafusion-python's ``isinstance`` check; nothing of
    the C++ dataset is used.

    Args:
        schema: the input's declared schema (every batch is cast to it).
        streams: one per DataFusion partition.
    """

    def __init__(self, schema: pa.Schema, streams: list[_Stream | _Replay]) -> None:  # no C++
        self._schema_ = schema
        self.streams = streams

    @property
    def schema(self) -> pa.Schema:  # noqa: D102
        return self._schema_

    def scanner(self, columns=None, filter=None, **_):  # noqa: A002, D102
        return _Scan(self._schema_, columns, lambda: iter(()))

    def get_fragments(self, filter=None):  # noqa: A002, D102
        return [_Fragment(self._schema_, s) for s in self.streams]


class InputBinding:
    """The streamed inputs of one task: their pull slots and the first error a pull raised.

    Args:
        cancelled: checked before every pull; true raises QueryCancelledError.
        keep: keep what was read, for a run again (a bounded memory pool).
        slots: the process's pull slots (default :data:`pull_slots`).
        remote: the producers run in other processes (see :class:`PullSlots`).
    """

    def __init__(
        self,
        cancelled: Callable[[], bool] = lambda: False,
        keep: bool = False,
        slots: PullSlots | None = None,
        remote: bool = False,
    ) -> None:
        self.cancelled = cancelled
        self.keep = keep
        self.slots = slots or pull_slots
        self.remote = remote
        self.taken = 0
        self.error: BaseException | None = None
        self.datasets: dict[str, StreamDataset] = {}

    def failed(self, exc: BaseException) -> None:
        """A pull raised ``exc`` (the first one is kept)."""
        if self.error is None:
            self.error = exc

    def check(self) -> None:
        """Raise QueryCancelledError (and keep it as :attr:`error`) when the task was cancelled."""
        if self.cancelled():
            exc = QueryCancelledError("query cancelled")
            self.failed(exc)
            raise exc

    def stream(
        self, table: str, schema: pa.Schema, inputs: InputStreams, partitions: int
    ) -> StreamDataset | None:
        """``inputs`` as a dataset of up to ``partitions`` streams, or None to read it whole.

        As many streams as the process's pull slots take (see the module's
        docstring); None when they take none or there is nothing to stream.
        """
        if table in self.datasets:  # a run again: the same streams, replayed
            return self.datasets[table]
        if not inputs.opens:
            return None
        n = self.slots.take(max(1, min(partitions, len(inputs.opens))), self.remote)
        if n == 0:
            return None
        self.taken += n
        groups = [inputs.opens[g::n] for g in range(n)]
        dataset = StreamDataset(schema, [_Stream(g, schema, self, self.keep) for g in groups])
        self.datasets[table] = dataset
        return dataset

    def replay(
        self, table: str, schema: pa.Schema, batches: list[pa.RecordBatch], partitions: int
    ) -> StreamDataset:
        """``batches`` (in memory) as a dataset of up to ``partitions`` cancellable streams.

        Split round-robin, as a memory table would be; see :class:`_Replay`.
        """
        if table not in self.datasets:
            n = max(1, min(partitions, len(batches)))
            streams: list[_Stream | _Replay] = [_Replay(batches[g::n], self) for g in range(n)]
            self.datasets[table] = StreamDataset(schema, streams)
        return self.datasets[table]

    def stop_keeping(self) -> None:
        """Keep no more of what the streams read, and drop what they kept.

        Called once a run again is ruled out (the head stage yielded a batch),
        so a streamed head stage holds its inputs' batches only while
        DataFusion works on them, not until the query ends.
        """
        self.keep = False
        for dataset in self.datasets.values():
            for stream in dataset.streams:
                stream.stop_keeping()

    def close(self) -> None:
        """Give the pull slots back (the task's DataFusion work ended). Idempotent."""
        self.slots.give_back(self.taken)
        self.taken = 0
