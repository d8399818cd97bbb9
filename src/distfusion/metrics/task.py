"""What one task did: measured where it runs, returned with its output.

A :class:`TaskMeter` wraps one run of a fragment (a task on a worker, or the
head stage on the coordinator)::

    meter = TaskMeter(stage_id, task_index, worker)
    read = meter.reading(read_input)          # times and counts every input read
    ... execute DataFrames, meter.executed(df) for each ...
    metrics = meter.finish(partitions)        # TaskMetrics

Everything it measures is already at hand or cheap: two clocks per task and
per input read, ``RecordBatch.num_rows``/``nbytes`` of what the task reads and
writes (the worker counts its output anyway), and DataFusion's own operator
metrics of the executed physical plan (``ExecutionPlan.metrics()`` on each
node: DataFusion keeps them while it runs). Nothing is sent by the meter: each
runtime carries the :class:`TaskMetrics` back with what it returns already
(docs/observability.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pyarrow as pa

__all__ = ["OperatorMetrics", "TaskMeter", "TaskMetrics", "operator_metrics"]


@dataclass(frozen=True)
class OperatorMetrics:
    """DataFusion's metrics of one physical operator of a task's fragment.

    Attributes:
        operator: the operator as DataFusion displays it on one line
            (``FilterExec: c3@3 > 10``).
        depth: nesting depth in the physical plan (0: the root).
        output_rows: rows the operator produced, summed over its DataFusion
            partitions; None when it records none.
        elapsed_compute_s: seconds of CPU DataFusion spent inside the operator
            (its ``elapsed_compute``, summed over partitions); None when not recorded.
        spilled_bytes: bytes the operator spilled to disk; None when not recorded.
        bytes_scanned: bytes a data source read (Parquet's ``bytes_scanned``);
            None for other operators.
    """

    operator: str
    depth: int
    output_rows: int | None = None
    elapsed_compute_s: float | None = None
    spilled_bytes: int | None = None
    bytes_scanned: int | None = None


@dataclass(frozen=True)
class TaskMetrics:
    """What one task did, measured where it ran.

    Attributes:
        stage_id: the task's stage.
        task_index: the task's index in its stage.
        worker: URL (or name) of the worker that ran it; ``coordinator`` for
            the head stage.
        partition_rows: rows of each output partition.
        partition_bytes: Arrow bytes (``RecordBatch.nbytes``) of each output partition.
        elapsed_s: wall seconds from the task's start to its output being ready.
        cpu_s: CPU seconds: the task thread's own (``time.thread_time``:
            reading inputs, partitioning, Python) plus DataFusion's
            ``elapsed_compute`` summed over the operators (its threads).
        input_wait_s: wall seconds spent reading inputs from producer tasks
            (waiting for them, moving and decoding the batches).
        input_rows: rows read of each input of the stage (``Stage.inputs`` order).
        input_bytes: Arrow bytes read of each input of the stage.
        source_bytes: bytes read from source files (DataFusion's
            ``bytes_scanned``), else the size of the work units read; 0 for
            a task reading no source.
        spilled_bytes: bytes DataFusion spilled to disk, all operators.
        operators: the physical plan the task ran, root first, with each
            operator's metrics (several plans in a row for a task run once per
            chunk of a work unit feed: the last one).
        memory_retries: how the task ran again after going over its memory
            budget, in order (``"sort-merge joins"``, ``"unbounded"``:
            :mod:`distfusion.worker.memory_retry`); empty: it ran once.
    """

    stage_id: int
    task_index: int
    worker: str
    partition_rows: tuple[int, ...] = ()
    partition_bytes: tuple[int, ...] = ()
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    input_wait_s: float = 0.0
    input_rows: tuple[int, ...] = ()
    input_bytes: tuple[int, ...] = ()
    source_bytes: int = 0
    spilled_bytes: int = 0
    operators: tuple[OperatorMetrics, ...] = field(default=(), repr=False)
    memory_retries: tuple[str, ...] = ()

    @property
    def output_rows(self) -> int:
        """Rows of the whole output."""
        return sum(self.partition_rows)

    @property
    def output_bytes(self) -> int:
        """Arrow bytes of the whole output."""
        return sum(self.partition_bytes)

    def to_dict(self) -> dict:
        """The metrics as JSON-able data (:meth:`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TaskMetrics:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError, TypeError: ``d`` is not a task's metrics.
        """
        d = dict(d)
        d["operators"] = tuple(OperatorMetrics(**o) for o in d.get("operators", ()))
        names = ("partition_rows", "partition_bytes", "input_rows", "input_bytes", "memory_retries")
        for name in names:
            d[name] = tuple(d.get(name, ()))
        return cls(**d)


def _walk(node, depth: int, out: list[OperatorMetrics]) -> None:
    ms = node.metrics()
    if ms is None:
        out.append(OperatorMetrics(node.display(), depth))
    else:
        compute = ms.elapsed_compute
        out.append(
            OperatorMetrics(
                node.display(),
                depth,
                ms.output_rows,
                None if compute is None else compute / 1e9,
                ms.spilled_bytes,
                ms.sum_by_name("bytes_scanned"),
            )
        )
    for child in node.children():
        _walk(child, depth + 1, out)


def operator_metrics(df) -> tuple[OperatorMetrics, ...]:
    """The physical plan ``df`` (a ``datafusion.DataFrame``) ran, with each operator's metrics.

    DataFusion 55 keeps the plan a DataFrame executed: ``df.execution_plan()``
    after ``execute_stream`` is that plan, its metrics filled in. Called
    before ``df`` ran, it plans ``df`` (no metrics).

    Returns:
        One entry per operator, root first (depth-first, children in order).
    """
    out: list[OperatorMetrics] = []
    _walk(df.execution_plan(), 0, out)
    return tuple(out)


class TaskMeter:
    """Measures one task run (see the module's docstring).

    Args:
        stage_id: the task's stage.
        task_index: the task's index.
        worker: who runs it (URL or ``coordinator``).
        num_inputs: inputs of the stage (for :attr:`TaskMetrics.input_rows`).
        unit_bytes: bytes of the work units the task reads (used for
            ``source_bytes`` when DataFusion reports no ``bytes_scanned``).
        operators: walk the executed plans for DataFusion's operator metrics
            (``operators``, and the compute, spill and scan figures summed
            from them); False: the task's own clocks and sizes only.
    """

    def __init__(
        self,
        stage_id: int,
        task_index: int,
        worker: str,
        num_inputs: int,
        unit_bytes: int = 0,
        operators: bool = True,
    ) -> None:
        self.stage_id = stage_id
        self.task_index = task_index
        self.worker = worker
        self.unit_bytes = unit_bytes
        self.input_rows = [0] * num_inputs
        self.input_bytes = [0] * num_inputs
        self.input_wait_s = 0.0
        self.frames: list = []
        self.operators = operators
        self.memory_retries: list[str] = []
        self._start = time.perf_counter()
        self._cpu = time.thread_time()

    def reading(
        self, read_input: Callable[[int], list[pa.RecordBatch]]
    ) -> Callable[[int], list[pa.RecordBatch]]:
        """``read_input`` timed, its batches counted per input."""

        def read(i: int) -> list[pa.RecordBatch]:
            start = time.perf_counter()
            batches = read_input(i)
            self.input_wait_s += time.perf_counter() - start
            if 0 <= i < len(self.input_rows):
                self.input_rows[i] += sum(b.num_rows for b in batches)
                self.input_bytes[i] += sum(b.nbytes for b in batches)
            return batches

        return read

    def count_input(self, i: int, batch: pa.RecordBatch, waited_s: float = 0.0) -> None:
        """Count ``batch`` of input ``i``, pulled as a stream after ``waited_s`` seconds."""
        self.input_wait_s += waited_s
        if 0 <= i < len(self.input_rows):
            self.input_rows[i] += batch.num_rows
            self.input_bytes[i] += batch.nbytes

    def ran_again(self, how: str) -> None:
        """Record that the task runs again over its memory budget, ``how`` (``"unbounded"``)."""
        self.memory_retries.append(how)

    def executed(self, df) -> None:
        """Record that DataFrame ``df`` is (being) executed by this task."""
        if self.operators:
            self.frames.append(df)

    def finish(
        self,
        partitions: list[list[pa.RecordBatch]] | None = None,
        rows: int = 0,
        nbytes: int = 0,
        sizes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> TaskMetrics:
        """The task's metrics, now that its output is complete.

        Args:
            partitions: the output, one list of batches per partition; None
                when it was streamed away (the head stage) or written to a
                sink: ``sizes``, else ``rows`` and ``nbytes``, give its size.
            rows: rows streamed (with ``partitions`` and ``sizes`` None).
            nbytes: Arrow bytes streamed (with ``partitions`` and ``sizes`` None).
            sizes: ``(rows, Arrow bytes)`` per output partition, when the
                output went to a sink (a worker's spillable task output).
        """
        elapsed = time.perf_counter() - self._start
        own_cpu = time.thread_time() - self._cpu
        operators: tuple[OperatorMetrics, ...] = ()
        compute = spilled = scanned = 0.0
        seen_scan = False
        for df in self.frames:
            try:
                ops = operator_metrics(df)
            except Exception:  # DataFusion's: metrics are never worth failing a task
                continue
            operators = ops
            for op in ops:
                compute += op.elapsed_compute_s or 0.0
                spilled += op.spilled_bytes or 0
                if op.bytes_scanned is not None:
                    seen_scan = True
                    scanned += op.bytes_scanned
        if partitions is not None:
            p_rows = tuple(sum(b.num_rows for b in p) for p in partitions)
            p_bytes = tuple(sum(b.nbytes for b in p) for p in partitions)
        elif sizes is not None:
            p_rows, p_bytes = tuple(sizes[0]), tuple(sizes[1])
        else:
            p_rows, p_bytes = (rows,), (nbytes,)
        return TaskMetrics(
            stage_id=self.stage_id,
            task_index=self.task_index,
            worker=self.worker,
            partition_rows=p_rows,
            partition_bytes=p_bytes,
            elapsed_s=elapsed,
            cpu_s=own_cpu + compute,
            input_wait_s=self.input_wait_s,
            input_rows=tuple(self.input_rows),
            input_bytes=tuple(self.input_bytes),
            source_bytes=int(scanned) if seen_scan else self.unit_bytes,
            spilled_bytes=int(spilled),
            operators=operators,
            memory_retries=tuple(self.memory_retries),
        )
