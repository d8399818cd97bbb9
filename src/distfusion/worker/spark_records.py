"""A shuffle-plane task's output as Spark records, and a consumer's inputs back from them.

A task's output partitions leave it as records ``(consumer partition,
(producer task, Arrow IPC stream))`` (:func:`output_records`), a few MiB of
Arrow each (:data:`CHUNK_BYTES`); a consumer groups the records it received by
input and producer task (:func:`group_inputs`) and decodes them
(:func:`decode_records`). :mod:`distfusion.runtime.spark.shuffle_plane` moves them
through Spark's shuffle.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from distfusion.stages import BROADCAST, Stage
from distfusion.worker.execute_task import without_views


def partition_stats(stage_id: int, task_index: int, parts) -> dict:
    """``{(stage, task, partition): (rows, Arrow bytes)}`` of one task's output."""
    return {
        (stage_id, task_index, p): (
            sum(b.num_rows for b in batches),
            sum(b.nbytes for b in batches),
        )
        for p, batches in enumerate(parts)
    }


def group_inputs(stage: Stage, records) -> list[list[tuple[int, bytes]]]:
    """Records ``(p, (producer stage, task, ipc))`` -> per input of ``stage``: ``(task, ipc)``s.

    Broadcast inputs get nothing here (they come from their ``Broadcast``).
    """
    by_stage: dict[int, list[tuple[int, bytes]]] = {}
    for _, (sid, task, payload) in records:
        by_stage.setdefault(sid, []).append((task, payload))
    for values in by_stage.values():
        values.sort(key=lambda v: v[0])
    return [
        by_stage.get(inp.stage_id, []) if inp.boundary != BROADCAST else [] for inp in stage.inputs
    ]


def encode_records(batches: list[pa.RecordBatch], compression: str | None) -> pa.Buffer:
    """Batches as one Arrow IPC stream, buffers compressed with ``compression``.

    Returns an Arrow buffer, not ``bytes``: ``to_pybytes()`` was one more copy
    of every byte (~0.7 s/GiB here, docs/spark-data-path.md). A buffer has
    ``len``, pickles as its bytes (protocol 5, PySpark's) and comes back as a
    buffer over them, and ``pa.ipc.open_stream`` reads it without a copy.
    """
    return ipc_stream([without_views(b) for b in batches], compression)


def ipc_stream(batches: list[pa.RecordBatch], compression: str | None) -> pa.Buffer:
    """``batches`` (no view columns) written as one Arrow IPC stream.

    Uncompressed, the stream is measured first (``MockOutputStream`` writes
    nothing) and written once into a buffer of its exact size: a growing
    ``BufferOutputStream`` reallocates and copies as it doubles, and keeps up
    to twice the memory. Compressed, that would compress twice.
    """
    schema = batches[0].schema
    options = pa.ipc.IpcWriteOptions(compression=compression)
    if compression is None:
        mock = pa.MockOutputStream()
        with pa.ipc.new_stream(mock, schema, options=options) as writer:
            for b in batches:
                writer.write_batch(b)
        buf = pa.allocate_buffer(mock.size())
        sink = pa.FixedSizeBufferWriter(buf)
    else:
        sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)
    return buf if compression is None else sink.getvalue()


def decode_records(values: list[tuple[int, bytes]]) -> list[pa.RecordBatch]:
    """Inverse of :func:`encode_records` over the payloads of ``values`` (``(task, ipc)``)."""
    out: list[pa.RecordBatch] = []
    for _, payload in values:
        with pa.ipc.open_stream(payload) as reader:
            out.extend(reader)
    return out


CHUNK_BYTES = 4 * 2**20
"""Default ``chunk_bytes`` of :func:`output_records` (Arrow buffer bytes per record).

The fastest record size through a Spark shuffle: larger records take longer,
smaller ones cost more encoding (docs/spark-data-path.md, "Record size";
``benchmarks/spark_data_path.py``).
"""


def output_records(
    task_index: int,
    parts: list[list[pa.RecordBatch]],
    compression: str | None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[tuple[int, tuple[int, bytes]]]:
    """A task's output as records ``(consumer partition, (task_index, ipc bytes))``.

    Args:
        task_index: the producing task; consumers order payloads by it.
        parts: one list of RecordBatch per output partition (``run_task``'s result).
        compression: Arrow IPC buffer compression (None, ``"lz4"``, ``"zstd"``).
        chunk_bytes: most Arrow buffer bytes (``RecordBatch.nbytes``, before
            IPC compression) per record; IPC framing adds a schema message and
            a header per batch (~1 KiB). A batch larger than this is sliced by
            rows; a single row larger than this travels alone.

    Yields:
        For every non-empty partition ``p``, in order, one or more records
        ``(p, (task_index, ipc))``, each ``ipc`` a complete Arrow IPC stream
        (:func:`encode_records`), in the order of the partition's rows. Spark's shuffle
        keeps the order of one map task's records for a reduce partition, and
        consumers sort payloads by task with a stable sort (:func:`group_inputs`,
        ``_input_values``), so :func:`decode_records` gives the rows back in order.
    """
    for p, batches in enumerate(parts):
        for chunk in record_chunks(batches, chunk_bytes):
            yield p, (task_index, ipc_stream(chunk, compression))


def record_chunks(
    batches: list[pa.RecordBatch], chunk_bytes: int
) -> Iterator[list[pa.RecordBatch]]:
    """``batches`` in consecutive groups of at most ``chunk_bytes`` (``nbytes``) each."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        for piece in _pieces(without_views(batch), chunk_bytes):
            nbytes = piece.nbytes
            if group and size + nbytes > chunk_bytes:
                yield group
                group, size = [], 0
            group.append(piece)
            size += nbytes
    if group:
        yield group


def _pieces(batch: pa.RecordBatch, chunk_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` sliced (zero-copy) by rows into pieces of at most ``chunk_bytes`` each."""
    if batch.nbytes <= chunk_bytes or batch.num_rows <= 1:
        yield batch
        return
    pieces = -(-batch.nbytes // chunk_bytes)
    rows = -(-batch.num_rows // pieces)
    for start in range(0, batch.num_rows, rows):
        yield from _pieces(batch.slice(start, rows), chunk_bytes)
