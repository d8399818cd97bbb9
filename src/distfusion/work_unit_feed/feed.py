"""Work unit feeds on the coordinator: providers, sessions, bounded per-partition streams.

A :class:`WorkUnitFeedProvider` discovers work while the query runs (a
paginated API, a catalog listing object keys page by page). Its
``feed(partition, ctx)`` runs **only in the coordinator process**, one stream
per partition of the leaf stage that reads the feed (partition *i* is task *i*).
A :class:`WorkUnitFeed` wraps a provider; only its id (a UUID) travels in task
plans. For each leaf stage that reads it, the runtime opens a
:class:`FeedSession`::

    coordinator                                          leaf task i (a worker)
      provider.feed(i, ctx) ─> producer thread i
        ─> bounded buffer i (``buffer_units``; a full ─> streamed over the transport
           buffer blocks the producer: back-pressure)     (or an in-process queue)
                                                        ─> read(unit) as it arrives

Each partition has its own thread and buffer, so a slow partition (a slow
provider stream or a slow task) never blocks another. A provider that raises
fails the session: readers get a :class:`~distfusion.errors.FeedError` naming
the feed and the partition, and the session's ``on_error`` callback lets the
runtime tear the query down. Closing the session (the query ended or was
cancelled) sets ``ctx.cancelled`` and closes every provider generator at its
next ``yield``.

Metrics per partition (:class:`FeedPartitionMetrics`): units and bytes streamed,
seconds the reading side waited for the provider, seconds spent inside the
provider, and the buffer's high-water mark.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from distfusion.errors import FeedError, QueryCancelledError
from distfusion.work_unit_feed.filters import Filter
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = [
    "DEFAULT_BUFFER_UNITS",
    "FeedContext",
    "FeedPartitionMetrics",
    "FeedSession",
    "WorkSharingFeedProvider",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "close_query_feeds",
    "lookup_feed",
]

DEFAULT_BUFFER_UNITS = 8
"""Units a partition buffers on the coordinator before its provider blocks."""

_FEEDS: weakref.WeakValueDictionary[str, WorkUnitFeed] = weakref.WeakValueDictionary()
_QUERIES: OrderedDict[str, list[FeedSession]] = OrderedDict()  # query id -> its sessions
_QUERIES_KEPT = 256
_LOCK = threading.Lock()


class FeedContext:
    """What a provider's ``feed(partition, ctx)`` knows of the query it feeds.

    Attributes:
        query_id: the query's UUID.
        num_partitions: how many partitions (leaf tasks) read the feed.
        feed_id: the feed's UUID.
        table: the table name the feed backs.
        stage_id: the leaf stage reading the feed.
        filters: what the read's filter implies about the table's columns, a
            conjunction (:mod:`distfusion.work_unit_feed.filters`; empty: no
            filter). A provider may skip units no row of which can pass them;
            the filter still runs in the tasks, so skipping is optional.
        shared: a dict shared by every partition of this session (for
            providers whose partitions share one discovery, guarded by ``lock``).
        lock: a lock for ``shared``.
    """

    def __init__(
        self,
        query_id: str,
        num_partitions: int,
        feed_id: str,
        table: str,
        stage_id: int,
        filters: tuple[Filter, ...] = (),
    ) -> None:
        self.query_id = query_id
        self.num_partitions = num_partitions
        self.feed_id = feed_id
        self.table = table
        self.stage_id = stage_id
        self.filters = filters
        self.shared: dict = {}
        self.lock = threading.Lock()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        """True once the query ended or was cancelled; a provider may stop early."""
        return self._cancelled.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless cancelled first; returns :attr:`cancelled`.

        For providers that pause between pages: ``if ctx.wait(0.5): return``.
        """
        return self._cancelled.wait(seconds)

    def cancel(self) -> None:
        """Mark the query ended or cancelled (:meth:`FeedSession.close` calls it)."""
        self._cancelled.set()


class WorkUnitFeedProvider:
    """Discovers the work units of a feed-backed table while the query runs.

    Subclass it and implement :meth:`feed`. It is called on the coordinator
    only, once per partition per query, each call on a thread of its own.
    """

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit]:
        """Yield the work units of ``partition`` (``0 <= partition < ctx.num_partitions``).

        A generator is fine. It is closed (``GeneratorExit`` at its ``yield``)
        when the query ends or is cancelled before it finished; it may also
        check ``ctx.cancelled``.

        Raises:
            Exception: anything; the query fails with a FeedError naming the
                feed and ``partition`` and carrying the message.
        """
        raise NotImplementedError


