"""The result of a run: its stream, named as the query's columns, the head cut into parts.

:class:`ResultStream` is what :meth:`~distfusion.context.DistributedDataFrame.execute_stream`
returns (exported by :mod:`distfusion.context`): closing it from any thread
cancels the query. It yields :class:`RecordBatch`, DataFusion's batch type.

Stages name columns ``c0..``, Substrait drops a timestamp literal's zone, and
a distributed run may lose a column's ``NOT NULL``: :func:`named` gives the
batches the query's names, zones and nullability back.
:func:`map_head_parts` runs a function over every part of the head stage
(where the data is); :func:`write_head_part` writes one part as a task of a
file write.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import datafusion
import pyarrow as pa

from distfusion.coordinator.query_run import MapsHeadParts, QueryRun
from distfusion.errors import QueryCancelledError
from distfusion.io.write import WriteSpec, WrittenFile, write_task
from distfusion.stages import StageGraph
from distfusion.worker.interrupt import Interruptible


def named(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``batches`` with the query's schema: its column names, time zones and nullability.

    ``schema`` is the single-node plan's (``DataFrame.schema()`` on the
    coordinator). Stages name columns ``c0..``; Substrait does not carry a
    timestamp literal's zone (DataFusion's consumer reads it as UTC), so a
    column whose only difference from the query's type is the zone gets the
    query's zone back (the same instants: only the label changes); and a
    fragment decoded from Substrait, or a batch read back over a network
    boundary, may mark as nullable a column the plan knows is ``NOT NULL``
    (``count(*)``, a key column of a Parquet file): every field takes the
    plan's nullability and metadata, so a distributed result's schema is the
    one single-node DataFusion gives. A column whose type differs otherwise
    keeps its own type. Closing the returned iterator closes ``batches``
    (which cancels the query).
    """
    try:
        for b in batches:
            columns = [
                c.cast(f.type) if c.type != f.type and _zone_only(c.type, f.type) else c
                for c, f in zip(b.columns, schema, strict=True)
            ]
            if b.schema.equals(schema, check_metadata=True) and all(
                c is o for c, o in zip(columns, b.columns, strict=True)
            ):
                yield b
            else:
                yield pa.RecordBatch.from_arrays(columns, schema=_schema_of(columns, schema))
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _schema_of(columns: list[pa.Array], schema: pa.Schema) -> pa.Schema:
    """``schema``, a column's own type where it differs from its field's (see :func:`named`)."""
    if all(c.type == f.type for c, f in zip(columns, schema, strict=True)):
        return schema
    fields = [
        f if c.type == f.type else pa.field(f.name, c.type, f.nullable, f.metadata)
        for c, f in zip(columns, schema, strict=True)
    ]
    return pa.schema(fields, metadata=schema.metadata)


def _zone_only(got: pa.DataType, want: pa.DataType) -> bool:
    """Both are timestamps of one unit, with different zones (or one without)."""
    return (
        pa.types.is_timestamp(got)
        and pa.types.is_timestamp(want)
        and got.unit == want.unit
        and got.tz is not None
        and want.tz is not None
    )


def map_head_parts(run: QueryRun, graph: StageGraph, fn, split: bool = True) -> list:
    """``fn(part, attempt, batches)`` over every part of ``graph``'s head on ``run``.

    A run that cannot cut its head (Spark's shuffle data plane, whose head
    inputs come to the driver) runs the head whole here as part 0.
    """
    if isinstance(run, MapsHeadParts):
        return run.map_head_parts(graph, fn, split)
    return [fn(0, 0, run.stream_head(graph))]


def write_head_part(spec: WriteSpec, part: int, attempt: int, batches) -> list[WrittenFile]:
    """Write one head part's batches (named as the result) as task ``part`` of ``spec``'s job."""
    return write_task(spec, part, named(batches, spec.schema))


class RecordBatch(datafusion.RecordBatch):
    """One result batch, as DataFusion's ``execute_stream`` yields it: ``to_pyarrow()`` gives it.

    A ``datafusion.RecordBatch`` (``to_pyarrow()``, ``__arrow_c_array__``)
    around a ``pyarrow.RecordBatch``, whose attributes it also has
    (``num_rows``, ``schema``, ``column(i)``, ``to_pylist()``, ...), as the
    batches distfusion yielded before datafusion-python 55's type.
    """

    def __init__(self, batch: pa.RecordBatch) -> None:
        self._batch = batch

    def to_pyarrow(self) -> pa.RecordBatch:
        """The batch as a ``pyarrow.RecordBatch`` (no copy)."""
        return self._batch

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        """The batch through the Arrow PyCapsule interface (pyarrow's export)."""
        return self._batch.__arrow_c_array__(requested_schema)

    def __getattr__(self, name: str) -> Any:
        if name == "_batch":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._batch, name)

    def __len__(self) -> int:
        return self._batch.num_rows

    def __repr__(self) -> str:
        return f"RecordBatch({self._batch!r})"


