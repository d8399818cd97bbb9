"""Feed streams on the wire: how work units and a feed's failure travel as Arrow batches.

A feed partition streams as Arrow record batches of :data:`FEED_SCHEMA`, one
row per work unit (``unit``: :meth:`WorkUnit.to_bytes`, ``error`` null). A
stream that fails ends with one row whose ``unit`` is null and whose
``error`` is the error codec's JSON (:mod:`distfusion.protocol.errors`), so
the receiver raises the same :class:`~distfusion.errors.FeedError` (or
:class:`~distfusion.errors.QueryCancelledError`) instead of taking a cut stream
for a finished one. Used in both directions: pushed by the coordinator to a
Flight worker (``DoPut``, :func:`encode_feed_descriptor`), pulled by a Spark
task from the driver's feed endpoint (``DoGet``, :func:`encode_feed_ticket`).
Everything is JSON and Arrow; nothing is pickled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import pyarrow as pa

from distfusion.errors import TransportError
from distfusion.protocol.errors import error_from_dict, error_to_dict
from distfusion.protocol.task_plan import TaskKey

__all__ = [
    "FEED_SCHEMA",
    "decode_feed_batches",
    "decode_feed_descriptor",
    "decode_feed_ticket",
    "encode_feed_descriptor",
    "encode_feed_ticket",
    "error_batch",
    "unit_batch",
]

FEED_SCHEMA = pa.schema([("unit", pa.binary()), ("error", pa.string())])
"""Schema of a feed stream's batches."""


def unit_batch(raw: bytes) -> pa.RecordBatch:
    """One serialised work unit as a batch of :data:`FEED_SCHEMA`."""
    return pa.RecordBatch.from_arrays(
        [pa.array([raw], pa.binary()), pa.array([None], pa.string())], schema=FEED_SCHEMA
    )


def error_batch(exc: BaseException) -> pa.RecordBatch:
    """The last batch of a failed stream: ``exc`` encoded with the error codec."""
    body = json.dumps(error_to_dict(exc))
    return pa.RecordBatch.from_arrays(
        [pa.array([None], pa.binary()), pa.array([body], pa.string())], schema=FEED_SCHEMA
    )


def decode_feed_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """The serialised units of a feed stream, in order.

    Raises:
        FeedError / QueryCancelledError: the stream ended with that error.
        TransportError: the stream ended with another error, or a batch is not
            of :data:`FEED_SCHEMA`.
    """
    for batch in batches:
        if batch.schema.names != FEED_SCHEMA.names:
            msg = f"not a work unit feed stream: columns {batch.schema.names}"
            raise TransportError(msg)
        units = batch.column(0).to_pylist()
        errors = batch.column(1).to_pylist()
        for raw, err in zip(units, errors, strict=True):
            if err is not None:
                decoded = error_from_dict(json.loads(err))
                if decoded is None:
                    raise TransportError(f"the work unit feed failed: {err}")
                raise decoded
            yield raw


def encode_feed_descriptor(key: TaskKey, table: str) -> bytes:
    """The ``DoPut`` command naming the feed of ``table`` read by task ``key`` (JSON)."""
    return json.dumps(
        {
            "feed": table,
            "query_id": key.query_id,
            "stage_id": key.stage_id,
            "task_index": key.task_index,
        }
    ).encode()


def decode_feed_descriptor(data: bytes) -> tuple[TaskKey, str]:
    """Inverse of :func:`encode_feed_descriptor`: ``(task key, table)``.

    Raises:
        ValueError: ``data`` is not a feed descriptor.
    """
    try:
        d = json.loads(data)
        return TaskKey(str(d["query_id"]), int(d["stage_id"]), int(d["task_index"])), str(d["feed"])
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"not a distfusion feed descriptor: {exc}"
        raise ValueError(msg) from exc


def encode_feed_ticket(key: TaskKey, table: str, secret: str) -> bytes:
    """The ``DoGet`` ticket a task pulls its feed partition with (JSON, with the query's secret)."""
    return json.dumps(
        {
            "feed": table,
            "query_id": key.query_id,
            "stage_id": key.stage_id,
            "partition": key.task_index,
            "secret": secret,
        }
    ).encode()


def decode_feed_ticket(data: bytes) -> tuple[TaskKey, str, str]:
    """Inverse of :func:`encode_feed_ticket`: ``(task key, table, secret)``.

    Raises:
        ValueError: ``data`` is not a feed ticket.
    """
    try:
        d = json.loads(data)
        key = TaskKey(str(d["query_id"]), int(d["stage_id"]), int(d["partition"]))
        return key, str(d["feed"]), str(d["secret"])
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"not a distfusion feed ticket: {exc}"
        raise ValueError(msg) from exc