class WorkSharingFeedProvider(WorkUnitFeedProvider):
    """A provider whose units come from one discovery stream, to whichever partition asks next.

    ``discover(ctx)`` is called once per query (per leaf stage reading the
    feed); every partition pulls its next unit from that one iterator, so a
    partition whose task reads faster takes more units and a slow task fewer
    (Trino hands out splits this way). A partition asks for a unit when its
    buffer has room, so keep the feed's ``buffer_units`` small for the sharing
    to follow the tasks' pace.

    Args:
        discover: ``discover(ctx) -> Iterable[WorkUnit]``, called on the coordinator.
    """

    def __init__(self, discover: Callable[[FeedContext], Iterable[WorkUnit]]) -> None:
        self.discover = discover

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit]:
        """The next units of the shared discovery stream, as long as this partition asks.

        Raises:
            Exception: what ``discover`` or its iterator raised.
        """
        with ctx.lock:
            state = ctx.shared.get(id(self))
            if state is None:
                state = (iter(self.discover(ctx)), threading.Lock())
                ctx.shared[id(self)] = state
        stream, lock = state
        try:
            while not ctx.cancelled:
                with lock:
                    try:
                        unit = next(stream)
                    except StopIteration:
                        return
                yield unit
        finally:
            if ctx.cancelled:
                with lock:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()


@dataclass
class FeedPartitionMetrics:
    """What one partition of a feed streamed in one query.

    Attributes:
        partition: the partition (leaf task index).
        work_units: units the provider yielded.
        bytes: serialised bytes of those units (:meth:`WorkUnit.to_bytes`).
        consumer_wait_s: seconds the reading side (the task in process, or the
            thread streaming to it) waited for the provider's next unit.
        provider_s: seconds spent inside the provider (its ``next()``).
        buffer_high_water: most units buffered unread at once (at most the
            feed's ``buffer_units``).
        done: the provider finished (or failed, or was closed).
    """

    partition: int
    work_units: int = 0
    bytes: int = 0
    consumer_wait_s: float = 0.0
    provider_s: float = 0.0
    buffer_high_water: int = 0
    done: bool = False

    def merged(self, other: FeedPartitionMetrics) -> FeedPartitionMetrics:
        """Both figures summed (high-water mark: the larger)."""
        return FeedPartitionMetrics(
            self.partition,
            self.work_units + other.work_units,
            self.bytes + other.bytes,
            self.consumer_wait_s + other.consumer_wait_s,
            self.provider_s + other.provider_s,
            max(self.buffer_high_water, other.buffer_high_water),
            self.done and other.done,
        )

    def describe(self) -> str:
        """One line for ``explain()``."""
        return (
            f"partition {self.partition}: {self.work_units} units, {self.bytes} bytes, "
            f"provider {self.provider_s:.3f} s, consumer waited {self.consumer_wait_s:.3f} s, "
            f"buffer high-water {self.buffer_high_water}"
        )


