"""The Spark runtime: a stage graph runs as RDD transformations on a SparkSession.

Every non-head stage becomes one RDD whose partition *i* is task *i* of the
stage. A task's output leaves it as records ``(consumer partition, (producer
task, Arrow IPC bytes))``, one record per non-empty output partition:

```
 Stage 1 (leaf, 4 tasks)      sc.parallelize(range(4), 4)
                                .mapPartitionsWithIndex(run task i)      -> records (p, ipc)
 Stage 2 (2 tasks)            union(stage 1 records tagged with input 0
                                        .partitionBy(2, identity),        <- Spark shuffle
                                    stage 3 records tagged with input 1
                                        .partitionBy(2, identity))
                                .mapPartitionsWithIndex(run task i)
 broadcast input              stage records .collect() -> sc.broadcast(...)
                                (a one-task stage runs on the driver instead)
 Stage 4 (head, 1 task)       union(inputs).collect() on the driver, fragment run
                                here, batches streamed to the caller
```

The identity partitioner sends the record for partition *p* to consumer task
*p*, so consumer task *i* receives exactly partition *i* of every producer
task, as the stage graph requires. PySpark has no ``zipPartitions``: a stage
with several shuffled inputs unions its inputs after each is partitioned by
the same partitioner (Spark's ``PartitionerAwareUnionRDD``), each record tagged
with its input's index. Spark does the scheduling, the retries of
failed task attempts and the shuffle storage; distfusion executes each task's
fragment natively with DataFusion inside the Spark task
(:func:`distfusion.worker.execute_task.run_task`).

Errors raised inside a Spark task reach the driver as a Java exception
holding the Python traceback as text. The task therefore reports a failure as
one line, ``DISTFUSION_TASK_ERROR {json}``, which the driver turns back into a
:class:`~distfusion.errors.TaskError` naming the stage and the task.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import sys
import traceback
from collections.abc import Iterator

import pyarrow as pa

from distfusion.errors import PlanningError, TaskError, TransportError
from distfusion.resolver import SparkWorkerResolver
from distfusion.runtime.base import default_target_partitions, task_threads
from distfusion.stages import BROADCAST, Stage, StageGraph, StageInput
from distfusion.worker.execute_task import without_views

__all__ = [
    "SparkRuntime",
    "FAIL_TASK_PROPERTY",
    "import_pyspark",
    "job_group",
    "with_local_retries",
]

ERROR_MARKER = "DISTFUSION_TASK_ERROR "
"""Prefix of the one-line error report a failed Spark task raises."""

FAIL_TASK_PROPERTY = "distfusion.test.failTask"
"""Spark local property read inside every task, for fault-injection tests.

Value ``"STAGE:TASK:ATTEMPTS"``: task TASK of stage STAGE raises on its first
ATTEMPTS attempts (``always`` for every attempt). Set it on the driver with
``spark.sparkContext.setLocalProperty(FAIL_TASK_PROPERTY, "1:0:1")``; Spark
sends local properties with every task of the jobs started from that thread.
"""

_LOCAL_MASTER = re.compile(r"^local\[(\d+|\*)\]$")
_MISSING_MODULE = re.compile(r"No module named '(distfusion|datafusion|pyarrow)[^']*'")


def import_pyspark():
    """Import and return the ``pyspark`` package.

    Raises:
        ImportError: pyspark is not installed; says what to install.
    """
    try:
        import pyspark
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        msg = (
            "the Spark runtime needs pyspark: pip install 'distfusion[spark]' "
            "(or pip install pyspark), or use LocalRuntime()"
        )
        raise ImportError(msg) from exc
    return pyspark


def with_local_retries(master: str, task_max_failures: int) -> str:
    """``local[N]`` -> ``local[N,F]``: Spark's local mode retries a task only when F > 1."""
    m = _LOCAL_MASTER.match(master.replace(" ", ""))
    if m is None or task_max_failures <= 1:
        return master
    return f"local[{m.group(1)},{task_max_failures}]"


