r"""A worker as an Arrow Flight server: ``distfusion worker --port 50051``.

:class:`FlightWorker` forwards the worker protocol (see
:mod:`distfusion.transport.flight`) to a :class:`~distfusion.worker.worker.Worker`,
whose tasks read their inputs from other workers through a
:class:`~distfusion.transport.flight.FlightWorkerTransport`::

              ┌──────────── FlightWorker (gRPC threads) ────────────┐
    set_plan ─┼─> TaskPlan.from_json ──> Worker.set_plan (FIFO pool) │
    DoGet ────┼─> Worker.execute_partition ──> Arrow stream          │
    DoPut ────┼─> Worker.receive_feed: a leaf task's work unit feed  │
    stats of ─┼─> Worker.task_stats ──> rows, bytes per partition   │
    a task    │                                                      │
    metrics ──┼─> Worker.query_metrics ──> JSON, tasks finished here │
    cancel ───┼─> Worker.cancel_query                                │
    stats ────┼─> Worker.stats + plans received + live queries       │
              │  reaper thread: a query nobody asked about for       │
              │  ``query_ttl_s`` seconds is cancelled (coordinator    │
              │  gone)                                               │
              └──────────────────────────────────────────────────────┘

Binds ``127.0.0.1`` unless told otherwise. With a ``token``, a middleware
rejects every call whose ``authorization`` header is not ``Bearer <token>``
before any handler runs (so before any plan is read). A worker reads any file
a task plan names: it refuses to listen on a non-loopback address without a
token unless ``insecure=True`` (then it logs a warning, and its errors carry
no remote traceback: its callers are not authenticated).
With ``tls_cert_chain``/``tls_private_key`` it serves
``grpc+tls://``; a self-signed certificate for tests and one machine::

    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj /CN=localhost \\
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \\
        -keyout worker.key -out worker.crt
    distfusion worker --port 50051 --tls-cert worker.crt --tls-key worker.key
    distfusion query ... --runtime flight --workers-url grpc+tls://127.0.0.1:50051 \\
        --tls-root-certs worker.crt

Started by ``distfusion worker`` or ``python -m distfusion.worker.flight_cli
--port 0`` (:mod:`distfusion.worker.flight_cli`): prints ``distfusion worker
listening on grpc://127.0.0.1:PORT`` once it accepts calls.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from distfusion.errors import QueryCancelledError, TaskError
from distfusion.io import object_store
from distfusion.io.object_store import Stores
from distfusion.io.write import WriteSpec, write_task
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import error_to_dict, task_error
from distfusion.protocol.feed_messages import decode_feed_batches, decode_feed_descriptor
from distfusion.protocol.messages import (
    ACTION_CANCEL_QUERY,
    ACTION_FAILED_TASKS,
    ACTION_KEEPALIVE,
    ACTION_QUERY_METRICS,
    ACTION_SET_OBJECT_STORES,
    ACTION_SET_PLAN,
    ACTION_STATS,
    ACTION_TASK_FAILED,
    ACTION_TASK_STATS,
    ACTION_WORKER_STARTED,
    ACTION_WRITE_PART,
    DEFAULT_QUERY_TTL_S,
    TOKEN_ENV,
    decode_stores,
    decode_task_request,
    decode_ticket,
)
from distfusion.protocol.task_plan import TaskPlan
from distfusion.session import SessionSettings
from distfusion.transport.flight import FlightWorkerTransport, encode_error, import_flight
from distfusion.udfs import Functions
from distfusion.worker.execute_task import without_views
from distfusion.worker.head_parts import HeadPart, run_part
from distfusion.worker.worker import Worker

__all__ = ["FlightWorker", "is_loopback"]

flight = import_flight()
log = logging.getLogger("distfusion.worker")

MAX_CALL_WAIT_S = 5.0
"""Longest one call waits on this worker for a task (its plan to arrive, or the task
to finish), seconds, whatever the ticket or request asks: it then answers "not
yet" (a timed-out error), which distfusion's clients poll again (they ask for
0.5 s at a time, :class:`~distfusion.transport.flight.FlightWorkerTransport`).
A call for a task that never arrives (a client that gave up, another program)
so holds a gRPC thread for seconds, not until the query's time-to-live (issue
25: 64 stray DoGets took a worker from 20 to 88 threads for 120 s)."""


def _bounded(timeout_s: float | None) -> float:
    """``timeout_s`` capped at :data:`MAX_CALL_WAIT_S` (None: no bound asked)."""
    return MAX_CALL_WAIT_S if timeout_s is None else min(timeout_s, MAX_CALL_WAIT_S)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine.

    A name counts when every address it resolves to is a loopback address;
    one that does not resolve does not count.
    """
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


