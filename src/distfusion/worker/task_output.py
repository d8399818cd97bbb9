"""A task's output partitions: held in memory, spilled to Arrow IPC files past a budget.

A worker holds what its tasks produced until the consumer tasks read it (the
exchange buffer). Small outputs stay in memory, as lists of batches; once a
task's output passes its budget, or the worker's outputs together pass the
worker's, the partitions are written to Arrow IPC files (as Spark writes its
shuffle files) and read back, memory-mapped, when a consumer asks::

    add(p, batch) ──> in memory ──(held bytes > memory_limit_bytes)──> s1-t0-p<p>.arrow
                                                                          │
    read(p) <── the list, or the file's batches (memory-mapped) <─────────┘
    free(p) / close(): drop the list, delete the file

The files are in the query's spill directory
(:class:`~distfusion.worker.memory.SpillDirs`), which the worker deletes when the
query ends, fails or is cancelled, whatever happened to this object.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

from distfusion.worker.execute_task import without_views

__all__ = ["TaskOutput"]


class TaskOutput:
    """The output partitions of one task, in memory or in Arrow IPC files.

    Written by the task's thread (:meth:`add`, then :meth:`finish`), read by
    consumers afterwards (:meth:`read`); :meth:`spill` and :meth:`free` may run
    from other threads.

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
        self._held = 0
        self._files: dict[int, str] = {}
        self._writers: dict[int, tuple[pa.ipc.RecordBatchFileWriter, pa.Schema]] = {}
        self._file_bytes = 0
        self._freed: set[int] = set()
        self._finished = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------- writing
    def add(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append ``batch`` to ``partition`` (spills everything held when past the limit).

        Raises:
            OSError: a spill file cannot be written (disk full).
        """
        if batch.num_rows == 0:
            return
        self.rows[partition] += batch.num_rows
        self.nbytes[partition] += batch.nbytes
        with self._lock:
            if partition in self._writers:
                self._write(partition, batch)
                return
            self._batches[partition].append(batch)
            self._held += batch.nbytes
            over = self._limit is not None and self._held > self._limit
        if over:
            self.spill()

    def finish(self) -> None:
        """The task wrote its last batch: close the spill files (complete and readable now)."""
        self._finished = True
        self._close_writers()

    def _close_writers(self) -> None:
        with self._lock:
            writers, self._writers = self._writers, {}
            for p, (writer, _) in writers.items():
                writer.close()
                self._file_bytes += os.path.getsize(self._files[p])

    def reset(self) -> None:
        """Forget everything written (a task attempt that will run again)."""
        self.close()
        with self._lock:
            self.rows = [0] * self.num_partitions
            self.nbytes = [0] * self.num_partitions
            self._batches = [[] for _ in range(self.num_partitions)]
            self._held = 0
            self._file_bytes = 0
            self._freed = set()
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
                if not batches:
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
            path = self._spill_path(p)
            writer = pa.ipc.new_file(path, batch.schema)
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
        """The batches of ``partition`` (from memory, or its file memory-mapped).

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
        reader = pa.ipc.open_file(pa.memory_map(path))
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]

    def iter_read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """:meth:`read` as an iterator."""
        return iter(self.read(partition))

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

    def to_lists(self) -> list[list[pa.RecordBatch]]:
        """Every partition as a list of batches (reads the files back)."""
        return [self.read(p) for p in range(self.num_partitions)]