class SparkRuntime:
    """Runs stage graphs on Spark: each stage is an RDD, each task a Spark task.

    Args:
        spark: the SparkSession to use; when None, an embedded session is started
            (or the active one reused) with ``master``, the Spark UI off and
            ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` defaulting to this
            interpreter, so executors import the same distfusion and datafusion.
        master: Spark master URL for the embedded session (``local[*]``,
            ``local[2]``, ``spark://host:7077``, ...). In local mode Spark retries
            nothing unless the master says so, so ``local[N]`` becomes
            ``local[N,task_max_failures]``: an embedded session retries failed
            task attempts as a cluster would.
        target_partitions: cores of one executor (default: the driver's cores);
            the concurrent tasks of a stage share them (DataFusion partitions
            per task = ``target_partitions // tasks``, at least 1).
        compression: Arrow IPC buffer compression for stage outputs: None
            (default), ``"lz4"`` or ``"zstd"``. Spark already compresses shuffle
            blocks and broadcasts (LZ4 by default); compressing the IPC buffers
            as well cost 3-6% on the TPC-H SF1 queries moving the most bytes
            (Q3, Q5, Q8, Q9, Q10, Q18, Q21 on ``local[2]``, two runs).
        task_max_failures: attempts per task before the query fails (Spark's
            ``spark.task.maxFailures``, default 4).
        conf: more Spark settings for the embedded session, e.g.
            ``{"spark.driver.memory": "8g"}``.
        progress: show Spark's console progress bar (embedded session only).
        executor_wait_s: for a cluster master, seconds to wait at start for a
            first executor to register.

    Raises:
        ImportError: pyspark is not installed.
        PlanningError: a cluster master has no executor after ``executor_wait_s``.
    """

    name = "spark"
    bytes_per_task = 64 * 1024 * 1024
    """Default input bytes per task (``DistributedConfig.bytes_per_task``).

    A Spark task with a Python worker costs ~0.1 s to schedule, start and
    return, about what DataFusion needs for 50 MB of TPC-H rows here; at 16
    MiB per task TPC-H SF1 ran 2.6x single-node DataFusion, at 64 MiB 2.3x
    (same run, ``local[2]``). Spark SQL reads files in 128 MiB splits
    (``spark.sql.files.maxPartitionBytes``) and aims post-shuffle partitions
    at 64 MiB (``spark.sql.adaptive.advisoryPartitionSizeInBytes``).
    """

    def __init__(
        self,
        spark=None,
        master: str = "local[*]",
        target_partitions: int | None = None,
        compression: str | None = None,
        task_max_failures: int = 4,
        conf: dict[str, str] | None = None,
        progress: bool = False,
        executor_wait_s: float = 60.0,
    ) -> None:
        import_pyspark()
        from pyspark.sql import SparkSession

        self._owns_session = False
        if spark is None:
            active = SparkSession.getActiveSession()
            if active is not None:
                spark = active
            else:
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
                os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
                settings = {
                    "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "true" if progress else "false",
                    "spark.driver.memory": "4g",
                    "spark.task.maxFailures": str(task_max_failures),
                    "spark.sql.execution.arrow.pyspark.enabled": "true",
                    "spark.sql.session.timeZone": "UTC",
                    # Unix sockets to the Python workers: no TCP delayed-ACK
                    # stalls; ~40 ms less per Spark task here.
                    "spark.python.unix.domain.socket.enabled": "true",
                    **(conf or {}),
                }
                builder = SparkSession.builder.master(
                    with_local_retries(master, task_max_failures)
                ).appName("distfusion")
                for key, value in settings.items():
                    builder = builder.config(key, value)
                spark = builder.getOrCreate()
                spark.sparkContext.setLogLevel("ERROR")
                self._owns_session = True
        self.spark = spark
        self.sc = spark.sparkContext
        self.resolver = SparkWorkerResolver(self.sc)
        self.target_partitions = target_partitions or default_target_partitions()
        self.compression = compression
        self._held: dict[str, int] = {}  # query id -> bytes of stage outputs on the driver
        if not self.sc.master.startswith("local"):
            self.resolver.wait_for_executors(1, executor_wait_s)

    def num_workers(self) -> int:
        """Task slots of the Spark application (local mode: one per core).

        Raises:
            PlanningError: Spark reports no executor.
        """
        n = len(self.resolver.get_urls())
        if n == 0:
            msg = f"the Spark application at {self.sc.master} has no executor"
            raise PlanningError(msg)
        return n

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """Run ``graph`` on Spark; yields the head stage's batches.

        The non-head stages run as Spark jobs started from the driver (one per
        broadcast input, one collecting the head stage's inputs); the head stage
        then runs here. Closing the iterator early, or an error, cancels the
        query's Spark job group.

        Raises:
            TaskError: a task failed on every attempt Spark made (names the stage,
                the task and the executor; carries the remote traceback), or the
                head stage failed on the driver.
            TransportError: Spark failed the job for another reason (an executor
                lost, the session stopped).
        """
        return _SparkQuery(self, graph).run()

    def stats(self) -> dict[str, dict]:
        """Live tasks and bytes held for queries, under the Spark master's URL.

        ``live_tasks``: Spark tasks running in stages of this application now;
        ``bytes_held``: bytes of stage outputs a query still holds on the driver
        (broadcast inputs, the head stage's inputs). Both are zero between queries.
        """
        tracker = self.sc.statusTracker()
        live = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            live += info.numActiveTasks if info is not None else 0
        return {self.sc.master: {"live_tasks": live, "bytes_held": sum(self._held.values())}}

    def close(self) -> None:
        """Stop the SparkSession when this runtime started it."""
        if self._owns_session:
            self.spark.stop()
            self._owns_session = False

    def __repr__(self) -> str:
        return f"SparkRuntime(master={self.sc.master!r}, workers={len(self.resolver.get_urls())})"


