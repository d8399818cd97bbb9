"""The coordinator's feed endpoint: where tasks that cannot be pushed to pull their feeds.

Spark executors accept no connection from the driver (Spark places the tasks;
the driver only learns where a task ran when it ends), so on Spark the driver
serves every feed of a query on an Arrow Flight endpoint and each leaf task
pulls its partition::

    driver (coordinator)                           Spark task (executor)
      FeedEndpoint on spark.driver.host:PORT  <──  DoGet ticket {query id, stage,
        checks the query's secret                       table, partition, secret}
        session.read(partition) ─────────────────>  units as FEED_SCHEMA batches
                                                     ─> the task's FeedInbox

Each query registers its sessions with a fresh secret (``secrets.token_hex``);
a ticket with another secret, or for a query that ended, is refused. With
``tls`` (a Spark runtime asked to encrypt) the endpoint serves
``grpc+tls://`` with the runtime's certificate, which the tasks verify
(:mod:`distfusion.transport.tls`). A
replayable session restarts a retried attempt at the first unit. The stream
ends with an error row when the provider failed, so the task raises the same
FeedError. pyarrow.flight is loaded only when an endpoint starts or a task
pulls.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any

from distfusion.errors import DistfusionError, FeedError, QueryCancelledError
from distfusion.protocol.feed_messages import (
    FEED_SCHEMA,
    decode_feed_batches,
    decode_feed_ticket,
    encode_feed_ticket,
    error_batch,
    unit_batch,
)
from distfusion.protocol.task_plan import TaskKey
from distfusion.transport.flight import import_flight
from distfusion.transport.tls import TlsMaterial

__all__ = ["FeedEndpoint", "pull_feed"]


class FeedEndpoint:
    """An Arrow Flight server on the coordinator serving feed sessions to pulling tasks.

    Args:
        host: interface to bind (``127.0.0.1`` for local Spark; the driver's
            host, or ``0.0.0.0``, on a cluster).
        advertise_host: the host tasks connect to (default ``host``).
        tls: serve ``grpc+tls://`` with this certificate; tasks verify it
            (:attr:`client_options` go into their scans' options).

    Raises:
        ImportError: pyarrow has no Flight support.
        OSError / pyarrow.ArrowException: no port can be bound.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
        tls: TlsMaterial | None = None,
    ) -> None:
        flight = import_flight()
        owner = self

        server_base: Any = flight.FlightServerBase

        class _Server(server_base):
            def do_get(self, context, ticket):
                return owner._get(ticket.ticket)

        self._lock = threading.Lock()
        # (query id, stage id, table) -> (session, secret)
        self._sessions: dict[tuple[str, int, str], tuple[object, str]] = {}
        scheme, kwargs = "grpc", {}
        self.client_options: dict[str, str] = {}
        """Scan options a pulling task needs besides the URL: the TLS root and name."""
        if tls is not None:
            scheme = "grpc+tls"
            kwargs["tls_certificates"] = [flight.CertKeyPair(tls.cert_pem, tls.key_pem)]
            self.client_options = {
                "endpoint_tls_root": tls.cert_pem.decode(),
                "endpoint_tls_name": tls.hostname,
            }
        self._server = _Server(f"{scheme}://{host}:0", **kwargs)
        self.url = f"{scheme}://{advertise_host or host}:{self._server.port}"

    def register(self, query_id: str, stage_id: int, table: str, session, secret: str) -> None:
        """Serve ``session`` (a FeedSession) to tasks presenting ``secret``."""
        with self._lock:
            self._sessions[(query_id, stage_id, table)] = (session, secret)

    def forget(self, query_id: str) -> None:
        """Stop serving every session of ``query_id``."""
        with self._lock:
            for k in [k for k in self._sessions if k[0] == query_id]:
                del self._sessions[k]

    def _get(self, raw: bytes):
        flight = import_flight()
        try:
            key, table, secret = decode_feed_ticket(raw)
        except ValueError as exc:
            raise flight.FlightServerError(str(exc)) from None
        with self._lock:
            found = self._sessions.get((key.query_id, key.stage_id, table))
        if found is None or not hmac.compare_digest(found[1].encode(), secret.encode()):
            msg = f"no feed {table!r} of stage {key.stage_id} for this query and secret"
            raise flight.FlightUnauthorizedError(msg)
        session = found[0]

        def batches():
            try:
                for raw_unit in session.read(key.task_index):
                    yield unit_batch(raw_unit)
            except (FeedError, QueryCancelledError) as exc:
                yield error_batch(exc)

        return flight.GeneratorStream(FEED_SCHEMA, batches())

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()

    def __repr__(self) -> str:
        return f"FeedEndpoint({self.url})"


def pull_feed(
    endpoint: str,
    secret: str,
    key: TaskKey,
    table: str,
    feed,
    tls_root: str | None = None,
    tls_name: str | None = None,
) -> None:
    """Pull partition ``key.task_index`` of ``table``'s feed into ``feed.inbox`` (a task's thread).

    Ends the inbox when the stream ends; with a FeedError naming the feed and
    the partition when the endpoint cannot be reached or refuses the secret,
    or with the provider's error.

    Args:
        endpoint: the coordinator's feed endpoint URL.
        secret: the query's feed secret.
        key: the task (its index is the partition).
        table: the table the feed backs.
        feed: the task's :class:`~distfusion.worker.feed_inbox.RemoteWorkUnitFeed`.
        tls_root: for a ``grpc+tls://`` endpoint, the PEM certificate to trust
            (:attr:`FeedEndpoint.client_options`).
        tls_name: the name to verify it against instead of the URL's host.
    """
    inbox = feed.inbox
    try:
        flight = import_flight()
        client = flight.FlightClient(
            endpoint,
            tls_root_certs=tls_root.encode() if tls_root else None,
            override_hostname=tls_name,
        )
    except Exception as exc:
        inbox.finish(feed.unreachable(endpoint, f"{type(exc).__name__}: {exc}"))
        return
    try:
        ticket = flight.Ticket(encode_feed_ticket(key, table, secret))
        reader = client.do_get(ticket)
        for raw in decode_feed_batches(chunk.data for chunk in reader):
            if not inbox.put(raw):
                return
        inbox.finish()
    except DistfusionError as exc:
        inbox.finish(exc)
    except Exception as exc:  # unreachable, refused, cut
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        inbox.finish(feed.unreachable(endpoint, first))
    finally:
        client.close()