_MiddlewareFactoryBase: Any = flight.ServerMiddlewareFactory  # pyarrow.flight, loaded above
_ServerBase: Any = flight.FlightServerBase


class _TokenMiddlewareFactory(_MiddlewareFactoryBase):
    """Rejects calls without ``authorization: Bearer <token>`` (constant-time compare)."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        values = headers.get("authorization") or []
        for value in values:
            given = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(given, self._expected):
                return None
        raise flight.FlightUnauthenticatedError("missing or wrong distfusion token")


class _Server(_ServerBase):
    def __init__(self, owner: FlightWorker, location: str, **kwargs) -> None:
        self._owner = owner  # set first: calls may arrive as soon as the port is bound
        super().__init__(location, **kwargs)

    def do_action(self, context, action):
        try:
            return self._owner.handle_action(action.type, action.body.to_pybytes())
        except Exception as exc:
            raise encode_error(exc, self._owner.sends_tracebacks) from None

    def list_actions(self, context):
        return [
            (ACTION_SET_PLAN, "queue a task: body is a TaskPlan JSON document"),
            (ACTION_SET_OBJECT_STORES, "register object stores: body is a JSON list of specs"),
            (ACTION_CANCEL_QUERY, "stop every task of a query and free its state"),
            (ACTION_KEEPALIVE, "the coordinator of these query ids (JSON list) is alive"),
            (ACTION_STATS, "live tasks, bytes held, plans received (JSON)"),
            (ACTION_TASK_STATS, "wait for a task; rows and bytes per output partition (JSON)"),
        ]

    def do_put(self, context, descriptor, reader, writer):
        try:
            self._owner.handle_put(descriptor.command, reader)
        except Exception as exc:
            raise encode_error(exc, self._owner.sends_tracebacks) from None

    def do_get(self, context, ticket):
        try:
            return self._owner.handle_get(ticket.ticket)
        except Exception as exc:
            raise encode_error(exc, self._owner.sends_tracebacks) from None


class FlightWorker:
    """A worker serving the distfusion protocol over Arrow Flight.

    Listening starts in the constructor (gRPC serves on its own threads);
    :meth:`serve` only blocks until shutdown. As a context manager it shuts
    down on exit, which makes it handy in tests::

        with FlightWorker(port=0) as w:
            runtime = FlightRuntime([w.url])

    Args:
        host: interface to bind; ``127.0.0.1`` unless told otherwise.
        port: TCP port; 0 picks a free one (read :attr:`port` / :attr:`url`).
        token: shared secret every call must carry; default the
            ``DISTFUSION_TOKEN`` environment variable; None or ``""`` accepts all.
            Also sent when this worker reads inputs from other workers.
        insecure: allow a non-loopback ``host`` without a token (callers are
            then not authenticated: errors go without remote tracebacks).
        tls_cert_chain: PEM certificate chain; with ``tls_private_key``, serve TLS.
        tls_private_key: PEM private key of ``tls_cert_chain``.
        tls_root_certs: PEM roots to verify other TLS workers this worker reads
            from (default ``tls_cert_chain``, right for one self-signed cert).
        tls_override_hostname: the name other workers' certificates are
            verified against instead of their URL's host (a certificate that
            names no address: :mod:`distfusion.transport.tls`).
        slots: tasks run at the same time.
        query_ttl_s: seconds without any call about a query (plan, read,
            keepalive) after which its state is dropped.
        input_timeout_s: longest a task waits for a producer task's plan, seconds;
            None waits as long as the producer runs.
        advertise_url: the URL this worker reports in errors (default the bound
            ``grpc://host:port``).
        advertise_host: the host of the URL this worker reports, with the port
            bound (for ``host="0.0.0.0"`` and ``port=0``); ignored with ``advertise_url``.
        memory_per_task_bytes: DataFusion memory pool of a task whose plan
            sets none, bytes (see :class:`~distfusion.worker.worker.Worker`).
        spill_dir: where this worker makes its spill directory; None: the
            system's temp directory.
        functions: the Python UDFs every task session here gets (``--udf``:
            task plans carry no code); None: none. A plan given in process
            (:meth:`run_task`) with its own ``session`` keeps it.

    Raises:
        ImportError: pyarrow has no Flight support.
        OSError / pyarrow.ArrowException: the port cannot be bound.
        ValueError: only one of ``tls_cert_chain`` and ``tls_private_key`` given,
            or a non-loopback ``host`` without a token and without ``insecure``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        tls_cert_chain: bytes | None = None,
        tls_private_key: bytes | None = None,
        tls_root_certs: bytes | None = None,
        slots: int = 1,
        query_ttl_s: float = DEFAULT_QUERY_TTL_S,
        input_timeout_s: float | None = None,
        advertise_url: str | None = None,
        advertise_host: str | None = None,
        memory_per_task_bytes: int | None = None,
        spill_dir: str | None = None,
        insecure: bool = False,
        tls_override_hostname: str | None = None,
        functions: Functions | None = None,
    ) -> None:
        if (tls_cert_chain is None) != (tls_private_key is None):
            msg = "TLS needs both tls_cert_chain and tls_private_key"
            raise ValueError(msg)
        token = os.environ.get(TOKEN_ENV) if token is None else token
        loopback = is_loopback(host)
        if not token and not loopback:
            if not insecure:
                msg = (
                    f"refusing to listen on {host} without a token: any machine that can "
                    "reach it could run task plans, which read any file the worker can. "
                    "Give a token (--token-file, $DISTFUSION_WORKER_TOKEN), bind 127.0.0.1, "
                    "or pass --insecure (insecure=True) on a trusted network"
                )
                raise ValueError(msg)
            log.warning(
                "worker on %s accepts calls from anyone who can reach it (insecure: no "
                "token); task plans can read any file this process can",
                host,
            )
        self.sends_tracebacks = bool(token) or loopback
        """Errors carry remote tracebacks: callers are authenticated, or local."""
        tls = tls_cert_chain is not None
        scheme = "grpc+tls" if tls else "grpc"
        kwargs: dict = {}
        if token:
            kwargs["middleware"] = {"auth": _TokenMiddlewareFactory(token)}
        if tls:
            kwargs["tls_certificates"] = [flight.CertKeyPair(tls_cert_chain, tls_private_key)]
        self.host = host
        self.query_ttl_s = query_ttl_s
        self.transport = FlightWorkerTransport(
            token=token or "",
            tls_root_certs=tls_root_certs or tls_cert_chain,
            tls_override_hostname=tls_override_hostname,
        )
        self.worker = Worker(
            advertise_url or f"{scheme}://{host}:{port}",
            self.transport,
            slots=slots,
            input_timeout_s=input_timeout_s,
            memory_per_task_bytes=memory_per_task_bytes,
            spill_dir=spill_dir,
        )
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}  # query id -> monotonic time of the last call about it
        self.functions = functions or Functions()
        self._stores: dict[str, Stores] = {}  # query id -> its object stores (set_object_stores)
        self._plans_received = 0
        self.on_worker_started: Callable[[str, str], bool] | None = None
        """``(url, query_id) -> cancelled``: called for ``worker_started`` (a Spark
        driver's worker: see :data:`~distfusion.protocol.messages.ACTION_WORKER_STARTED`)."""
        self.on_task_failed: Callable[[str, dict], None] | None = None
        """``(query_id, error dict)``: called for ``task_failed`` (a Spark driver's
        worker: see :data:`~distfusion.protocol.messages.ACTION_TASK_FAILED`)."""
        self._stop = threading.Event()
        self._closed = False
        # Everything the handlers use exists before the port is bound.
        self._server = _Server(self, f"{scheme}://{host}:{port}", **kwargs)
        self.port: int = self._server.port
        self.url = advertise_url or f"{scheme}://{advertise_host or host}:{self.port}"
        self.worker.url = self.url
        self._reaper = threading.Thread(
            target=self._reap, name=f"distfusion-reaper-{self.port}", daemon=True
        )
        self._reaper.start()

    # ------------------------------------------------------------- lifecycle
    def serve(self) -> None:
        """Block until :meth:`close` is called or the process gets SIGINT/SIGTERM."""
        self._server.serve()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop serving, cancel every task, stop the threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._server.shutdown()
        self.worker.close()
        self.transport.close()
        self._reaper.join(timeout=5)

    def __enter__(self) -> FlightWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FlightWorker({self.url})"

    def run_task(self, plan: TaskPlan) -> TaskMetrics:
        """Run ``plan`` here, as a ``set_plan`` call would, and wait for it to finish.

        For a worker hosted in the process that was given the task (the Spark
        runtime's executors): the output is then served like any other.

        Returns:
            The task's metrics (``partition_rows``, ``partition_bytes`` of its
            output among them).

        Raises:
            TaskError: the task failed (names the stage, the task and this worker).
            QueryCancelledError: the query was cancelled here meanwhile.
        """
        self._set_plan(plan)  # in process: the plan object itself, not its JSON again
        metrics = self.worker.task_metrics(plan.key)
        self._touch(plan.key.query_id)
        return metrics

    # ------------------------------------------------------------- handlers
    def _touch(self, query_id: str) -> None:
        # A late call about a cancelled query (a consumer task's last poll)
        # must not bring its state back until the time-to-live.
        with self._lock:
            if not self.worker.is_cancelled(query_id):
                self._seen[query_id] = time.monotonic()

    def _with_session(self, plan: TaskPlan) -> TaskPlan:
        """``plan`` with this worker's UDFs and its query's stores, unless it has a session."""
        if plan.session is not None:
            return plan
        with self._lock:
            stores = self._stores.get(plan.key.query_id) or Stores()
        return dataclasses.replace(plan, session=SessionSettings(self.functions, stores))

    def _set_plan(self, plan: TaskPlan) -> None:
        plan = self._with_session(plan)
        self._touch(plan.key.query_id)
        with self._lock:
            self._plans_received += 1
        self.worker.set_plan(plan)

    def handle_action(self, name: str, body: bytes) -> list[bytes]:
        """Action ``name`` with ``body`` (the server's ``do_action``): its answers."""
        if name == ACTION_SET_PLAN:
            self._set_plan(TaskPlan.from_json(body))
            return []
        if name == ACTION_TASK_STATS:
            key, timeout_s = decode_task_request(body)
            self._touch(key.query_id)
            rows, nbytes = self.worker.task_stats(key, _bounded(timeout_s))
            self._touch(key.query_id)
            answer = {"partition_rows": list(rows), "partition_bytes": list(nbytes)}
            return [json.dumps(answer).encode()]
        if name == ACTION_QUERY_METRICS:
            tasks = self.worker.query_metrics(body.decode())
            return [json.dumps([m.to_dict() for m in tasks]).encode()]
        if name == ACTION_FAILED_TASKS:
            errors = self.worker.failed_tasks(body.decode())
            return [json.dumps([error_to_dict(e) for e in errors]).encode()]
        if name == ACTION_CANCEL_QUERY:
            query_id = body.decode()
            self._cancel(query_id)
            with self._lock:
                self._seen.pop(query_id, None)
            return []
        if name == ACTION_KEEPALIVE:
            now = time.monotonic()
            with self._lock:
                for query_id in json.loads(body):
                    if query_id in self._seen:
                        self._seen[query_id] = now
            return []
        if name == ACTION_STATS:
            stats = dict(self.worker.stats())
            with self._lock:
                stats["plans_received"] = self._plans_received
                stats["live_queries"] = len(self._seen)
            stats["pid"] = os.getpid()
            return [json.dumps(stats).encode()]
        if name == ACTION_SET_OBJECT_STORES:
            query_id, shipped = decode_stores(body)
            stores = Stores.from_specs(shipped)
            object_store.install(shipped)  # this process's own reads: a write's files
            self._touch(query_id)
            with self._lock:
                self._stores[query_id] = stores
            return []
        if name == ACTION_WRITE_PART:
            return [self._write_part(body)]
        if name == ACTION_WORKER_STARTED and self.on_worker_started is not None:
            d = json.loads(body)
            cancelled = self.on_worker_started(d["url"], d["query_id"])
            return [json.dumps({"cancelled": bool(cancelled)}).encode()]
        if name == ACTION_TASK_FAILED and self.on_task_failed is not None:
            d = json.loads(body)
            self.on_task_failed(d["query_id"], d["error"])
            return []
        msg = f"unknown action {name!r}"
        raise KeyError(msg)

    def _write_part(self, body: bytes) -> bytes:
        """Run a head part here and write its rows as one task of a write job.

        The part reads its inputs from the workers holding them (this one
        first, for a part of a row-wise head: it is sent where its producer
        ran); the files go to the job's temporary directory and are
        committed as the task (:func:`distfusion.io.write.write_task`).

        Raises:
            ValueError: ``body`` is not a part and a write spec.
            TaskError: the part failed (names the head stage, the part and this worker).
        """
        d = json.loads(body)
        part = HeadPart.from_json(d["part"])
        part = dataclasses.replace(part, plan=self._with_session(part.plan))
        spec = WriteSpec.from_json(d["spec"])
        self._touch(part.plan.key.query_id)
        memory = self.worker.task_memory(part.plan)
        try:
            files = write_task(spec, part.index, run_part(part, self.transport, memory))
        except TaskError:
            raise
        except Exception as exc:
            key = part.plan.key
            raise task_error(key.stage_id, key.task_index, self.url, exc) from exc
        finally:
            self._touch(part.plan.key.query_id)
        return json.dumps([f.to_json() for f in files]).encode()

    def handle_get(self, ticket: bytes):
        """A partition as a stream: each batch sent as the task produces it.

        Waits for the task's plan (at most the ticket's ``timeout_s``, and at
        most :data:`MAX_CALL_WAIT_S`: the client polls again), then for the
        first batch; the stream then follows the task (streamed exchange) and
        ends with its error, if any.
        """
        key, partition, timeout_s = decode_ticket(ticket)
        self._touch(key.query_id)
        batches = iter(self.worker.execute_partition(key, partition, _bounded(timeout_s)))
        self._touch(key.query_id)
        first = next(batches, None)
        if first is None:
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(pa.schema([]), []))
        first = without_views(first)
        schema = first.schema

        def rest():
            yield first
            try:
                for b in batches:
                    b = without_views(b)
                    yield b if b.schema.equals(schema) else _conform(b, schema)
            except Exception as exc:  # the task failed or was cancelled while streaming
                raise encode_error(exc, self.sends_tracebacks) from None

        return flight.GeneratorStream(schema, rest())

    def handle_put(self, command: bytes, reader) -> None:
        """A work unit feed pushed by the coordinator: into the task's inbox."""
        key, table = decode_feed_descriptor(command)
        self._touch(key.query_id)
        self.worker.receive_feed(key, table, decode_feed_batches(c.data for c in reader))
        self._touch(key.query_id)

    def _reap(self) -> None:
        interval = max(0.05, min(1.0, self.query_ttl_s / 4))
        while not self._stop.wait(interval):
            now = time.monotonic()
            with self._lock:
                expired = [q for q, t in self._seen.items() if now - t > self.query_ttl_s]
                for q in expired:
                    del self._seen[q]
            for q in expired:
                log.warning("query %s: no call for %.1f s, dropping its state", q, self.query_ttl_s)
                self._cancel(q)

    def _cancel(self, query_id: str) -> None:
        # Tasks of the query blocked reading inputs from other workers stop at
        # their next poll round, so they stop asking the producers too.
        self.transport.abort_query(query_id, QueryCancelledError(f"query {query_id} was cancelled"))
        self.worker.cancel_query(query_id)
        with self._lock:
            self._stores.pop(query_id, None)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if [f.type for f in batch.schema] == [f.type for f in schema]:
        return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    return pa.Table.from_batches([batch]).cast(schema).to_batches()[0]