def job_group(query_id: str) -> str:
    """The Spark job group of query ``query_id`` (every Spark job of the query runs in it)."""
    return f"distfusion-{query_id}"


class _SparkQuery:
    """One execution of a stage graph on Spark (driver side)."""

    def __init__(self, runtime: SparkRuntime, graph: StageGraph) -> None:
        self.runtime = runtime
        self.sc = runtime.sc
        self.graph = graph
        self.group = job_group(graph.query_id)
        self.rdds: dict[int, object] = {}  # stage id -> RDD of (partition, (task, ipc))
        self.broadcasts: dict[int, object] = {}  # stage id -> Broadcast of [(task, ipc)]
        # Stage id -> its output on the driver: [(partition, task, ipc)], every partition.
        self.values: dict[int, list[tuple[int, int, bytes]]] = {}
        self.on_driver: set[int] = set()  # stages run here rather than on Spark
        self.persisted: list = []
        self.uses = _uses(graph)

    # ------------------------------------------------------------------ driver
    def run(self) -> Iterator[pa.RecordBatch]:
        from distfusion.worker.execute_task import stream_head_stage
        from distfusion.worker.task_plan import TaskPlan

        sc = self.sc
        finished = False
        sc.setJobGroup(self.group, f"distfusion query {self.graph.query_id[:8]}", True)
        try:
            head = self.graph.head
            self._collect_broadcasts()
            self._collect([i.stage_id for i in head.inputs])
            inputs = [self._input_values(inp) for inp in head.inputs]
            plan = TaskPlan.for_task(
                self.graph.query_id,
                head,
                0,
                _dummy_workers(head, self.graph),
                self.runtime.target_partitions,
            )
            yield from stream_head_stage(plan, lambda i: _decode(inputs[i]))
            finished = True
        finally:
            if not finished:
                sc.cancelJobGroup(self.group)
            for b in self.broadcasts.values():
                b.destroy()
            for rdd in self.persisted:
                rdd.unpersist()
            self.runtime._held.pop(self.graph.query_id, None)
            sc.setLocalProperty("spark.jobGroup.id", None)

    def _collect(self, stage_ids: list[int]) -> None:
        """Bring the outputs of ``stage_ids`` to the driver (``self.values``), in one Spark job.

        Outputs already here (a broadcast collected for another consumer, a
        stage run here) are not collected again, nor is a stage listed twice.
        """
        wanted = [sid for sid in dict.fromkeys(stage_ids) if sid not in self.values]
        if not wanted:
            return
        parts = [
            self._stage_rdd(sid).map(lambda r, sid=sid: (sid, r[0], r[1][0], r[1][1]))
            for sid in wanted
        ]
        union = parts[0] if len(parts) == 1 else self.sc.union(parts)
        for sid in wanted:
            self.values[sid] = []
        for sid, p, task, ipc in self._spark_call(union.collect):
            self.values[sid].append((p, task, ipc))
        for sid in wanted:
            self._hold(sum(len(v[2]) for v in self.values[sid]))

    def _input_values(self, inp: StageInput) -> list[tuple[int, bytes]]:
        """``(task, ipc)`` of what a one-task consumer reads of ``inp``, by producer task."""
        mine = inp.partitions_for(0)
        values = [(t, ipc) for p, t, ipc in self.values[inp.stage_id] if p in mine]
        return sorted(values, key=lambda v: v[0])

    def _hold(self, nbytes: int) -> None:
        held = self.runtime._held
        held[self.graph.query_id] = held.get(self.graph.query_id, 0) + nbytes

    def _spark_call(self, action):
        """Run a Spark action; failures become distfusion errors."""
        try:
            return action()
        except Exception as exc:
            raise _translate_error(exc, self.sc.master) from exc

    def _stage_rdd(self, stage_id: int):
        """The RDD of ``stage_id``'s output records, built once per query."""
        if stage_id in self.rdds:
            return self.rdds[stage_id]
        if stage_id in self.on_driver:  # run on the driver; a consumer reads it through Spark
            records = [(p, (t, ipc)) for p, t, ipc in self.values[stage_id]]
            rdd = self.sc.parallelize(records, 1)
            self.rdds[stage_id] = rdd
            return rdd
        stage = self.graph.stage(stage_id)
        shuffled = [(i, inp) for i, inp in enumerate(stage.inputs) if inp.boundary != BROADCAST]
        broadcast = {
            i: self.broadcasts[inp.stage_id]
            for i, inp in enumerate(stage.inputs)
            if inp.boundary == BROADCAST
        }
        if shuffled:
            # Each input is tagged and partitioned on its own, inside the
            # producer's Python worker; the union of RDDs with one partitioner
            # is Spark's PartitionerAwareUnionRDD: partition i holds partition
            # i of every input. (A union before partitionBy would run the
            # partitioning in a second Python worker per task.)
            # The partitioners are equal when their functions are one object
            # (a lambda, so executors unpickle it without importing distfusion).
            n = stage.num_tasks
            identity = lambda p: p  # noqa: E731
            parts = [
                self._stage_rdd(inp.stage_id)
                .map(lambda r, i=i: (r[0], (i,) + r[1]))
                .partitionBy(n, identity)
                for i, inp in shuffled
            ]
            base = parts[0] if len(parts) == 1 else self.sc.union(parts)
            if base.getNumPartitions() != n:  # not co-partitioned: would lose rows
                msg = f"stage {stage_id}: Spark did not co-partition its {len(parts)} inputs"
                raise PlanningError(msg)
        else:
            base = self.sc.parallelize(range(stage.num_tasks), stage.num_tasks)
        fn = _task_function(
            self.graph.query_id,
            stage_id,
            pickle.dumps(stage),
            bool(shuffled),
            broadcast,
            task_threads(
                self.runtime.target_partitions, stage.num_tasks, self.runtime.target_partitions
            ),
            self.runtime.compression,
        )
        rdd = base.mapPartitionsWithIndex(fn)
        rdd.setName(f"distfusion {self.graph.query_id[:8]} stage {stage_id}")
        if self.uses.get(stage_id, 0) > 1:
            rdd.persist()
            self.persisted.append(rdd)
        self.rdds[stage_id] = rdd
        return rdd

    def _collect_broadcasts(self) -> None:
        """Collect every broadcast stage output on the driver and ``sc.broadcast`` it.

        One Spark job per round: a round collects every broadcast whose producer
        needs no broadcast of a later round (``_rounds``), as a union tagged with
        the producer's stage id, so independent broadcasts run side by side.
        A one-task producer runs on the driver instead (:meth:`_run_on_driver`);
        the same job collects its inputs that Spark produces.
        """
        for round_ in _rounds(self.graph):
            here = [sid for sid in round_ if self.graph.stage(sid).num_tasks == 1]
            # Inputs of stages run here come in the same job, unless run here
            # earlier in the round (stage ids are in producer order).
            inputs = [i.stage_id for sid in here for i in self.graph.stage(sid).inputs]
            self._collect([sid for sid in round_ + inputs if sid not in here])
            for sid in here:
                self._run_on_driver(self.graph.stage(sid))
            for sid in round_:
                values = [(t, ipc) for _, t, ipc in self.values[sid]]
                self.broadcasts[sid] = self.sc.broadcast(values)

    def _run_on_driver(self, stage: Stage) -> None:
        """Run one-task broadcast ``stage`` here; its output goes to ``self.values``.

        As a Spark job it would pay a job's scheduling (~0.15 s) to use one
        executor core; here it runs at once with every driver core, as the head
        stage does. Its inputs are on the driver already (``self.values``).

        Raises:
            TaskError: the fragment failed (worker ``spark-driver://HOST``).
        """
        from distfusion.worker.execute_task import run_task
        from distfusion.worker.task_plan import TaskPlan

        plan = TaskPlan.for_task(
            self.graph.query_id,
            stage,
            0,
            _dummy_workers(stage, self.graph),
            self.runtime.target_partitions,
        )
        inputs = [self._input_values(i) for i in stage.inputs]
        worker = f"spark-driver://{socket.gethostname()}"
        parts = run_task(plan, lambda i: _decode(inputs[i]), worker=worker)
        self.values[stage.stage_id] = [
            (p, 0, _encode(batches, self.runtime.compression))
            for p, batches in enumerate(parts)
            if batches
        ]
        self.on_driver.add(stage.stage_id)
        self._hold(sum(len(v[2]) for v in self.values[stage.stage_id]))


