"""Hand one Spark partition's Arrow batches to the leaf task that reads it, in the same process.

A leaf stage over a Spark DataFrame (:func:`~distfusion.io.sources.spark_source`)
runs each task inside the Spark task that computes one partition of the
DataFrame: the Python function of that Spark task receives the partition's
Arrow batches and offers them here under the task's key and the table's name
(:func:`offering`); the task, run in this process (directly, or by the
process's Flight worker on one of its threads), takes them
(:func:`take`) when it binds its scans
(:func:`~distfusion.worker.execute_task.feed_dataframes`)::

    Spark task (partition i of the DataFrame, an executor's Python worker)
      Arrow batches of partition i --offering(key, table)--> take(key, table)
                                                              -> task i's fragment

Nothing crosses a process here: the batches go from Spark's Python worker
input stream to DataFusion. A task that finds nothing to take fails with a
:class:`~distfusion.errors.TaskError` naming the table.
A chunked leaf task reads its partition in chunks of :data:`SPARK_CHUNK_BYTES`,
conformed to the columns Spark computes (:func:`spark_chunks`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from distfusion.errors import TaskError
from distfusion.metrics.task import TaskMeter
from distfusion.protocol.task_plan import ScanShare, TaskKey

__all__ = ["SPARK_CHUNK_BYTES", "offering", "spark_chunks", "spark_schema", "take"]

_lock = threading.Lock()
_offered: dict[tuple[TaskKey, str], Iterator[pa.RecordBatch]] = {}


@contextmanager
def offering(key: TaskKey, table: str | None, batches: Iterator[pa.RecordBatch]):
    """Offer ``batches`` (one Spark partition of ``table``) to task ``key`` inside the block.

    Whatever the task did not take or read is dropped when the block ends.
    ``table`` None or ``""``: nothing is offered (a task reading no Spark table).
    """
    if not table:
        yield
        return
    with _lock:
        _offered[(key, table)] = batches
    try:
        yield
    finally:
        with _lock:
            _offered.pop((key, table), None)


def take(key: TaskKey, table: str) -> Iterator[pa.RecordBatch]:
    """The batches offered to task ``key`` for ``table``; once (a second take fails).

    Raises:
        TaskError: nothing is offered: the task does not run inside the Spark
            task computing its partition (only the Spark runtime runs it so).
    """
    with _lock:
        batches = _offered.pop((key, table), None)
    if batches is None:
        msg = (
            f"table {table!r} is a Spark DataFrame, read only inside the Spark task that "
            "computes its partition, and none was offered to this task: run the query on "
            "the Spark runtime (distfusion.spark.sql)"
        )
        raise TaskError(key.stage_id, key.task_index, "", msg)
    return batches


SPARK_CHUNK_BYTES = 64 * 1024 * 1024
"""Most Arrow bytes of a Spark partition a chunked leaf task runs its fragment over at once."""


def spark_chunks(key, share: ScanShare, meter: TaskMeter | None) -> Iterator[list[pa.RecordBatch]]:
    """The batches of the Spark partition offered to task ``key``, in chunks.

    A chunk holds up to :data:`SPARK_CHUNK_BYTES` of Arrow batches.

    Columns are matched by position and cast to the source's schema, or to
    its ``columns`` when the scan reads only those (:func:`spark_schema`).
    The bytes read count as the task's source bytes (``meter``).

    Raises:
        TaskError: no partition was offered (:func:`take`).
    """
    schema = spark_schema(share.source)
    chunk_bytes = SPARK_CHUNK_BYTES
    chunk: list[pa.RecordBatch] = []
    size = 0
    for batch in take(key, share.source.name):
        if not batch.num_rows:
            continue
        batch = _conform_positional(batch, schema)
        if meter is not None:
            meter.unit_bytes += batch.nbytes
        chunk.append(batch)
        size += batch.nbytes
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def spark_schema(source) -> pa.Schema:
    """The columns Spark computes of Spark table ``source``: its ``columns`` option, or all."""
    cols = source.options.get("columns")
    if cols is None:
        return source.schema
    return pa.schema([source.schema.field(i) for i in cols])


def _conform_positional(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema`` (names and types), columns matched by position."""
    if batch.schema.equals(schema):
        return batch
    columns = [
        c if c.type == f.type else c.cast(f.type)
        for c, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
