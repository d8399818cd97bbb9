"""Hand one Spark partition's Arrow batches to the leaf task that reads it, in the same process.

A leaf stage over a Spark DataFrame (:func:`~distfusion.sources.spark_source`)
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
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from distfusion.errors import TaskError
from distfusion.protocol.task_plan import TaskKey

__all__ = ["offering", "take"]

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
