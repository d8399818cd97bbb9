"""A task's output partitions: readable while written, spilled to Arrow IPC files past a budget.

A worker holds what its tasks produced until the consumer tasks read it (the
exchange buffer). Consumers read a partition as a stream while the task still
writes it (:meth:`TaskOutput.stream`): each batch is readable as soon as the
task added it. Small outputs stay in memory, as lists of batches; once a
task's output passes its budget, or the worker's outputs together pass the
worker's, the partitions are written to Arrow IPC stream files (as Spark writes
its shuffle files) and the batches that follow go straight to the file::

    add(p, batch) ──> in memory ──(held bytes > memory_limit_bytes)──> s1-t0-p<p>.arrow
                         │                                              │ (IPC stream,
    stream(p) <── batch i as soon as it is added: from the list, or ────┘  appended)
                  read from the file (a reader switches when the partition spills)
    finish() / fail(exc): readers end, or raise exc
    free(p) / close(): drop the list, delete the file

A reader waits for the next batch with a condition variable, so a consumer
gets a batch the moment it is added. Batch ``i`` of a partition keeps its
index when the partition spills: a reader that took ``i`` batches from memory
skips ``i`` batches of the file and goes on.

The files are in the query's spill directory
(:class:`~distfusion.worker.memory.SpillDirs`), which the worker deletes when the
query ends, fails or is cancelled, whatever happened to this object.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pyarrow as pa

from distfusion.errors import QueryCancelledError
from distfusion.worker.execute_task import without_views

__all__ = ["TaskOutput"]

_POLL_S = 0.1
"""How often a waiting reader checks its ``cancelled()`` callback, seconds."""


class TaskOutput:
    """The output partitions of one task, in memory or in Arrow IPC files, readable while written.

    Written by the task's thread (:meth:`add`, then :meth:`finish` or
    :meth:`fail`), read by consumers at the same time (:meth:`stream`) or
    afterwards (:meth:`read`); :meth:`spill` and :meth:`free` may run from
    other threads.

    Args:
        num_partitions: output partitions of the task.
        spill_path: ``spill_path(partition)`` is the file a partition spills to
            (its directory exists, or is made by the caller on first call);
            None: never spill.
        memory_limit_bytes: spill once the batches held exceed this many bytes
            (Arrow ``nbytes``); None: only when :meth:`spill` is called.

    Attributes:
        rows: rows of each partition.
        nbytes: Arrow bytes (``RecordBatch.nbytes`` as produced) of each partition.
    """

    def __init__(
        self,
        num_partitions: int,
        spill_path: Callable[[int], str] | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.num_partitions = num_partitions
        self.rows = [0] * num_partitions
        self.nbytes = [0] * num_partitions
        self._spill_path = spill_path
        self._limit = memory_limit_bytes
        self._batches: list[list[pa.RecordBatch]] = [[] for _ in range(num_partitions)]
        self._count = [0] * num_partitions  # batches added to each partition (memory or file)
        self._held = 0
        self._files: dict[int, str] = {}
        self._writers: dict[int, tuple[pa.ipc.RecordBatchStreamWriter, pa.Schema]] = {}
        self._file_bytes = 0
        self._freed: set[int] = set()
        self._finished = False
        self._error: BaseException | None = None
        self._streamed = False
        self._lock = threading.Condition()

    # ------------------------------------------------------------- writing
    def add(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append ``batch`` to ``partition`` (spills everything held when past the limit).

        Readers waiting on the partition get it at once.

        Raises:
            OSError: a spill file cannot be written (disk full).
        """
        if batch.num_rows == 0:
            return
        self.rows[partition] += batch.num_rows
        self.nbytes[partition] += batch.nbytes
        with self._lock:
            if partition in self._freed:  # cancelled meanwhile: nobody reads it
                return
            if partition in self._writers:
                self._write(partition, batch)
                over = False
            else:
                self._batches[partition].append(batch)
                self._held += batch.nbytes
                over = self._limit is not None and self._held > self._limit
            self._count[partition] += 1
            self._lock.notify_all()
        if over:
            self.spill()

    def finish(self) -> None:
        """The task wrote its last batch: close the spill files; readers reach the end."""
        with self._lock:
            self._finished = True
            self._lock.notify_all()
        self._close_writers()

    def fail(self, error: BaseException) -> None:
        """The task failed (or was cancelled): readers raise ``error`` at their next batch."""
        with self._lock:
            if self._error is None:
                self._error = error
            self._lock.notify_all()

    @property
    def streamed(self) -> bool:
        """Whether a reader took a batch already (then :meth:`reset` would lose rows)."""
        return self._streamed

    def _close_writers(self) -> None:
        with self._lock:
            writers, self._writers = self._writers, {}
            for p, (writer, _) in writers.items():
                writer.close()
                path = self._files.get(p)
                if path is not None:
                    self._file_bytes += os.path.getsize(path)

    def reset(self) -> None:
        """Forget everything written (a task attempt that will run again).

        Raises:
            RuntimeError: a reader took batches already (:attr:`streamed`).
        """
        with self._lock:
            if self._streamed:
                msg = "a consumer read this task's output already: it cannot run again"
                raise RuntimeError(msg)
            writers, self._writers = self._writers, {}
            files, self._files = self._files, {}
            for writer, _ in writers.values():
                writer.close()
            for path in files.values():
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            self.rows = [0] * self.num_partitions
            self.nbytes = [0] * self.num_partitions
            self._batches = [[] for _ in range(self.num_partitions)]
            self._count = [0] * self.num_partitions
            self._held = 0
            self._file_bytes = 0
            self._finished = False

    def spill(self) -> int:
        """Write every partition held in memory to its file; the bytes freed.

        A partition spilled while the task still writes keeps its file open
        for the batches that follow. Nothing happens without ``spill_path``.

        Raises:
            OSError: a spill file cannot be written (disk full).
        """
        if self._spill_path is None:
            return 0
        freed = 0
        with self._lock:
            for p in range(self.num_partitions):
                batches = self._batches[p]
                if not batches or p in self._freed:
                    continue
                for b in batches:
                    self._write(p, b)
                freed += sum(b.nbytes for b in batches)
                self._batches[p] = []
            self._held -= freed
        if self._finished:
            self._close_writers()
        return freed

    def _write(self, p: int, batch: pa.RecordBatch) -> None:
        """Append ``batch`` to partition ``p``'s file (opened on first use); lock held."""
        batch = without_views(batch)  # IPC writes only a view array's own bytes
        entry = self._writers.get(p)
        if entry is None:
            if p in self._files:  # spilled and closed before: its batches are read back first
                msg = f"partition {p} was spilled and closed; cannot append"
                raise RuntimeError(msg)
            spill_path = self._spill_path
            assert spill_path is not None  # files are written only by spilling
            path = spill_path(p)
            writer = pa.ipc.new_stream(path, batch.schema)
            entry = (writer, batch.schema)
            self._writers[p] = entry
            self._files[p] = path
        writer, schema = entry
        if not batch.schema.equals(schema):
            batch = pa.Table.from_batches([batch]).cast(schema).to_batches()[0]
        writer.write_batch(batch)

    # ------------------------------------------------------------- reading
    @property
    def held_bytes(self) -> int:
        """Arrow bytes of the batches held in memory now."""
        return self._held

    @property
    def spilled_bytes(self) -> int:
        """Bytes of the closed spill files of this output (their size on disk)."""
        return self._file_bytes

    def is_spilled(self, partition: int) -> bool:
        """Whether ``partition`` lives in a file."""
        return partition in self._files

    def read(self, partition: int) -> list[pa.RecordBatch]:
        """The batches of ``partition`` once the task finished (from memory, or its file).

        Raises:
            KeyError: the partition was freed.
            OSError: its spill file is gone or unreadable.
        """
        with self._lock:
            if partition in self._freed:
                msg = f"partition {partition} was freed"
                raise KeyError(msg)
            path = self._files.get(partition)
            if path is None:
                return list(self._batches[partition])
        return pa.ipc.open_stream(pa.memory_map(path)).read_all().to_batches()

    def stream(
        self,
        partition: int,
        cancelled: Callable[[], bool] = lambda: False,
        timeout_s: float | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The batches of ``partition`` as the task adds them, until it finishes.

        Args:
            partition: the output partition.
            cancelled: checked every 0.1 s while waiting for a batch; true
                raises QueryCancelledError.
            timeout_s: longest wait for one batch (or the end), seconds; None: no limit.

        Raises:
            KeyError: the partition was freed (the query was cancelled).
            QueryCancelledError: ``cancelled()`` became true while waiting.
            TimeoutError: no batch came within ``timeout_s``.
            OSError: its spill file is gone or unreadable.
            Exception: the task's error (:meth:`fail`), at the batch where it failed.
        """
        i = 0
        reader = None
        try:
            while True:
                with self._lock:
                    deadline = None if timeout_s is None else time.monotonic() + timeout_s
                    while True:
                        if self._error is not None:
                            raise self._error
                        if partition in self._freed:
                            msg = f"partition {partition} was freed"
                            raise KeyError(msg)
                        if i < self._count[partition]:
                            break
                        if self._finished:
                            return
                        if cancelled():
                            raise QueryCancelledError("query cancelled")
                        wait_s = _POLL_S
                        if deadline is not None:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                msg = f"no batch of partition {partition} within {timeout_s} s"
                                raise TimeoutError(msg)
                            wait_s = min(wait_s, left)
                        self._lock.wait(wait_s)
                    path = self._files.get(partition)
                    batch = None if path is not None else self._batches[partition][i]
                    self._streamed = True
                if batch is None:  # spilled: read on from the file (its batch i is complete)
                    if reader is None:
                        reader = pa.ipc.open_stream(pa.OSFile(path))
                        for _ in range(i):
                            reader.read_next_batch()
                    batch = reader.read_next_batch()
                i += 1
                yield batch
        finally:
            if reader is not None:
                reader.close()

    def free(self, partition: int) -> None:
        """Drop ``partition``: its batches, or its file (deleted). Idempotent."""
        with self._lock:
            batches = self._batches[partition]
            if batches:
                self._held -= sum(b.nbytes for b in batches)
            self._batches[partition] = []
            self._freed.add(partition)
            path = self._files.pop(partition, None)
            entry = self._writers.pop(partition, None)
            self._lock.notify_all()
        if entry is not None:
            entry[0].close()
        if path is not None:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Free every partition and delete every file. Idempotent."""
        for p in range(self.num_partitions):
            self.free(p)
