"""The executor side of the Spark runtime on Spark Connect: the functions its jobs run.

Every job of :class:`~distfusion.runtime.spark.connect.SparkConnectRuntime` is
a DataFrame's ``mapInArrow`` with a function made by
:func:`~distfusion.worker.spark_entries.mapper`: in the executor's Python
worker it calls one of the registered entries
(:data:`~distfusion.worker.spark_entries.ENTRIES`); this module's are
:func:`run_task` and :func:`run_table_task` (a round's tasks, on this
process's Flight worker, as the classic Flight plane's
:func:`~distfusion.worker.spark_tasks.flight_task`), :func:`run_head` (the head,
its batches as rows streamed back through Connect), :func:`run_parts` (head
parts: ``to_spark``, ``write_parquet``) and :func:`control` (the executors'
workers asked for stats, keepalives, cancellation). Each yields Arrow record
batches of its job's schema (``*_SCHEMA``) and never raises for a task's
failure: PySpark would end the Python worker, and the outputs it holds.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from collections.abc import Iterator

import pyarrow as pa

from distfusion.errors import TaskError, TransportError, WorkerUnavailableError
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import error_to_dict, is_task_failure, task_error
from distfusion.worker.spark_codec import StageRecord, TaskRecord, head_part, task_plan
from distfusion.worker.spark_records import CHUNK_BYTES, ipc_stream, record_chunks
from distfusion.worker.spark_tasks import (
    drain,
    executor_transport,
    flight_task,
    part_batches,
    run_head_part,
)

__all__ = [
    "BATCHES",
    "CLEANED",
    "CONTROL_SCHEMA",
    "FAILED",
    "HEAD_SCHEMA",
    "METRICS",
    "PARTS_SCHEMA",
    "ROUND_SCHEMA",
    "SCHEMA",
    "control",
    "nothing",
    "run_head",
    "run_parts",
    "run_table_task",
    "run_task",
]


ROUND_SCHEMA = "stage int, task int, url string, metrics string, error string"
"""Spark schema of a round's records: one per task (the tuple of
:func:`~distfusion.worker.spark_tasks.flight_task`)."""
ROUND_ARROW = pa.schema(
    [
        ("stage", pa.int32()),
        ("task", pa.int32()),
        ("url", pa.string()),
        ("metrics", pa.string()),
        ("error", pa.string()),
    ]
)
HEAD_SCHEMA = "kind int, data binary"
"""Spark schema of the head job's rows: ``kind`` :data:`SCHEMA` (``data``: the
result's Arrow schema, serialized), :data:`BATCHES` (an Arrow IPC stream of
result batches, view types as plain ones), :data:`METRICS` (the head's metrics
as JSON), :data:`FAILED` (the error report) or :data:`CLEANED` (the query was
cancelled on its workers)."""
HEAD_ARROW = pa.schema([("kind", pa.int32()), ("data", pa.binary())])
BATCHES, METRICS, FAILED, CLEANED, SCHEMA = 0, 1, 2, 3, 4
PARTS_SCHEMA = "part int, value binary, error string"
"""Spark schema of a head-parts job's rows: the part, ``fn``'s pickled result, the error report."""
PARTS_ARROW = pa.schema([("part", pa.int32()), ("value", pa.binary()), ("error", pa.string())])
CONTROL_SCHEMA = "url string, ok boolean, stats string"
"""Spark schema of a control job's rows: one per worker URL asked."""
CONTROL_ARROW = pa.schema([("url", pa.string()), ("ok", pa.bool_()), ("stats", pa.string())])


def nothing(batches):
    """A ``mapInArrow`` function reading its input and yielding nothing (keep-warm jobs)."""
    for _ in batches:
        pass
    return iter(())


def _round_batch(records: list[tuple]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [dict(zip(ROUND_ARROW.names, r, strict=True)) for r in records], schema=ROUND_ARROW
    )


def _one_task(
    query_id: str, stage: StageRecord, t: int, attempt: int, batches: Iterator, worker_args
):
    """Task ``t`` of ``stage`` (its record) on this process's Flight worker: its round record."""
    plan = task_plan(query_id, stage, t)
    sid, task, url, metrics, report = flight_task(plan, attempt, stage[4], batches, worker_args)
    return (sid, task, url, None if metrics is None else json.dumps(metrics), report)


