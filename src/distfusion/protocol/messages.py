"""The worker protocol's messages besides the task plan: action names, tickets, requests.

What a worker transport sends over the network (the Arrow Flight transport
today, :mod:`distfusion.transport.flight`) and a worker server reads
(:mod:`distfusion.worker.flight_server`); every body is JSON, nothing is
pickled. See docs/architecture.md for where each message is used::

    call          body                               answer
    set_plan      TaskPlan JSON (task_plan.py)       nothing
    DoGet         ticket (encode_ticket)             the partition's Arrow stream
    task_stats    task request (encode_task_request) {"partition_rows", "partition_bytes"}
    cancel_query  the query id (UTF-8)               nothing
    keepalive     JSON list of query ids             nothing
    stats         nothing                            {"live_tasks", "bytes_held", ...}
    set_object_stores  a query's object stores (encode_stores)  nothing
"""

from __future__ import annotations

import json

from distfusion.io.object_store import StoreSpec
from distfusion.protocol.task_plan import TaskKey

__all__ = [
    "ACTION_CANCEL_QUERY",
    "ACTION_FAILED_TASKS",
    "ACTION_KEEPALIVE",
    "ACTION_QUERY_METRICS",
    "ACTION_SET_OBJECT_STORES",
    "ACTION_SET_PLAN",
    "ACTION_STATS",
    "ACTION_TASK_FAILED",
    "ACTION_TASK_STATS",
    "ACTION_WORKER_STARTED",
    "ACTION_WRITE_PART",
    "DEFAULT_QUERY_TTL_S",
    "TOKEN_ENV",
    "decode_stores",
    "decode_task_request",
    "decode_ticket",
    "encode_stores",
    "encode_task_request",
    "encode_ticket",
]

TOKEN_ENV = "DISTFUSION_TOKEN"
"""Environment variable holding the shared secret token of workers and coordinators.

Calls carry it as the header ``authorization: Bearer <token>``."""

DEFAULT_QUERY_TTL_S = 120.0
"""A query nobody asked about for this long (seconds) is dropped by a worker: its
coordinator is gone. Coordinators send a keepalive every second while a query runs."""

ACTION_SET_PLAN = "set_plan"
ACTION_CANCEL_QUERY = "cancel_query"
ACTION_KEEPALIVE = "keepalive"
ACTION_STATS = "stats"
ACTION_TASK_STATS = "task_stats"
ACTION_QUERY_METRICS = "query_metrics"
"""Body: a query id. Answer: a JSON list of the finished tasks' metrics
(``TaskMetrics.to_dict``), one call per worker when a query ends."""
ACTION_WORKER_STARTED = "worker_started"
"""Body: JSON ``{"url", "query_id"}``, sent by a Spark executor's Flight worker when
it starts (its first task, of query ``query_id``) to the driver's worker, so that
cancelling a query reaches it. Answer: JSON ``{"cancelled": bool}``: the query was
closed already (its task must not run)."""
ACTION_SET_OBJECT_STORES = "set_object_stores"
"""Body: JSON ``{"query_id", "stores": [[scheme://host, StoreSpec.to_json()], ...]}``
(:func:`encode_stores`): the object stores of one query's context, credentials
included, sent before the query's first task plan to a worker; only to workers
that take a token. The worker registers them in that query's task sessions and
forgets them with the query. Answer: nothing."""
ACTION_FAILED_TASKS = "failed_tasks"
"""Body: a query id. Answer: a JSON list of the error codec's dicts of the tasks
of that query that failed on the worker so far (polled by the coordinator while
the query runs, to fail it at once)."""
ACTION_TASK_FAILED = "task_failed"
"""Body: JSON ``{"query_id", "error"}`` (``error``: the error codec's dict of a
:class:`~distfusion.errors.TaskPanicked`), sent by a Spark executor's task to the
driver's worker the moment the task panicked, so that the driver fails the query
at once rather than when the Spark job's other tasks end. Answer: nothing."""
ACTION_WRITE_PART = "write_part"
"""Body: JSON ``{"part": HeadPart.to_json(), "spec": WriteSpec.to_json()}``: run
a part of a head stage and write its rows as files (``distfusion.io.write``).
Answer: a JSON list of the task's committed files ``{"relpath", "rows"}`` (and
``"staged"``, the URL of a file uploaded to an object store: ``WrittenFile.to_json``)."""


def _task_fields(key: TaskKey, timeout_s: float | None) -> dict:
    return {
        "query_id": key.query_id,
        "stage_id": key.stage_id,
        "task_index": key.task_index,
        "timeout_s": timeout_s,
    }


def _read_task_fields(d: dict) -> tuple[TaskKey, float | None]:
    key = TaskKey(str(d["query_id"]), int(d["stage_id"]), int(d["task_index"]))
    timeout_s = d.get("timeout_s")
    return key, None if timeout_s is None else float(timeout_s)


def encode_ticket(key: TaskKey, partition: int, timeout_s: float | None) -> bytes:
    """The ticket naming output ``partition`` of task ``key`` (JSON bytes).

    ``timeout_s``: how long the worker waits for the task to finish before it
    answers "not yet" (a timed-out error), seconds; None waits as long as it takes.
    """
    return json.dumps({**_task_fields(key, timeout_s), "partition": partition}).encode()


def decode_ticket(data: bytes) -> tuple[TaskKey, int, float | None]:
    """Inverse of :func:`encode_ticket`: ``(key, partition, timeout_s)``.

    Raises:
        ValueError: ``data`` is not a distfusion ticket.
    """
    try:
        d = json.loads(data)
        key, timeout_s = _read_task_fields(d)
        return key, int(d["partition"]), timeout_s
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"not a distfusion ticket: {exc}"
        raise ValueError(msg) from exc


def encode_task_request(key: TaskKey, timeout_s: float | None) -> bytes:
    """The body of a ``task_stats`` action naming task ``key`` (JSON bytes)."""
    return json.dumps(_task_fields(key, timeout_s)).encode()


def decode_task_request(data: bytes) -> tuple[TaskKey, float | None]:
    """Inverse of :func:`encode_task_request`: ``(key, timeout_s)``.

    Raises:
        ValueError: ``data`` is not a task request.
    """
    try:
        return _read_task_fields(json.loads(data))
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"not a distfusion task request: {exc}"
        raise ValueError(msg) from exc


def encode_stores(query_id: str, stores: tuple[tuple[str, StoreSpec], ...]) -> bytes:
    """The body of ``set_object_stores``: query ``query_id``'s ``(scheme://host, spec)`` pairs."""
    shipped = [[key, spec.to_json()] for key, spec in stores]
    return json.dumps({"query_id": query_id, "stores": shipped}).encode()


def decode_stores(body: bytes) -> tuple[str, tuple[tuple[str, StoreSpec], ...]]:
    """Inverse of :func:`encode_stores`: ``(query id, (scheme://host, spec) pairs)``.

    Raises:
        ValueError: ``body`` is not a query's list of store specs.
    """
    try:
        d = json.loads(body)
        stores = tuple((str(key), StoreSpec.from_json(spec)) for key, spec in d["stores"])
        return str(d["query_id"]), stores
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"not a query's object store specs: {exc}"
        raise ValueError(msg) from exc
