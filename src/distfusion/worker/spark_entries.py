"""The executor entry points of the Spark runtime, in one registry, and how jobs ship them.

Every Spark job of :mod:`distfusion.runtime.spark` runs a closure made here:
:func:`task_function` (an RDD's ``mapPartitionsWithIndex``) or :func:`mapper`
(a Connect DataFrame's ``mapInArrow``). The driver names the entry point by
the function itself (``task_function(tasks, run_flight_task, ...)``); the
closure carries its registry name (:data:`ENTRIES`) and looks it up on the
executor, so that it refers to nothing of distfusion until it runs: an
executor that cannot import distfusion then fails with a message saying so,
naming the stage and task, instead of failing to unpickle the task.

The entries (each ``entry(partition index, records, *args)``):

========================  ==============================================================
:func:`~.spark_tasks.run_flight_task`         a task of the Flight data plane (classic)
:func:`~.spark_tasks.run_flight_table_task`   one over a Spark table's partition (classic)
:func:`~.spark_tasks.run_shuffle_task`        a task of the shuffle data plane
:func:`~.spark_tasks.run_head_part`           ``fn`` over a head part (classic)
:func:`~.spark_connect_tasks.run_task`        a task of a round on Spark Connect
:func:`~.spark_connect_tasks.run_table_task`  one over a Spark table's partition (Connect)
:func:`~.spark_connect_tasks.run_head`        the head, streamed back (Connect)
:func:`~.spark_connect_tasks.run_parts`       ``fn`` over head parts (Connect)
:func:`~.spark_connect_tasks.control`         the executors' workers asked (Connect)
========================  ==============================================================

Every task entry builds its tasks from the same records
(:mod:`distfusion.worker.spark_codec`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from distfusion.errors import TaskError
from distfusion.io import object_store
from distfusion.protocol.errors import error_to_dict
from distfusion.worker import spark_connect_tasks, spark_tasks
from distfusion.worker.spark_tasks import ERROR_MARKER, EXECUTORS_SECTION

__all__ = ["ENTRIES", "entry_name", "freeze_heap_once", "mapper", "run_entry", "task_function"]

ENTRIES: dict[str, Callable] = {
    fn.__name__: fn
    for fn in (
        spark_tasks.run_flight_task,
        spark_tasks.run_flight_table_task,
        spark_tasks.run_shuffle_task,
        spark_tasks.run_head_part,
        spark_connect_tasks.run_task,
        spark_connect_tasks.run_table_task,
        spark_connect_tasks.run_head,
        spark_connect_tasks.run_parts,
        spark_connect_tasks.control,
    )
}
"""Registry name -> executor entry point: every function a Spark job of distfusion runs."""


def entry_name(entry: Callable) -> str:
    """``entry``'s registry name (driver side).

    Raises:
        ValueError: ``entry`` is not in :data:`ENTRIES`.
    """
    name = getattr(entry, "__name__", "")
    if ENTRIES.get(name) is not entry:
        msg = f"{entry!r} is not an executor entry point of distfusion.worker.spark_entries"
        raise ValueError(msg)
    return name


def run_entry(name: str, index: int, records, args: tuple, stores: list):
    """Run entry ``name`` for partition ``index`` (executor side, inside the closure).

    ``stores``: the driver's object stores, registered first (for the
    executor's own reads and writes through obstore).
    """
    if stores:
        object_store.install(stores)
    out = ENTRIES[name](index, records, *args)
    freeze_heap_once()
    return out


def task_function(tasks, entry: Callable, *args):
    """The function Spark ships to the executors for one job.

    Args:
        tasks: ``(stage id, task index)`` of each RDD partition, by partition
            index, for the report of a task that cannot import distfusion.
        entry: the executor entry point the task runs (one of :data:`ENTRIES`),
            called as ``entry(partition index, records, *args)``.
        *args: the rest of ``entry``'s arguments (pickled with the closure).

    The driver's object stores (:mod:`distfusion.io.object_store`, explicit
    credentials included: Spark's closure is the channel) travel with the
    closure too, for the executor's own reads and writes through obstore.
    A task's session gets its query's UDFs and stores from its stage
    (``Stage.session``, pickled with it: :mod:`distfusion.session`), never
    from the process.

    It is a closure, so cloudpickle ships it by value, and it refers to nothing
    of distfusion until it runs (the entry travels by its registry name). The
    report of an executor without distfusion is encoded here, on the driver
    (``report``, the error codec's dict), so the executor needs only the
    standard library to fill in the task.

    Raises:
        ValueError: ``entry`` is not in :data:`ENTRIES`.
    """
    name = entry_name(entry)
    report = error_to_dict(TaskError(-1, -1, "", ""))
    missing_section = EXECUTORS_SECTION
    marker = ERROR_MARKER
    stores = object_store.specs()

    def run(index, records):
        try:
            # On purpose inside the task: see the docstring.
            import distfusion.worker.spark_entries as spark_entries
        except ImportError as exc:
            import json as _json  # standard library only: distfusion is missing here
            import os as _os
            import socket as _socket

            cause = (
                f"ImportError: {exc} -- the Spark executors need distfusion and datafusion "
                "in their Python environment (same venv via PYSPARK_PYTHON, "
                "spark.archives with a packed venv, or --py-files; see docs/spark.md, "
                f'section "{missing_section}")'
            )
            stage_id, task_index = tasks[index]
            worker = f"spark-executor://{_socket.gethostname()}/pid{_os.getpid()}"
            failed = {**report, "stage_id": stage_id, "task_index": task_index}
            failed.update(worker=worker, cause=cause)
            failed["message"] = f"stage {stage_id} task {task_index} failed: {cause}"
            raise RuntimeError(marker + _json.dumps(failed)) from None
        return spark_entries.run_entry(name, index, records, args, stores)

    return run


def mapper(tasks, entry: Callable, by_partition: bool, *args):
    """The ``mapInArrow`` function of a Connect job: runs ``entry`` in the executor's Python worker.

    Args:
        tasks: ``(stage, task)`` by index, for the report of a task that
            cannot import distfusion.
        entry: the executor entry point (one of :data:`ENTRIES`), called as
            ``entry(index, records, *args)``; it returns (or yields) Arrow
            record batches of the job's schema.
        by_partition: the input is a partition of a Spark table's DataFrame
            (``runtime.spark.connect``'s ``_spark_frame``): ``index`` is its
            partition number (its last column), ``records`` its Arrow batches
            without that column; an empty partition runs nothing (its task
            runs over an empty one in a job of its own). Else each input row
            is an id of ``spark.range``, the index, and ``records`` is empty.
        *args: ``entry``'s other arguments (pickled with the function).

    Built on :func:`task_function`: the same shipping of UDFs and object
    stores, the same report when an executor cannot import distfusion, the
    same heap freeze after the first task.

    Raises:
        ValueError: ``entry`` is not in :data:`ENTRIES`.
    """
    run = task_function(tasks, entry, *args)

    def map_in_arrow(batches):
        if by_partition:
            batches = iter(batches)
            first = next(batches, None)
            while first is not None and first.num_rows == 0:
                first = next(batches, None)
            if first is None:  # an empty partition: its number is unknown here
                return
            index = first.column(first.num_columns - 1)[0].as_py()

            def data():
                yield first.select(range(first.num_columns - 1))
                for b in batches:
                    yield b.select(range(b.num_columns - 1))

            yield from run(index, data())
            return
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from run(index, iter(()))

    return map_in_arrow


_heap_frozen = False


def freeze_heap_once() -> None:
    """Hide what this Python worker imported from the cyclic GC, once, after its first task.

    PySpark runs ``gc.collect()`` after every task of a reused Python worker. A
    full collection walks every tracked object, and what distfusion, datafusion,
    pyarrow and pyspark import is ~100,000 of them: a large share of a Python
    worker's time (docs/benchmarks.md, "Spark stage outputs"). After one
    collection, ``gc.freeze()`` moves them to the permanent generation; later
    collections walk only what later tasks create.
    """
    global _heap_frozen
    if not _heap_frozen:
        gc.collect()
        gc.freeze()
        _heap_frozen = True