def run_task(index, records, query_id, plain: list[TaskRecord], stages, worker_args):
    """Spark task ``index`` of a round: distfusion task ``plain[index]`` (executor side).

    ``plain[index]`` is a task record ``(stage, task, attempt)``; ``stages``
    maps a stage to its stage record (:mod:`~distfusion.worker.spark_codec`). A task
    of a stage reading a Spark table runs here only past the DataFrame's
    partitions: over an empty one. Returns one batch of :data:`ROUND_SCHEMA`.
    """
    drain(records)
    sid, t, attempt = plain[index]
    return [_round_batch([_one_task(query_id, stages[sid], t, attempt, iter(()), worker_args)])]


def run_table_task(index, batches, query_id, attempts, stage: StageRecord, worker_args):
    """Spark task over partition ``index`` of a Spark table's DataFrame: that task of ``stage``.

    ``batches``: the partition's Arrow batches, offered to the task as the
    table's rows; what it left is drained. A partition whose task is not in
    ``attempts`` (``{task: attempt}``: the tasks to run) yields nothing.
    """
    if index not in attempts:
        drain(batches)
        return []
    try:
        record = _one_task(query_id, stage, index, attempts[index], batches, worker_args)
    finally:
        drain(batches)
    return [_round_batch([record])]


def run_head(index, records, query_id, attempt, part_bytes, access, budget, threads, urls):
    """The head task: run the whole head here, yield its batches as rows of :data:`HEAD_SCHEMA`.

    The result's schema goes first (the client casts the plain strings the
    IPC streams carry back to its view types); the batches go out as Arrow
    IPC streams of at most
    :data:`~distfusion.worker.spark_records.CHUNK_BYTES` each; then the head's
    metrics; then the query is cancelled on the workers at ``urls`` (its
    outputs freed) and a :data:`CLEANED` row says so. A failure ends the rows
    with a :data:`FAILED` row (the error codec's JSON), never an exception:
    PySpark would end this process and the outputs it holds.
    """
    drain(records)
    part = head_part(part_bytes)
    measured: list[TaskMetrics] = []
    url = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    schema = None
    try:
        for batch in part_batches(part, access, budget, threads, attempt, measured.append):
            if schema is None:
                schema = batch.schema
                yield _head_row(SCHEMA, schema.serialize().to_pybytes())
            if batch.num_rows:
                for chunk in record_chunks([batch], CHUNK_BYTES):
                    yield _head_row(BATCHES, ipc_stream(chunk, None).to_pybytes())
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        err = exc if isinstance(exc, TaskError) else task_error(part.plan.key.stage_id, 0, url, exc)
        yield _head_row(FAILED, json.dumps(error_to_dict(err)).encode())
        return
    if measured:
        yield _head_row(METRICS, json.dumps(measured[0].to_dict()).encode())
    transport = executor_transport(access)
    for worker in urls:
        transport.cancel_query(worker, query_id)
    yield _head_row(CLEANED, b"")


def _head_row(kind: int, data: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([kind], pa.int32()), pa.array([data], pa.binary())], schema=HEAD_ARROW
    )


def run_parts(index, records, parts, access, budget, threads, fn_bytes):
    """Spark task ``index`` of a head-parts job: ``fn`` over part ``parts[index]`` (executor side).

    ``parts[index]`` is ``(attempt, part pickled by value)``; the part runs as the classic
    plane's (:func:`~distfusion.worker.spark_tasks.run_head_part`); ``fn``'s result
    travels pickled. Returns one batch of :data:`PARTS_SCHEMA`.
    """
    drain(records)
    fn = pickle.loads(fn_bytes)
    ((i, value, report),) = run_head_part(index, iter([parts[index]]), access, budget, threads, fn)
    value = None if report is not None else pickle.dumps(value)
    return [
        pa.RecordBatch.from_arrays(
            [pa.array([i], pa.int32()), pa.array([value], pa.binary()), pa.array([report])],
            schema=PARTS_ARROW,
        )
    ]


def control(index, records, access, action, query_id, urls):
    """The task of a control job: ``action`` on every worker at ``urls`` (executor side).

    ``stats``: each worker's stats (``answered`` False when it cannot be
    reached); ``cancel``: ``cancel_query`` (best effort); ``keepalive``.
    Returns one batch of :data:`CONTROL_SCHEMA`.
    """
    drain(records)
    transport = executor_transport(access)
    rows = []
    for url in urls:
        answer = None
        try:
            if action == "stats":
                answer = json.dumps(transport.stats(url, timeout_s=5.0))
                ok = True
            elif action == "cancel":
                transport.cancel_query(url, query_id)
                ok = True
            else:
                ok = transport.keepalive(url, [query_id])
        except (WorkerUnavailableError, TransportError):
            ok = False
        rows.append({"url": url, "ok": ok, "stats": answer})
    return [pa.RecordBatch.from_pylist(rows, schema=CONTROL_ARROW)]
