"""WorkerTransport over Arrow Flight: workers are gRPC servers, reached by URL.

The worker protocol on the wire (messages in :mod:`distfusion.protocol`,
served by :class:`~distfusion.worker.flight_server.FlightWorker`)::

    coordinator / consumer task                 worker (Flight server)
      DoAction "set_plan"   body: TaskPlan JSON ──> queue the task
      DoGet ticket {query_id, stage_id,        ──> wait for the task, stream
             task_index, partition, timeout_s}      the partition as Arrow IPC
      DoAction "task_stats" body {query_id,    ──> wait for the task, answer
             stage_id, task_index, timeout_s}      {"partition_rows": [..],
                                                    "partition_bytes": [..]}
      DoPut descriptor {feed, query_id,         ──> a leaf task's work unit feed:
             stage_id, task_index}                  units into its bounded inbox
             batches of FEED_SCHEMA                 (back-pressure: gRPC flow control)
      DoAction "query_metrics" body: query id  ──> [TaskMetrics.to_dict(), ...]
                                                    of the tasks finished there
      DoAction "failed_tasks" body: query id   ──> [error dicts] of its failed tasks
      DoAction "cancel_query" body: query id   ──> stop tasks, free state
      DoAction "keepalive" body: [query ids]   ──> the coordinator is alive
      DoAction "stats"                         ──> {"live_tasks", "bytes_held", ...}
      DoAction "worker_started" {url,          ──> (a Spark driver's worker) the
             query_id}                              executor worker is known; answer
                                                    {"cancelled": the query was closed}
      DoAction "task_failed" {query_id,        ──> (a Spark driver's worker) a task
             error}                                 panicked: fail the query now

The task plan is plain JSON (the Substrait fragment base64-encoded inside,
see :meth:`~distfusion.protocol.task_plan.TaskPlan.to_json`): nothing that
crosses the network is pickled.

Errors keep their kind and fields across the wire: a worker encodes the error
it raises with the protocol's error codec (:mod:`distfusion.protocol.errors`)
as JSON in the Flight error's ``extra_info`` (:func:`encode_error`), the
transport rebuilds the same distfusion error (:func:`decode_error`), e.g. a
:class:`~distfusion.errors.TaskError` with its stage, task, worker, cause and
remote traceback. A worker that cannot be reached gives a
:class:`~distfusion.errors.WorkerUnavailableError` naming its URL.

Security: when a shared secret ``token`` is set, every call carries the header
``authorization: Bearer <token>`` and workers started with the same token
reject calls without it (:class:`~distfusion.errors.AuthenticationError`).
TLS: use ``grpc+tls://host:port`` URLs and pass the PEM of the certificate (or
of its CA) as ``tls_root_certs`` (and ``tls_override_hostname`` when the
certificate names no address of the workers: a Spark runtime's own
certificate, :mod:`distfusion.transport.tls`).

``pyarrow.flight`` is imported lazily, when a transport or a worker server is
created.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from distfusion.errors import (
    AuthenticationError,
    FeedError,
    PlanningError,
    QueryCancelledError,
    TaskError,
    TransportError,
    WorkerUnavailableError,
)
from distfusion.io.object_store import StoreSpec
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import KIND, error_from_dict, error_to_dict
from distfusion.protocol.feed_messages import (
    FEED_SCHEMA,
    encode_feed_descriptor,
    error_batch,
    unit_batch,
)
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
    TOKEN_ENV,
    encode_stores,
    encode_task_request,
    encode_ticket,
)
from distfusion.protocol.task_plan import TaskKey, TaskPlan, task_name

__all__ = [
    "FlightWorkerTransport",
    "decode_error",
    "encode_error",
    "import_flight",
]

_ABORTED_KEPT = 4096
_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")


def import_flight() -> Any:
    """``pyarrow.flight``, imported on first use.

    Raises:
        ImportError: pyarrow was built without Flight; says what to install.
    """
    try:
        import pyarrow.flight as flight  # optional: pyarrow builds without Flight exist
    except ImportError as exc:  # pragma: no cover - depends on the pyarrow build
        msg = (
            "the Flight runtime needs pyarrow with Arrow Flight support: "
            "pip install 'pyarrow>=26' (the PyPI wheels include pyarrow.flight)"
        )
        raise ImportError(msg) from exc
    return flight


# ---------------------------------------------------------------------- errors
def encode_error(exc: BaseException, with_traceback: bool = True):
    """``exc`` as a ``pyarrow.flight`` error a server handler raises.

    The error travels as the dict of :func:`distfusion.protocol.errors.error_to_dict`,
    JSON in the Flight error's ``extra_info``; :func:`decode_error` rebuilds
    it on the client.

    Args:
        exc: the error a worker request raised.
        with_traceback: send the remote traceback; False (a worker whose
            callers are not authenticated) sends ``remote_traceback`` empty.

    Returns:
        A ``pyarrow.flight.FlightError`` subclass instance: cancelled for
        :class:`QueryCancelledError`, timed out for ``TimeoutError``, server error
        otherwise.
    """
    flight = import_flight()
    if isinstance(exc, QueryCancelledError):
        cls = flight.FlightCancelledError
    elif isinstance(exc, TimeoutError):
        cls = flight.FlightTimedOutError
    else:
        cls = flight.FlightServerError
    info = error_to_dict(exc)
    if not with_traceback and "remote_traceback" in info:
        info["remote_traceback"] = ""
    return cls(str(exc), extra_info=json.dumps(info).encode())


def decode_error(url: str, what: str, exc: Exception) -> Exception:
    """The distfusion error for ``exc``, a Flight error from the worker at ``url``.

    Args:
        url: the worker's URL.
        what: what the call was doing, for the message (``"reading stage 1 task 0
            partition 2"``).
        exc: the error the Flight client raised.

    Returns:
        The error :func:`encode_error` encoded (same kind and fields; a worker
        that could not reach another one is named as the worker of this call),
        else :class:`WorkerUnavailableError` when the worker cannot be
        reached, :class:`AuthenticationError` when it rejected the token,
        ``TimeoutError`` on a deadline, :class:`TransportError` for anything else.
    """
    flight = import_flight()
    info = _error_info(exc)
    if info is not None:
        kind = info[KIND]
        message = info.get("message", "")
        if kind == "TimeoutError":
            return _PollExpired(f"worker {url}, {what}: {message}")
        if kind == "WorkerUnavailableError":
            return WorkerUnavailableError(url, f"{what}: {message}")
        decoded = error_from_dict(info)
        if decoded is not None:
            return decoded
        return TransportError(f"worker {url} failed {what}: {kind}: {message}")
    if isinstance(exc, flight.FlightUnavailableError):
        return WorkerUnavailableError(url, f"{what}: {_first_line(exc)}")
    if isinstance(exc, flight.FlightUnauthenticatedError | flight.FlightUnauthorizedError):
        return AuthenticationError(url, f"{what}: missing or wrong token ({_first_line(exc)})")
    if isinstance(exc, flight.FlightTimedOutError):
        return WorkerUnavailableError(url, f"{what}: no answer before the deadline")
    return TransportError(f"worker {url} failed {what}: {type(exc).__name__}: {exc}")


class _PollExpired(TimeoutError):
    """A worker's wait for a task ended before the task did (one long-poll round)."""


def _error_info(exc: Exception) -> dict | None:
    raw = getattr(exc, "extra_info", None)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return info if isinstance(info, dict) and KIND in info else None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# ---------------------------------------------------------------------- transport
class FlightWorkerTransport:
    """Reaches Flight workers (``grpc://host:port`` or ``grpc+tls://host:port``).

    Implements :class:`~distfusion.transport.base.WorkerTransport`. One Flight
    client per URL is created on first use and reused (clients are thread-safe).
    Coordinators use it to deliver plans and read the head stage's inputs;
    workers use it to read their inputs from producer workers.

    Args:
        token: shared secret sent as ``authorization: Bearer <token>``; default
            the ``DISTFUSION_TOKEN`` environment variable; None or ``""`` sends none.
        tls_root_certs: PEM bytes of the certificate (or CA) ``grpc+tls://``
            workers present; None uses the system's roots.
        tls_override_hostname: the name to verify the workers' certificates
            against instead of the host of their URL (gRPC's
            ``ssl_target_name_override``); None checks the URL's host.
        action_timeout_s: deadline of ``set_plan``, ``stats`` and ``keepalive``
            calls, seconds.
        cancel_timeout_s: deadline of a ``cancel_query`` call, seconds.
        poll_s: longest one DoGet waits on the worker for a task to finish,
            seconds; :meth:`execute_partition` repeats it until the task is done.

    Raises:
        ImportError: pyarrow has no Flight support.
    """

    def __init__(
        self,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        action_timeout_s: float = 10.0,
        cancel_timeout_s: float = 2.0,
        poll_s: float = 0.5,
        tls_override_hostname: str | None = None,
    ) -> None:
        self._flight = import_flight()
        token = os.environ.get(TOKEN_ENV) if token is None else token
        self._headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.tls_root_certs = tls_root_certs
        self.tls_override_hostname = tls_override_hostname
        self.action_timeout_s = action_timeout_s
        self.cancel_timeout_s = cancel_timeout_s
        self.poll_s = poll_s
        self._clients: dict[str, Any] = {}  # pyarrow.flight.FlightClient by URL
        # (URL, query id) -> the store specs that worker has for that query
        self._stores_sent: dict[tuple[str, str], tuple] = {}
        self._aborted: dict[str, Exception] = {}  # query id -> error to raise in its reads
        self._readers: dict[str, set] = {}  # query id -> its open DoGet streams
        self._lock = threading.Lock()

    # ------------------------------------------------------------- plumbing
    def _client(self, url: str):
        with self._lock:
            client = self._clients.get(url)
            if client is not None:
                return client
            if not url.startswith(_SCHEMES):
                msg = f"not an Arrow Flight URL (expected one of {', '.join(_SCHEMES)}host:port)"
                raise WorkerUnavailableError(url, msg)
            try:
                client = self._flight.FlightClient(
                    url,
                    tls_root_certs=self.tls_root_certs,
                    override_hostname=self.tls_override_hostname,
                )
            except Exception as exc:  # malformed location, unreadable certificate
                raise WorkerUnavailableError(url, f"cannot open a Flight client: {exc}") from exc
            self._clients[url] = client
            return client

    def _options(self, timeout_s: float | None):
        return self._flight.FlightCallOptions(timeout=timeout_s, headers=self._headers)

    def _action(
        self, url: str, name: str, body: bytes, timeout_s: float | None, what: str | None = None
    ) -> list[bytes]:
        what = what or name
        client = self._client(url)
        try:
            results = client.do_action(self._flight.Action(name, body), self._options(timeout_s))
            return [r.body.to_pybytes() for r in results]
        except self._flight.FlightError as exc:
            raise decode_error(url, what, exc) from None
        except OSError as exc:  # pyarrow maps some gRPC failures to IOError
            raise WorkerUnavailableError(url, f"{what}: {exc}") from None

    # ------------------------------------------------------------- protocol
    def set_plan(self, url: str, plan: TaskPlan) -> None:
        """See :meth:`WorkerTransport.set_plan`.

        Before a worker's first plan of a query, the query's object stores
        (``plan.session``) are sent to it (:meth:`send_object_stores`).

        Raises:
            WorkerUnavailableError: the worker cannot be reached (names it and the task).
            AuthenticationError: the worker rejected the token.
            PlanningError: a store has explicit credentials and this transport
                has no token (see :meth:`send_object_stores`).
        """
        try:
            if plan.session is not None:
                self.send_object_stores(url, plan.key.query_id, plan.session.store_specs())
            self._action(url, ACTION_SET_PLAN, plan.to_json().encode(), self.action_timeout_s)
        except WorkerUnavailableError as exc:
            raise WorkerUnavailableError(
                url, f"delivering {task_name(plan.key)}: {exc.detail}"
            ) from None

    def send_object_stores(
        self, url: str, query_id: str, stores: tuple[tuple[str, StoreSpec], ...]
    ) -> None:
        """Give worker ``url`` query ``query_id``'s object stores, unless it has them already.

        ``stores``: ``(scheme://host, spec)`` pairs of the query's context
        (:class:`~distfusion.session.SessionSettings`). One ``set_object_stores``
        call per worker and query; none when the query has no store. The worker
        registers them in that query's task sessions only. Credentials given
        explicitly to a store travel only to workers this transport
        authenticates to.

        Raises:
            PlanningError: a store has explicit credentials and this transport
                sends no token: the workers would take them from anyone.
            WorkerUnavailableError: the worker cannot be reached.
            AuthenticationError: the worker rejected the token.
        """
        with self._lock:
            if not stores or self._stores_sent.get((url, query_id)) == stores:
                return
        keyed = [key for key, spec in stores if spec.has_secrets]
        if keyed and not self._headers:
            msg = (
                f"object store {keyed[0]} was registered with explicit credentials, and the "
                "Flight workers take calls without a token: credentials go only to "
                "authenticated workers. Start the workers with a token (--token-file, "
                f"${TOKEN_ENV}) and give it to the runtime, or give the workers "
                "credentials in their environment and register the store without keys"
            )
            raise PlanningError(msg)
        self._action(
            url,
            ACTION_SET_OBJECT_STORES,
            encode_stores(query_id, stores),
            self.action_timeout_s,
            "sending object stores",
        )
        with self._lock:
            self._stores_sent[(url, query_id)] = stores

    def execute_partition(
        self, url: str, key: TaskKey, partition: int, timeout_s: float | None = None
    ) -> Iterator[pa.RecordBatch]:
        """See :meth:`WorkerTransport.execute_partition`: one ``DoGet`` stream, read as it comes.

        The worker answers once the task's plan is there (long-polled like
        :meth:`task_stats`), then sends each batch as the task produces it;
        this returns after its first batch (or the end) and yields the rest
        as they arrive, one batch in memory at a time. The stream has no
        deadline (it lasts as long as the producer runs); :meth:`abort_query`
        cancels it at once.

        Raises:
            TaskError: the task failed on its worker (its fields as the worker
                set them), here or while iterating.
            QueryCancelledError: the query was cancelled on the worker or aborted here.
            TimeoutError: the task's plan did not arrive within ``timeout_s`` seconds.
            WorkerUnavailableError: the worker cannot be reached or died while
                streaming; names the URL, the stage and the task.
            AuthenticationError: the worker rejected the token.
        """
        what = f"reading partition {partition} of {task_name(key)}"
        client = self._client(url)
        qid = key.query_id

        def failure(exc: Exception) -> Exception:
            aborted = self._aborted.get(qid)
            if aborted is not None:
                return aborted
            if isinstance(exc, self._flight.FlightError):
                return decode_error(url, what, exc)
            return WorkerUnavailableError(url, f"{what}: {exc}")

        def open_stream(wait_s: float):
            ticket = self._flight.Ticket(encode_ticket(key, partition, wait_s))
            try:
                reader = client.do_get(ticket, self._options(None))
            except (self._flight.FlightError, OSError) as exc:
                raise failure(exc) from None
            with self._lock:
                self._readers.setdefault(qid, set()).add(reader)
            try:
                return reader, reader.read_chunk().data
            except StopIteration:
                return reader, None
            except (self._flight.FlightError, OSError) as exc:
                self._drop_reader(qid, reader)
                raise failure(exc) from None

        reader, first = self._long_poll(url, key, timeout_s, open_stream)
        return self._rest(qid, reader, first, failure)

    def _rest(self, qid: str, reader, first, failure) -> Iterator[pa.RecordBatch]:
        """The batches of an open ``DoGet`` stream after its ``first``; the reader dropped after."""
        try:
            if first is None:
                return
            yield first
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                except (self._flight.FlightError, OSError) as exc:
                    raise failure(exc) from None
                yield chunk.data
        finally:
            self._drop_reader(qid, reader)

    def _drop_reader(self, qid: str, reader) -> None:
        with self._lock:
            readers = self._readers.get(qid)
            if readers is not None:
                readers.discard(reader)
                if not readers:
                    del self._readers[qid]
        try:
            reader.cancel()  # a stream left before its end: the worker stops sending
        except Exception:  # already finished or broken: nothing to stop
            pass

    def task_stats(
        self, url: str, key: TaskKey, timeout_s: float | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """See :meth:`WorkerTransport.task_stats` (the ``task_stats`` action, JSON).

        Raises:
            TaskError: the task failed on its worker (its fields as the worker set them).
            QueryCancelledError: the query was cancelled on the worker.
            TimeoutError: the task did not finish within ``timeout_s`` seconds.
            WorkerUnavailableError: the worker cannot be reached.
            AuthenticationError: the worker rejected the token.
            TransportError: the worker's answer is not a task's stats.
        """

        def ask(wait_s: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
            body = encode_task_request(key, wait_s)
            what = f"waiting for {task_name(key)}"
            (answer,) = self._action(
                url, ACTION_TASK_STATS, body, wait_s + self.action_timeout_s, what
            )
            try:
                d = json.loads(answer)
                return tuple(map(int, d["partition_rows"])), tuple(map(int, d["partition_bytes"]))
            except (KeyError, TypeError, ValueError) as exc:
                msg = f"worker {url} answered task_stats of {task_name(key)} badly: {exc}"
                raise TransportError(msg) from None

        return self._long_poll(url, key, timeout_s, ask)

    def _long_poll(self, url: str, key: TaskKey, timeout_s: float | None, call: Callable):
        """``call(wait_s)`` until task ``key`` is done, ``timeout_s`` passed or the query aborted.

        Each call waits at most ``poll_s`` on the worker, so this thread runs
        Python between calls (Ctrl-C is seen, a dead worker is noticed by the
        next call, :meth:`abort_query` takes effect) however long the task runs.
        ``call`` raises :class:`_PollExpired` when the worker's wait ended first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            aborted = self._aborted.get(key.query_id)
            if aborted is not None:
                raise aborted
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = self.poll_s if left is None else min(self.poll_s, left)
            try:
                return call(wait_s)
            except _PollExpired:
                if left is None or left > wait_s:
                    continue
                msg = f"worker {url}: {task_name(key)} did not finish within {timeout_s} s"
                raise TimeoutError(msg) from None

    def stream_feed(self, url: str, key: TaskKey, table: str, units: Iterator[bytes]) -> None:
        """See :meth:`WorkerTransport.stream_feed`: one Flight ``DoPut`` per task and feed.

        The descriptor names the task and the table
        (:func:`~distfusion.protocol.feed_messages.encode_feed_descriptor`);
        each unit is a one-row batch of ``FEED_SCHEMA``, written as it comes,
        so gRPC flow control carries the worker inbox's back-pressure to the
        coordinator's feed session. A failed feed ends with an error row.

        Raises:
            WorkerUnavailableError: the worker cannot be reached, or died while streaming.
            AuthenticationError: the worker rejected the token.
            TransportError: the worker refused the stream.
        """
        what = f"streaming feed {table!r} to {task_name(key)}"
        client = self._client(url)
        flight = self._flight
        descriptor = flight.FlightDescriptor.for_command(encode_feed_descriptor(key, table))
        try:
            writer, _ = client.do_put(descriptor, FEED_SCHEMA, self._options(None))
            try:
                for raw in units:
                    writer.write_batch(unit_batch(raw))
            except (FeedError, QueryCancelledError) as exc:
                writer.write_batch(error_batch(exc))
            writer.done_writing()
            writer.close()
        except flight.FlightError as exc:
            raise decode_error(url, what, exc) from None
        except OSError as exc:
            raise WorkerUnavailableError(url, f"{what}: {exc}") from None

    def query_metrics(self, url: str, query_id: str) -> list[TaskMetrics]:
        """See :meth:`WorkerTransport.query_metrics` (the ``query_metrics`` action, JSON).

        Waits at most ``action_timeout_s``.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            TransportError: the answer is not a list of task metrics.
        """
        what = f"metrics of query {query_id[:8]}"
        (body,) = self._action(
            url, ACTION_QUERY_METRICS, query_id.encode(), self.action_timeout_s, what
        )
        try:
            return [TaskMetrics.from_dict(d) for d in json.loads(body)]
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"worker {url} answered {what} badly: {exc}"
            raise TransportError(msg) from None

    def write_part(
        self,
        url: str,
        body: str,
        what: str,
        query_id: str = "",
        stores: tuple[tuple[str, StoreSpec], ...] = (),
    ) -> list[dict]:
        """Have the worker at ``url`` run a head part and write its rows (``ACTION_WRITE_PART``).

        Waits until the part is written and committed (no timeout).

        Args:
            url: the worker.
            body: ``{"part": ..., "spec": ...}`` as JSON (see the action).
            what: names the part in errors.
            query_id: the query the part is of.
            stores: the query's object stores, sent first
                (:meth:`send_object_stores`): the output may be on one.

        Returns:
            The committed files, ``WrittenFile.to_json()`` each (``{"relpath", "rows"}``
            and, on an object store, ``"staged"``).

        Raises:
            TaskError: the part failed on the worker.
            WorkerUnavailableError: the worker cannot be reached.
            TransportError: the worker's answer is not a file list.
            PlanningError: see :meth:`send_object_stores`.
        """
        self.send_object_stores(url, query_id, stores)
        answer = self._action(url, ACTION_WRITE_PART, body.encode(), None, what)
        try:
            return json.loads(answer[0])
        except (IndexError, ValueError) as exc:
            msg = f"worker {url} answered {what} badly: {exc}"
            raise TransportError(msg) from None

    def cancel_query(self, url: str, query_id: str) -> None:
        """See :meth:`WorkerTransport.cancel_query`; waits at most ``cancel_timeout_s``."""
        with self._lock:
            self._stores_sent.pop((url, query_id), None)
        try:
            self._action(url, ACTION_CANCEL_QUERY, query_id.encode(), self.cancel_timeout_s)
        except TransportError:
            pass  # unreachable: the worker frees the query after its time-to-live

    def worker_started(self, url: str, worker_url: str, query_id: str, timeout_s: float) -> bool:
        """Tell the Spark driver's worker at ``url`` that ``worker_url`` started, for ``query_id``.

        Returns:
            True when the driver answers that ``query_id`` was closed already.
            False otherwise, and when the driver cannot be reached within
            ``timeout_s`` seconds or does not know the call (best effort: the
            driver then learns the worker from the task's result, as before).
        """
        body = json.dumps({"url": worker_url, "query_id": query_id}).encode()
        try:
            answer = self._action(url, ACTION_WORKER_STARTED, body, timeout_s)
        except (TransportError, KeyError):
            return False
        return bool(answer) and bool(json.loads(answer[0]).get("cancelled"))

    def failed_tasks(self, url: str, query_id: str) -> list[TaskError]:
        """See :meth:`WorkerTransport.failed_tasks` (the ``failed_tasks`` action, JSON).

        Waits at most ``action_timeout_s``.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            TransportError: the answer is not a list of encoded errors.
        """
        what = f"failed tasks of query {query_id[:8]}"
        (body,) = self._action(
            url, ACTION_FAILED_TASKS, query_id.encode(), self.action_timeout_s, what
        )
        try:
            errors = [error_from_dict(d) for d in json.loads(body)]
        except (ValueError, TypeError, AttributeError) as exc:
            msg = f"worker {url} answered {what} badly: {exc}"
            raise TransportError(msg) from None
        return [e for e in errors if isinstance(e, TaskError)]

    def task_failed(self, url: str, query_id: str, error: dict, timeout_s: float) -> None:
        """Tell the Spark driver's worker at ``url`` that a task of ``query_id`` panicked.

        ``error`` is the error codec's dict of the task's
        :class:`~distfusion.errors.TaskPanicked`. Best effort: when the driver
        cannot be reached within ``timeout_s`` seconds, it learns the error from
        the task's result when the Spark job ends, as for any other failure.
        """
        body = json.dumps({"query_id": query_id, "error": error}).encode()
        try:
            self._action(url, ACTION_TASK_FAILED, body, timeout_s)
        except (TransportError, KeyError):
            pass

    def keepalive(self, url: str, query_ids: list[str], timeout_s: float = 5.0) -> bool:
        """Tell the worker at ``url`` that the coordinator of ``query_ids`` is alive.

        Workers drop the state of a query nobody asked about for their
        time-to-live; the :class:`~distfusion.runtime.flight.FlightRuntime`
        calls this periodically for running queries.

        Returns:
            False when the worker cannot be reached within ``timeout_s`` seconds
            (it died), else True.
        """
        try:
            self._action(url, ACTION_KEEPALIVE, json.dumps(query_ids).encode(), timeout_s)
        except WorkerUnavailableError:
            return False
        except TransportError:
            pass
        return True

    def abort_query(self, query_id: str, error: Exception) -> None:
        """Make every read of ``query_id`` through this transport raise ``error``.

        Takes effect within one poll round (``poll_s``); open partition
        streams of the query are cancelled at once. For a coordinator that
        learnt a worker of the query died while it waits on another one, and
        for a worker whose query was cancelled.
        """
        with self._lock:
            self._aborted[query_id] = error
            while len(self._aborted) > _ABORTED_KEPT:
                del self._aborted[next(iter(self._aborted))]
            readers = list(self._readers.get(query_id, ()))
        for reader in readers:  # streams blocked on a batch end now
            try:
                reader.cancel()
            except Exception:
                pass

    def forget_query(self, query_id: str) -> None:
        """Drop what :meth:`abort_query` recorded for ``query_id``."""
        with self._lock:
            self._aborted.pop(query_id, None)

    def stats(self, url: str, timeout_s: float | None = None) -> dict:
        """See :meth:`WorkerTransport.stats`.

        Returns:
            ``{"live_tasks": int, "bytes_held": int, "plans_received": int,
            "live_queries": int, "pid": int, ...}`` (bytes of held output
            partitions; plans accepted since the worker started; queries with
            state; the worker's process id; the spill figures of
            :meth:`~distfusion.worker.worker.Worker.stats`).

        Raises:
            WorkerUnavailableError: the worker cannot be reached within
                ``timeout_s`` (default ``action_timeout_s``) seconds.
            AuthenticationError: the worker rejected the token.
        """
        timeout_s = self.action_timeout_s if timeout_s is None else timeout_s
        (body,) = self._action(url, ACTION_STATS, b"", timeout_s)
        return json.loads(body)

    def close(self) -> None:
        """Close every Flight client."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                client.close()
            except Exception:  # already broken: nothing to release
                pass

    def __repr__(self) -> str:
        token = "set" if self._headers else "none"
        return f"FlightWorkerTransport(clients={len(self._clients)}, token={token})"