class _PartitionStream:
    """One partition's bounded stream: a producer thread, any number of readers.

    ``replayable`` keeps every unit so a reader starting again (a retried task
    attempt) gets the same units from the first; otherwise units read are dropped.
    """

    def __init__(self, session: FeedSession, partition: int, capacity: int, replayable: bool):
        self.session = session
        self.partition = partition
        self.capacity = max(1, capacity)
        self.replayable = replayable
        self.cond = threading.Condition()
        self.log: deque[bytes] = deque()
        self.base = 0  # absolute index of log[0]
        self.produced = 0
        self.read_max = 0  # the furthest any reader got
        self.done = False
        self.error: FeedError | None = None
        self.metrics = FeedPartitionMetrics(partition)

    def produce(self) -> None:
        session = self.session
        ctx = session.ctx
        stream = None
        try:
            stream = session.feed.provider.feed(self.partition, ctx)
            it = iter(stream)
            while True:
                with self.cond:
                    while self.produced - self.read_max >= self.capacity and not ctx.cancelled:
                        self.cond.wait(0.1)
                if ctx.cancelled:
                    break
                start = time.perf_counter()
                try:
                    unit = next(it)
                except StopIteration:
                    break
                finally:
                    self.metrics.provider_s += time.perf_counter() - start
                if not isinstance(unit, WorkUnit):
                    msg = f"the provider yielded {type(unit).__name__}, not a WorkUnit"
                    raise TypeError(msg)
                raw = unit.to_bytes()
                with self.cond:
                    self.log.append(raw)
                    self.produced += 1
                    self.metrics.work_units += 1
                    self.metrics.bytes += len(raw)
                    buffered = self.produced - self.read_max
                    self.metrics.buffer_high_water = max(self.metrics.buffer_high_water, buffered)
                    self.cond.notify_all()
        except BaseException as exc:  # the provider's failure fails the query
            err = FeedError(
                session.ctx.table, session.feed.id, self.partition, f"{type(exc).__name__}: {exc}"
            )
            with self.cond:
                self.error = err
                self.cond.notify_all()
            session.fail(err)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                try:
                    close()  # GeneratorExit at its yield: the provider's finally runs
                except Exception:  # a provider failing to close: nothing left to stop
                    pass
            with self.cond:
                self.done = True
                self.metrics.done = True
                self.cond.notify_all()

    def read(self, stop: Callable[[], bool]) -> Iterator[bytes]:
        pos = 0 if self.replayable else None
        while True:
            with self.cond:
                if pos is None:
                    pos = self.base
                start = time.perf_counter()
                waited = False
                while (
                    pos >= self.produced
                    and not self.done
                    and self.error is None
                    and not self.session.ctx.cancelled
                    and not stop()
                ):
                    waited = True
                    self.cond.wait(0.1)
                if waited:
                    self.metrics.consumer_wait_s += time.perf_counter() - start
                if self.error is not None:
                    raise self.error
                if pos < self.produced:
                    raw = self.log[pos - self.base]
                    pos += 1
                    if pos > self.read_max:
                        self.read_max = pos
                        if not self.replayable:
                            while self.base < pos:
                                self.log.popleft()
                                self.base += 1
                        self.cond.notify_all()
                elif self.done:
                    return
                else:
                    msg = (
                        f"query {self.session.ctx.query_id} was cancelled while reading feed "
                        f"{self.session.ctx.table!r} partition {self.partition}"
                    )
                    raise QueryCancelledError(msg)
            yield raw


class FeedSession:
    """One leaf stage's reading of a feed in one query: a stream per partition.

    Created by :meth:`WorkUnitFeed.open` (the runtimes call it when they start
    a leaf stage). Provider threads start at once, so discovery runs ahead of
    the tasks, up to each partition's buffer.

    Attributes:
        feed: the feed.
        ctx: the providers' :class:`FeedContext`.
        error: the first provider failure, or None.
    """

    def __init__(
        self,
        feed: WorkUnitFeed,
        ctx: FeedContext,
        replayable: bool,
        on_error: Callable[[FeedError], None] | None,
    ) -> None:
        self.feed = feed
        self.ctx = ctx
        self.error: FeedError | None = None
        self._on_error = on_error
        self._lock = threading.Lock()
        self._streams = [
            _PartitionStream(self, p, feed.buffer_units, replayable)
            for p in range(ctx.num_partitions)
        ]
        self._threads = [
            threading.Thread(
                target=s.produce,
                name=f"distfusion-feed-{ctx.table}-{s.partition}",
                daemon=True,
            )
            for s in self._streams
        ]

    def start(self) -> None:
        """Start every partition's provider thread."""
        for t in self._threads:
            t.start()

    def read(self, partition: int, stop: Callable[[], bool] = lambda: False) -> Iterator[bytes]:
        """The serialised units of ``partition``, as the provider yields them.

        Blocks while the partition's buffer is empty. A replayable session
        starts every reader at the first unit.

        Raises:
            FeedError: the partition's provider raised.
            QueryCancelledError: the session was closed, or ``stop()`` became true.
            IndexError: no such partition.
        """
        return self._streams[partition].read(stop)

    def metrics(self) -> list[FeedPartitionMetrics]:
        """A copy of every partition's metrics, by partition."""
        out = []
        for s in self._streams:
            with s.cond:
                out.append(replace(s.metrics))
        return out

    def close(self) -> None:
        """Cancel the providers: each generator is closed at its next ``yield``. Idempotent."""
        self.ctx.cancel()
        for s in self._streams:
            with s.cond:
                s.cond.notify_all()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the provider threads; True when all ended."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def fail(self, err: FeedError) -> None:
        """Record a provider failure: the first becomes :attr:`error` and goes to ``on_error``."""
        with self._lock:
            first = self.error is None
            if first:
                self.error = err
        if first and self._on_error is not None:
            self._on_error(err)


