"""The work unit feeds of one query on the coordinator, for every runtime.

A :class:`QueryFeeds` opens one feed session per leaf stage and feed table
(:meth:`WorkUnitFeed.open`) when the runtime starts the stage, and gets its
partitions to the tasks:

- :meth:`QueryFeeds.push` (local and Flight runtimes): a thread per task streams
  its partition through ``WorkerTransport.stream_feed``;
- :meth:`QueryFeeds.serve` (Spark): the session is registered with the
  runtime's :class:`~distfusion.transport.feed_endpoint.FeedEndpoint` under the
  query's secret, and the stage's feed scans name the endpoint; tasks pull;
- :meth:`QueryFeeds.local_chunks`: the head stage (run here) reads its session
  directly.

A provider that fails calls the runtime's ``on_error`` (which tears the query
down) and is remembered (:attr:`QueryFeeds.error`): the runtime raises it
instead of the cancellation it caused.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Iterator

from distfusion.errors import FeedError, PlanningError
from distfusion.protocol.task_plan import ScanShare, TaskKey
from distfusion.stages import SourceScan, Stage
from distfusion.transport.base import WorkerTransport
from distfusion.work_unit_feed import filters
from distfusion.work_unit_feed.feed import (
    FeedSession,
    close_query_feeds,
    lookup_feed,
)
from distfusion.work_unit_feed.unit import WorkUnit
from distfusion.worker.feed_inbox import FeedInbox

__all__ = ["QueryFeeds", "has_feeds"]

log = logging.getLogger("distfusion.coordinator.feeds")


def has_feeds(stage: Stage) -> bool:
    """True when ``stage`` reads a work unit feed."""
    return any(scan.source.is_feed for scan in stage.scans)


class QueryFeeds:
    """The feed sessions of query ``query_id``.

    Args:
        query_id: the query (its id on the workers).
        on_error: called once with the first provider failure (from a provider thread).
        replayable: sessions keep every unit so a retried task attempt reads
            its partition again from the first unit (Spark retries tasks).
    """

    def __init__(
        self,
        query_id: str,
        on_error: Callable[[FeedError], None] | None = None,
        replayable: bool = False,
    ) -> None:
        self.query_id = query_id
        self.replayable = replayable
        self.secret = secrets.token_hex(16)
        self._on_error = on_error
        self._sessions: dict[tuple[int, str], FeedSession] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.error: FeedError | None = None

    def open(self, stage: Stage, scan: SourceScan) -> FeedSession:
        """The session of ``scan`` (a feed scan) in ``stage``, opened on first use.

        Raises:
            PlanningError: the feed does not live in this process (this is not
                the coordinator that registered it).
        """
        key = (stage.stage_id, scan.source.name)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                try:
                    feed = lookup_feed(scan.source.options["feed_id"])
                except KeyError:
                    msg = (
                        f"table {scan.source.name!r} is fed by work unit feed "
                        f"{scan.source.options['feed_id']}, which is not registered in this "
                        "process (feeds run on the coordinator that registered them)"
                    )
                    raise PlanningError(msg) from None
                session = feed.open(
                    self.query_id,
                    stage.num_tasks,
                    stage_id=stage.stage_id,
                    table=scan.source.name,
                    replayable=self.replayable,
                    on_error=self._failed,
                    filters=filters.from_json(scan.source.options.get("filters") or []),
                )
                self._sessions[key] = session
        return session

    def push(
        self, transport: WorkerTransport, stage: Stage, placement: Callable[[int], str]
    ) -> None:
        """Stream every feed partition of ``stage`` to its task (``placement(task) -> URL``)."""
        for scan in stage.scans:
            if not scan.source.is_feed:
                continue
            session = self.open(stage, scan)
            for t in range(stage.num_tasks):
                key = TaskKey(self.query_id, stage.stage_id, t)
                threading.Thread(
                    target=self._push_one,
                    args=(transport, placement(t), key, scan.source.name, session),
                    name=f"distfusion-feed-push-{key}",
                    daemon=True,
                ).start()

    def _push_one(
        self, transport: WorkerTransport, url: str, key: TaskKey, table: str, session: FeedSession
    ) -> None:
        try:
            transport.stream_feed(
                url, key, table, session.read(key.task_index, lambda: self._closed)
            )
        except Exception as exc:  # the task fails, or the query ended, on its own
            log.debug("feed %s to %s on %s ended: %s", table, key, url, exc)

    def serve(self, endpoint, stage: Stage) -> Stage:
        """``stage`` with its feed scans naming ``endpoint`` (tasks pull); sessions registered."""
        if not has_feeds(stage):
            return stage
        scans = []
        for scan in stage.scans:
            if scan.source.is_feed:
                session = self.open(stage, scan)
                endpoint.register(
                    self.query_id, stage.stage_id, scan.source.name, session, self.secret
                )
                options = {
                    **scan.source.options,
                    **endpoint.client_options,  # TLS root and name when it serves TLS
                    "endpoint": endpoint.url,
                    "secret": self.secret,
                }
                scan = dataclasses.replace(
                    scan, source=dataclasses.replace(scan.source, options=options)
                )
            scans.append(scan)
        return dataclasses.replace(stage, scans=tuple(scans))

    def local_chunks(self, stage: Stage) -> Callable[[ScanShare], Iterator[list[WorkUnit]]]:
        """``feed_chunks`` for a stage run here (the head): its sessions read directly."""

        def chunks(share: ScanShare) -> Iterator[list[WorkUnit]]:
            scan = next(s for s in stage.scans if s.source.name == share.source.name)
            session = self.open(stage, scan)
            inbox = FeedInbox(cancelled=lambda: self._closed)

            def pump() -> None:
                try:
                    for raw in session.read(0, lambda: self._closed):
                        if not inbox.put(raw):
                            return
                except Exception as exc:
                    inbox.finish(
                        exc
                        if isinstance(exc, FeedError)
                        else FeedError(
                            share.source.name, scan.source.options["feed_id"], 0, str(exc)
                        )
                    )
                    return
                inbox.finish()

            threading.Thread(target=pump, name="distfusion-feed-head", daemon=True).start()
            try:
                yield from inbox.chunks()
            finally:
                inbox.close()

        return chunks

    def _failed(self, err: FeedError) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = err
        if self._on_error is not None:
            self._on_error(err)

    def close(self) -> None:
        """Stop every provider of the query (generators closed at their next yield). Idempotent."""
        self._closed = True
        close_query_feeds(self.query_id)
