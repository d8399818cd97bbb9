"""The worker side of a work unit feed: a leaf task's bounded inbox and its remote feed.

A leaf task reading a feed holds a :class:`RemoteWorkUnitFeed` over a
:class:`FeedInbox`. Units reach the inbox one of two ways:

- pushed (local and Flight runtimes): the coordinator streams the partition to
  the worker running the task (``WorkerTransport.stream_feed``); the transport
  calls :meth:`~distfusion.worker.worker.Worker.receive_feed`, which puts each
  unit here, blocking while the inbox is full (back-pressure up to the provider);
- pulled (Spark): executors cannot be pushed to, so a thread of the task
  reads the partition from the driver's feed endpoint
  (:func:`~distfusion.transport.feed_endpoint.pull_feed`) into the inbox.

The task takes units in chunks of what has arrived (:meth:`FeedInbox.chunks`),
so reading starts with the first unit.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator

from distfusion.errors import DistfusionError, FeedError, QueryCancelledError
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = ["CHUNK_UNITS", "INBOX_UNITS", "FeedInbox", "RemoteWorkUnitFeed"]

INBOX_UNITS = 8
"""Units a task's inbox holds before the stream feeding it blocks."""

CHUNK_UNITS = 4
"""Most units a chunked leaf task runs its fragment over at once."""


class FeedInbox:
    """A bounded queue of serialised units for one task and one feed table.

    Args:
        capacity: units held before :meth:`put` blocks.
        cancelled: polled while waiting; true stops :meth:`put` and the readers.
    """

    def __init__(self, capacity: int = INBOX_UNITS, cancelled: Callable[[], bool] = lambda: False):
        self.capacity = max(1, capacity)
        self.cancelled = cancelled
        self._cond = threading.Condition()
        self._units: deque[bytes] = deque()
        self._finished = False
        self._error: DistfusionError | None = None
        self._closed = False
        self.received = 0

    def put(self, raw: bytes) -> bool:
        """Add one unit, waiting while the inbox is full.

        Returns:
            False when the inbox was closed (its task ended): the sender stops.

        Raises:
            QueryCancelledError: the query was cancelled while waiting.
        """
        with self._cond:
            while len(self._units) >= self.capacity and not self._closed:
                if self.cancelled():
                    raise QueryCancelledError("query cancelled while streaming a work unit feed")
                self._cond.wait(0.1)
            if self._closed:
                return False
            self._units.append(raw)
            self.received += 1
            self._cond.notify_all()
            return True

    def finish(self, error: DistfusionError | None = None) -> None:
        """The stream ended (with ``error`` when the provider or the transport failed)."""
        with self._cond:
            self._finished = True
            self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        """The task ended: drop what is held, make senders stop."""
        with self._cond:
            self._closed = True
            self._units.clear()
            self._cond.notify_all()

    def chunks(self, max_units: int = CHUNK_UNITS) -> Iterator[list[WorkUnit]]:
        """Lists of 1..``max_units`` units, each as soon as one has arrived, until the end.

        Raises:
            FeedError: the provider failed (names the feed and the partition),
                or the task could not reach the feed.
            QueryCancelledError: the query was cancelled.
        """
        while True:
            with self._cond:
                while not self._units and not self._finished:
                    if self.cancelled() or self._closed:
                        raise QueryCancelledError("query cancelled while reading a work unit feed")
                    self._cond.wait(0.1)
                if self._error is not None:
                    raise self._error
                if not self._units:
                    return
                raw = [self._units.popleft() for _ in range(min(max_units, len(self._units)))]
                self._cond.notify_all()
            yield [WorkUnit.from_bytes(r) for r in raw]


class RemoteWorkUnitFeed:
    """A feed as a leaf task on a worker sees it: what the coordinator streams.

    Args:
        feed_id: the feed's UUID (from the plan).
        table: the table it backs.
        partition: the task's partition.
        inbox: where the streamed units arrive.
    """

    def __init__(self, feed_id: str, table: str, partition: int, inbox: FeedInbox) -> None:
        self.id = feed_id
        self.table = table
        self.partition = partition
        self.inbox = inbox

    def feed(self, partition: int | None = None) -> Iterator[WorkUnit]:
        """The units of this task's partition, one by one, as they arrive.

        Raises:
            ValueError: ``partition`` is not this task's partition.
            FeedError: the provider failed, or the feed cannot be reached.
            QueryCancelledError: the query was cancelled.
        """
        if partition is not None and partition != self.partition:
            msg = f"this task reads partition {self.partition} of feed {self.id}, not {partition}"
            raise ValueError(msg)
        for chunk in self.inbox.chunks(1):
            yield from chunk

    def chunks(self, max_units: int = CHUNK_UNITS) -> Iterator[list[WorkUnit]]:
        """See :meth:`FeedInbox.chunks`."""
        return self.inbox.chunks(max_units)

    def unreachable(self, endpoint: str, detail: str) -> FeedError:
        """The error a task raises when it cannot reach the feed at ``endpoint``."""
        return FeedError(
            self.table,
            self.id,
            self.partition,
            f"the worker cannot reach the work unit feed at {endpoint}: {detail}",
        )