class WorkUnitFeed:
    """A feed of work units discovered on the coordinator while a query runs.

    Only :attr:`id` travels in task plans; the provider stays here. On a
    worker, the leaf task's remote feed
    (:class:`~distfusion.worker.feed_inbox.RemoteWorkUnitFeed`) yields what the
    coordinator streams.

    Args:
        provider: the :class:`WorkUnitFeedProvider`.
        buffer_units: units each partition buffers on the coordinator before
            the provider blocks (back-pressure), at least 1.
        feed_id: the UUID (default: a new one).

    Raises:
        TypeError: ``provider`` has no ``feed`` method.
        ValueError: ``buffer_units`` is below 1.
    """

    def __init__(
        self,
        provider: WorkUnitFeedProvider,
        buffer_units: int = DEFAULT_BUFFER_UNITS,
        *,
        feed_id: str | None = None,
    ) -> None:
        if not callable(getattr(provider, "feed", None)):
            msg = f"a WorkUnitFeed needs a provider with feed(partition, ctx); got {provider!r}"
            raise TypeError(msg)
        if buffer_units < 1:
            msg = f"buffer_units must be at least 1, got {buffer_units}"
            raise ValueError(msg)
        self.provider = provider
        self.buffer_units = buffer_units
        self.id = feed_id or str(uuid.uuid4())
        self._sessions: deque[FeedSession] = deque(maxlen=64)
        _FEEDS[self.id] = self

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit]:
        """The provider's units of ``partition`` (on the coordinator; see the provider)."""
        return iter(self.provider.feed(partition, ctx))

    def open(
        self,
        query_id: str,
        num_partitions: int,
        *,
        stage_id: int = 0,
        table: str = "",
        replayable: bool = False,
        on_error: Callable[[FeedError], None] | None = None,
        filters: tuple[Filter, ...] = (),
    ) -> FeedSession:
        """Start streaming this feed for one leaf stage of query ``query_id``.

        Called by the runtimes on the coordinator.

        Args:
            query_id: the query.
            num_partitions: the leaf stage's task count.
            stage_id: the leaf stage.
            table: the table name the feed backs (for errors and metrics).
            replayable: keep every unit so that a reader may start again (a
                retried task); memory grows with the units (their bytes).
            on_error: called once, from a provider thread, with the first failure.
            filters: what the read's filter implies (:attr:`FeedContext.filters`).

        Returns:
            The started session; :func:`close_query_feeds` closes it.
        """
        ctx = FeedContext(query_id, num_partitions, self.id, table, stage_id, filters)
        session = FeedSession(self, ctx, replayable, on_error)
        self._sessions.append(session)
        with _LOCK:
            _QUERIES.setdefault(query_id, []).append(session)
            _QUERIES.move_to_end(query_id)
            while len(_QUERIES) > _QUERIES_KEPT:
                _QUERIES.popitem(last=False)
        session.start()
        return session

    def metrics(self, query_id: str | None = None) -> list[FeedPartitionMetrics]:
        """Per-partition metrics of query ``query_id`` (default: the last query that read the feed).

        When one query reads the feed in several stages, their figures are
        summed by partition.

        Returns:
            One :class:`FeedPartitionMetrics` per partition, by partition;
            empty when no query read the feed.
        """
        sessions = list(self._sessions)
        if not sessions:
            return []
        query_id = query_id or sessions[-1].ctx.query_id
        return _merge([s for s in sessions if s.ctx.query_id == query_id])

    def __repr__(self) -> str:
        return f"WorkUnitFeed({self.id[:8]}, {type(self.provider).__name__})"


def _merge(sessions: list[FeedSession]) -> list[FeedPartitionMetrics]:
    by_partition: dict[int, FeedPartitionMetrics] = {}
    for s in sessions:
        for m in s.metrics():
            prev = by_partition.get(m.partition)
            by_partition[m.partition] = m if prev is None else prev.merged(m)
    return [by_partition[p] for p in sorted(by_partition)]


def lookup_feed(feed_id: str) -> WorkUnitFeed:
    """The feed with ``feed_id`` in this process (the coordinator).

    Raises:
        KeyError: no live feed has this id here (not the coordinator, or the
            feed was garbage-collected).
    """
    feed = _FEEDS.get(feed_id)
    if feed is None:
        msg = f"no work unit feed {feed_id} in this process"
        raise KeyError(msg)
    return feed


def close_query_feeds(query_id: str) -> None:
    """Close every feed session of ``query_id`` (the providers stop). Idempotent."""
    with _LOCK:
        sessions = list(_QUERIES.get(query_id, ()))
    for s in sessions:
        s.close()