def _rounds(graph: StageGraph) -> list[list[int]]:
    """Broadcast producers grouped by collection round, earliest first.

    ``depth(s)`` is how many rounds must finish before stage *s* can run: the
    largest, over its inputs, of the input's depth plus one for a broadcast
    input. A broadcast producer is collected in round ``depth(producer)``.
    """
    depth: dict[int, int] = {}
    for s in graph.stages:  # producers first
        depth[s.stage_id] = max(
            (depth[i.stage_id] + (1 if i.boundary == BROADCAST else 0) for i in s.inputs), default=0
        )
    producers = sorted(
        {i.stage_id for s in graph.stages for i in s.inputs if i.boundary == BROADCAST}
    )
    rounds: dict[int, list[int]] = {}
    for sid in producers:
        rounds.setdefault(depth[sid], []).append(sid)
    return [rounds[d] for d in sorted(rounds)]


def _uses(graph: StageGraph) -> dict[int, int]:
    """How many times each stage's output RDD is read by a consumer.

    The head stage collects a producer once however many of its inputs read it.
    """
    uses: dict[int, int] = {}
    for s in graph.stages:
        read = {i.stage_id for i in s.inputs} if s is graph.head else [i.stage_id for i in s.inputs]
        for sid in read:
            uses[sid] = uses.get(sid, 0) + 1
    return uses