class ResultStream(datafusion.RecordBatchStream, Iterator[RecordBatch]):
    """The result batches of one run of a query (:meth:`DistributedDataFrame.execute_stream`).

    A ``datafusion.RecordBatchStream`` of :class:`RecordBatch` (DataFusion's
    type: ``to_pyarrow()`` gives the ``pyarrow.RecordBatch``), read as
    datafusion-python 55's: ``next()``, ``for``, ``async for``.
    :attr:`batches` are the ``pyarrow.RecordBatch`` themselves. :meth:`close` before the end
    cancels every task of the query, and may be called from any thread: a
    generator closed while another thread waits in it fails with
    ``ValueError: generator already executing``, and the query ran on.

    Args:
        batches: the run's batches (a generator that cancels the query when closed).
        cancel: stops the run from another thread (the observer's
            :meth:`~distfusion.metrics.observer.QueryObserver.cancel`).
    """

    close_wait_s = 10.0
    """How long :meth:`close` from another thread waits for the reading thread to stop, seconds."""

    def __init__(self, batches: Iterator[pa.RecordBatch], cancel: Callable[[], None]) -> None:
        self._batches = batches
        self._cancel = cancel
        self._lock = threading.Lock()
        self._reading: Interruptible | None = None  # the reading thread's, inside __next__
        self._left = threading.Condition(self._lock)
        self._closed = False

    def __iter__(self) -> ResultStream:
        return self

    @property
    def batches(self) -> Iterator[pa.RecordBatch]:
        """The run's batches themselves, for a reader that never closes them from another thread."""
        return self._batches

    def next(self) -> RecordBatch:
        """The next batch (DataFusion's ``RecordBatchStream.next``); see :meth:`__next__`."""
        return next(self)

    def __aiter__(self) -> ResultStream:
        return self

    async def __anext__(self) -> RecordBatch:
        """The next batch, waited for in a thread (``async for``); see :meth:`__next__`.

        Raises:
            StopAsyncIteration: the result ended, or the stream was closed.
        """
        batch = await asyncio.to_thread(next, self, None)
        if batch is None:
            raise StopAsyncIteration
        return batch

    def __next__(self) -> RecordBatch:
        """The next batch.

        Raises:
            StopIteration: the result ended, or the stream was closed.
            QueryCancelledError: :meth:`close` was called from another thread
                while this call waited.
            DistfusionError: as :meth:`DistributedDataFrame.execute_stream`.
        """
        with self._lock:
            if self._closed:
                raise StopIteration
            if self._reading is not None:
                msg = "a ResultStream is read by one thread at a time"
                raise RuntimeError(msg)
            reading = self._reading = Interruptible()
        try:
            with reading:
                return RecordBatch(_next_of(self._batches, reading))
        finally:
            with self._lock:
                self._reading = None
                self._left.notify_all()

    def close(self) -> None:
        """Stop the query: every task is cancelled and its state freed. Idempotent.

        From the thread reading the stream (or with no read under way) this
        closes the generator, as closing a generator does. From another
        thread while a read waits: the query's runs are closed, the reading
        thread's wait is interrupted (its :meth:`__next__` raises
        :class:`~distfusion.errors.QueryCancelledError`), and this waits up to
        :attr:`close_wait_s` for it to stop.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        if reading is None or reading.thread_id == threading.get_ident():
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()
            return
        self._cancel()
        reading.interrupt(QueryCancelledError("the result stream was closed"))
        deadline = time.monotonic() + self.close_wait_s
        with self._lock:
            while self._reading is reading and time.monotonic() < deadline:
                self._left.wait(0.1)

    def __enter__(self) -> ResultStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _next_of(batches: Iterator[pa.RecordBatch], reading: Interruptible) -> pa.RecordBatch:
    """``next(batches)``; an interrupted read raises the interrupter's error, not what it caused."""
    try:
        return next(batches)
    except StopIteration:
        raise
    except Exception:
        if reading.error is not None:
            raise reading.error.with_traceback(None) from None
        raise