def _dummy_workers(stage: Stage, graph: StageGraph) -> tuple[tuple[str, ...], ...]:
    """Input worker URLs of a task plan; Spark places tasks, so they name only the stage."""
    return tuple(
        tuple(
            f"spark://stage-{inp.stage_id}/task-{j}"
            for j in range(graph.stage(inp.stage_id).num_tasks)
        )
        for inp in stage.inputs
    )


def _group_inputs(num_inputs: int, records) -> list[list[tuple[int, bytes]]]:
    """Records ``(p, (input, task, ipc))`` -> per input, ``(task, ipc)`` sorted by task."""
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(num_inputs)]
    for _, (i, task, payload) in records:
        out[i].append((task, payload))
    for values in out:
        values.sort(key=lambda v: v[0])
    return out


def _encode(batches: list[pa.RecordBatch], compression: str | None) -> bytes:
    """Batches as one Arrow IPC stream, buffers compressed with ``compression``."""
    batches = [without_views(b) for b in batches]
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


def _decode(values: list[tuple[int, bytes]]) -> list[pa.RecordBatch]:
    """Inverse of :func:`_encode` over the payloads of ``values`` (``(task, ipc)``)."""
    out: list[pa.RecordBatch] = []
    for _, payload in values:
        with pa.ipc.open_stream(payload) as reader:
            out.extend(reader)
    return out


# ---------------------------------------------------------------------- executor side
def _task_function(
    query_id, stage_id, stage_bytes, shuffled, broadcast, target_partitions, compression
):
    """The function Spark ships to the executors for one stage.

    It is a closure, so cloudpickle ships it by value, and it refers to nothing
    of distfusion until it runs: an executor that cannot import distfusion or
    datafusion then fails with a message saying so, naming the stage and task,
    instead of failing to unpickle the task.
    """

    def run(task_index, records):
        try:
            import distfusion.runtime.spark as spark_runtime
        except ImportError as exc:
            import json as _json
            import os as _os
            import socket as _socket

            report = {
                "stage": stage_id,
                "task": task_index,
                "worker": f"spark-executor://{_socket.gethostname()}/pid{_os.getpid()}",
                "cause": (
                    f"ImportError: {exc} -- the Spark executors need distfusion and datafusion "
                    "in their Python environment (same venv via PYSPARK_PYTHON, "
                    "spark.archives with a packed venv, or --py-files; see the README)"
                ),
                "traceback": "",
            }
            raise RuntimeError("DISTFUSION_TASK_ERROR " + _json.dumps(report)) from None
        return spark_runtime._run_task(
            query_id,
            stage_bytes,
            task_index,
            records,
            shuffled,
            broadcast,
            target_partitions,
            compression,
        )

    return run


def _run_task(
    query_id, stage_bytes, task_index, records, shuffled, broadcast, target_partitions, compression
):
    """Run task ``task_index`` of the pickled stage inside a Spark task.

    Yields records ``(consumer partition, (task_index, ipc bytes))``, one per
    non-empty output partition.

    Raises:
        RuntimeError: the task failed; its message is ``DISTFUSION_TASK_ERROR``
            followed by a JSON report (stage, task, worker, cause, traceback).
    """
    from distfusion.worker.execute_task import run_task, task_error
    from distfusion.worker.task_plan import TaskPlan

    stage: Stage = pickle.loads(stage_bytes)
    worker = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    plan = None
    try:
        plan = TaskPlan.for_task(query_id, stage, task_index, (), target_partitions)
        _maybe_inject_failure(stage.stage_id, task_index)
        # Drain the input even when the stage reads none (a leaf reads its task
        # index): PySpark reuses a Python worker only after its task read the
        # whole input, and a fresh worker costs ~1 s of imports and zip scans.
        records = list(records)
        inputs = _group_inputs(len(stage.inputs), records if shuffled else ())
        for i, bc in broadcast.items():
            inputs[i] = sorted(bc.value, key=lambda v: v[0])
        parts = run_task(plan, lambda i: _decode(inputs[i]), worker=worker)
        out = [
            (p, (task_index, _encode(batches, compression)))
            for p, batches in enumerate(parts)
            if batches
        ]
    except TaskError as err:
        raise RuntimeError(ERROR_MARKER + _report(err)) from None
    except Exception as exc:
        if plan is None:
            err = TaskError(
                stage.stage_id,
                task_index,
                worker,
                f"{type(exc).__name__}: {exc}",
                "".join(traceback.format_exception(exc)),
            )
        else:
            err = task_error(plan, worker, exc)
        raise RuntimeError(ERROR_MARKER + _report(err)) from None
    return iter(out)


def _maybe_inject_failure(stage_id: int, task_index: int) -> None:
    """Raise when :data:`FAIL_TASK_PROPERTY` names this task and attempt (tests only)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    spec = ctx.getLocalProperty(FAIL_TASK_PROPERTY) if ctx is not None else None
    if not spec:
        return
    s, t, attempts = spec.split(":")
    if int(s) != stage_id or int(t) != task_index:
        return
    if attempts == "always" or ctx.attemptNumber() < int(attempts):
        msg = f"injected failure ({FAIL_TASK_PROPERTY}={spec}, attempt {ctx.attemptNumber()})"
        raise RuntimeError(msg)


def _report(err: TaskError) -> str:
    """``err`` as the JSON report of :data:`ERROR_MARKER`, with Spark's attempt count."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return json.dumps(
        {
            "stage": err.stage_id,
            "task": err.task_index,
            "worker": err.worker,
            "cause": err.cause,
            "traceback": err.remote_traceback,
            "attempts": ctx.attemptNumber() + 1 if ctx is not None else 1,
        }
    )


# ---------------------------------------------------------------------- driver side errors
def _translate_error(exc: Exception, master: str) -> Exception:
    """A failed Spark action as a distfusion error.

    Spark's message holds the failed attempt's Python traceback as text; the
    last ``DISTFUSION_TASK_ERROR`` report in it becomes a :class:`TaskError`.
    """
    text = str(exc)
    reports = [ln.split(ERROR_MARKER, 1)[1] for ln in text.splitlines() if ERROR_MARKER in ln]
    for raw in reversed(reports):
        try:
            r = json.JSONDecoder().raw_decode(raw.strip())[0]
        except ValueError:
            continue
        cause = r["cause"]
        if r.get("attempts", 1) > 1:
            cause += f" (Spark gave up after {r['attempts']} attempts)"
        return TaskError(r["stage"], r["task"], r["worker"], cause, r["traceback"] or text)
    missing = _MISSING_MODULE.search(text)
    if missing:
        msg = (
            f"a Spark executor cannot import {missing.group(1)}: install distfusion and datafusion "
            "in the executors' Python environment (see the README, 'Running on a Spark cluster')"
        )
        return TransportError(msg)
    last = _last_python_line(text) or text.strip().splitlines()[0] if text.strip() else repr(exc)
    return TransportError(f"Spark job failed on {master}: {last}")


def _last_python_line(text: str) -> str:
    """The last line of the last Python traceback in ``text``, or ``""``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", lines[i]):
            return lines[i].strip()
    return ""
