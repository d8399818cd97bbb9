"""The Spark runtime's shuffle data plane: stage outputs go through Spark's shuffle.

Every non-head stage becomes one RDD whose partition *i* is task *i* of the
stage. A task's output leaves it as records ``(consumer partition, (producer
task, Arrow IPC bytes))``, one record per non-empty output partition
(:mod:`distfusion.worker.spark_records`):

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
(:func:`distfusion.worker.spark_tasks.run_shuffle_task`), each task
described by the one Spark task encoding (:mod:`distfusion.worker.spark_codec`).
"""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Generator
from typing import Any

import pyarrow as pa

from distfusion.coordinator.feeds import QueryFeeds, has_feeds
from distfusion.coordinator.query_run import (
    StageStats,
    task_threads,
)
from distfusion.errors import (
    PlanningError,
    QueryCancelledError,
)
from distfusion.metrics.observer import observer_for
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.task_plan import TaskPlan
from distfusion.runtime.spark.dataframes import spark_input, spark_scan
from distfusion.runtime.spark.jobs import (
    CallSite,
    by_value,
    job_group,
    spark_call,
    spark_progress,
)
from distfusion.stages import BROADCAST, Stage, StageGraph, StageInput
from distfusion.worker.execute_task import run_task, stream_head_stage
from distfusion.worker.memory import TaskMemory
from distfusion.worker.spark_codec import stage_record
from distfusion.worker.spark_entries import task_function
from distfusion.worker.spark_records import decode_records, output_records, partition_stats
from distfusion.worker.spark_tasks import run_shuffle_task


class SparkShuffleQuery:
    """One query on Spark's shuffle, stage by stage, on the driver (a ``QueryRun``).

    A stage that ran keeps its output where Spark put it for every later graph
    of the query: its shuffle files (the map stage of its ``partitionBy``,
    run by ``SparkContext.submitMapStage`` as Spark's AQE runs query stages),
    or its records on the driver and their ``Broadcast``. Consumers planned
    later read those again: a shuffle output as a broadcast (collected from
    the shuffle files, nothing recomputed), or with partitions coalesced
    (``RDD.coalesce`` over the shuffled RDD; Spark picks which partitions a
    task reads, the count follows the plan).
    """

    def __init__(self, runtime, query_id: str) -> None:  # runtime: the SparkRuntime
        self.runtime = runtime
        self.sc = runtime.sc
        self.query_id = query_id
        self.group = job_group(query_id)
        self.graph: StageGraph | None = None
        # One partition function per query: PySpark partitioners are equal, and
        # Spark unions shuffled RDDs partition by partition, only when their
        # functions are one object. A lambda: executors unpickle it without distfusion.
        self.identity = lambda p: p
        self.ran: set[int] = set()  # stage ids that ran; valid in every later graph
        # stage id -> output partitionBy'd: (p, (sid, task, ipc))
        self.shuffled: dict[int, Any] = {}  # pyspark RDDs
        # stage id -> output on the driver
        self.values: dict[int, list[tuple[int, int, bytes]]] = {}
        # stage id -> Broadcast of [(task, ipc)], all partitions
        self.broadcasts: dict[int, Any] = {}  # pyspark Broadcasts
        self.rdds: dict[int, Any] = {}  # stage id -> output records (p, (task, ipc)); this graph
        self.on_driver: set[int] = set()  # stages run here rather than on Spark
        self.persisted: list = []
        self.uses: dict[int, int] = {}
        # (stage, task, partition) -> (rows, bytes)
        self.acc = self.sc.accumulator({}, _merge_param())
        self.metrics_acc = self.sc.accumulator({}, _merge_param())  # (stage, task) -> metrics dict
        self.observer = observer_for(query_id)
        self.observer.add_refresher(lambda: spark_progress(self.sc, self.group))
        # Closed from another thread (ResultStream.close): its Spark jobs end, so the
        # thread reading the result stops waiting; that thread then closes the run.
        self.observer.add_canceller(lambda: self.sc.cancelJobGroup(self.group))
        self.finished = False
        self.closed = False
        # Tasks pull feeds from the driver's endpoint; Spark retries replay a partition.
        self.feeds = QueryFeeds(query_id, on_error=lambda err: self.close(), replayable=True)

    # ------------------------------------------------------------------ QueryRun
    def run_stages(self, graph: StageGraph, stage_ids: list[int]) -> dict[int, StageStats]:
        """See :meth:`QueryRun.run_stages`: broadcast outputs are collected, shuffles written."""
        start = time.perf_counter()
        self._use(graph)
        self.observer.planned(graph)
        stages = [graph.stage(sid) for sid in stage_ids]
        self._prepare_broadcasts(stages, outputs=True)
        shuffled = [s.stage_id for s in stages if s.output.kind != BROADCAST]
        with self._named(shuffled):
            dependencies = [self._shuffle_dependency(self._shuffled(sid)) for sid in shuffled]
            # pyspark has no submitMapStage: the JVM SparkContext's
            futures = [self.sc._jsc.sc().submitMapStage(d) for d in dependencies]  # noqa: SLF001
        for future in futures:
            self._spark_call(future.get)
        self.ran.update(stage_ids)
        self._report_metrics()
        elapsed = time.perf_counter() - start
        return {s.stage_id: self._stage_stats(s, elapsed) for s in stages}

    def stream_head(self, graph: StageGraph) -> Generator[pa.RecordBatch, None, None]:
        """See :meth:`QueryRun.stream_head`: a job per broadcast round, one for the head's."""
        self._use(graph)
        self.observer.planned(graph)
        head = graph.head
        pending = [s for s in graph.stages if s.stage_id not in self.ran]
        self._prepare_broadcasts(pending, outputs=False)
        self._collect([i.stage_id for i in head.inputs])
        inputs = [self._input_values(inp) for inp in head.inputs]
        plan = TaskPlan.for_task(
            self.query_id, head, 0, _dummy_workers(head, graph), self.runtime.target_partitions
        )
        budget = self.runtime.task_memory_bytes(graph)
        self._report_metrics()
        yield from stream_head_stage(
            plan,
            lambda i: decode_records(inputs[i]),
            self.feeds.local_chunks(head),
            TaskMemory(budget, None),
            cancelled=lambda: self.closed,
            on_metrics=self.observer.task_finished,
        )
        self.finished = True

    def close(self) -> None:
        """Cancel the query's Spark jobs unless it finished; free its broadcasts and caches."""
        if self.closed:
            return
        self.closed = True
        self.feeds.close()
        self._report_metrics()
        if not self.finished:
            self.sc.cancelJobGroup(self.group)
        for b in self.broadcasts.values():
            b.destroy()
        for rdd in self.persisted:
            rdd.unpersist()
        self.runtime.forget_query(self.query_id)
        self.sc.setLocalProperty("spark.jobGroup.id", None)

    # ------------------------------------------------------------------ driver
    @property
    def _graph(self) -> StageGraph:
        """The graph in use (set by :meth:`_use`, which every run starts with)."""
        if self.graph is None:
            raise RuntimeError("no stage graph in use: stream_head or run_stages sets it")
        return self.graph

    def _use(self, graph: StageGraph) -> None:
        """Plan Spark work for ``graph``: outputs of stages that did not run are forgotten."""
        if graph is self.graph:
            return
        self.graph = graph
        self.uses = _uses(graph)
        for cache in (self.rdds, self.shuffled, self.values, self.broadcasts):
            for sid in [sid for sid in cache if sid not in self.ran]:
                del cache[sid]

    def _named(self, stage_ids: list[int]) -> CallSite:
        """The Spark jobs started in the block run stages ``stage_ids`` (their description)."""
        return CallSite(self.sc, self.group, self.observer.description(stage_ids))

    def _report_metrics(self) -> None:
        """The tasks' metrics the accumulator gathered so far, to the observer."""
        try:
            values = dict(self.metrics_acc.value)
        except Exception:  # the session stopped: nothing to report
            return
        self.observer.tasks_finished([TaskMetrics.from_dict(d) for d in values.values()])

    def _stage_stats(self, stage: Stage, elapsed_s: float) -> StageStats:
        """The measured output of ``stage``, from the tasks' accumulator updates."""
        n = stage.output.num_partitions
        rows, nbytes = [0] * n, [0] * n
        for (sid, _, p), (r, b) in self.acc.value.items():
            if sid == stage.stage_id and p < n:
                rows[p] += r
                nbytes[p] += b
        return StageStats(stage.stage_id, tuple(rows), tuple(nbytes), elapsed_s)

    def _collect(self, stage_ids: list[int]) -> None:
        """Bring the outputs of ``stage_ids`` to the driver (``self.values``), in one Spark job.

        Outputs already here (a broadcast collected for another consumer, a
        stage run here) are not collected again, nor is a stage listed twice.
        """
        wanted = [sid for sid in dict.fromkeys(stage_ids) if sid not in self.values]
        if not wanted:
            return
        with self._named(wanted):  # RDDs made here are named after the stages too
            parts = [
                self._records(sid).map(lambda r, sid=sid: (sid, r[0], r[1][0], r[1][1]))
                for sid in wanted
            ]
            union = parts[0] if len(parts) == 1 else self.sc.union(parts)
            for sid in wanted:
                self.values[sid] = []
            records = self._spark_call(union.collect)
        for sid, p, task, ipc in records:
            self.values[sid].append((p, task, ipc))
        for sid in wanted:
            self._hold(sum(len(v[2]) for v in self.values[sid]))

    def _input_values(self, inp: StageInput) -> list[tuple[int, bytes]]:
        """``(task, ipc)`` of what a one-task consumer reads of ``inp``, by producer task."""
        mine = inp.partitions_for(0)
        values = [(t, ipc) for p, t, ipc in self.values[inp.stage_id] if p in mine]
        return sorted(values, key=lambda v: v[0])

    def _hold(self, nbytes: int) -> None:
        self._check_open()
        self.runtime.hold_bytes(self.query_id, nbytes)

    def _check_open(self) -> None:
        """Raise when :meth:`close` ran (from another thread) while this run worked.

        Raises:
            FeedError: a work unit feed's provider failed (which closed the run).
            QueryCancelledError: the run was closed; nothing more is held or broadcast.
        """
        if self.feeds.error is not None:
            raise self.feeds.error
        if self.closed:
            msg = f"query {self.query_id} was cancelled"
            raise QueryCancelledError(msg)

    def _spark_call(self, action):
        """Run a Spark action (:func:`spark_call`)."""
        return spark_call(action, self._check_open, self.sc.master)

    def _records(self, stage_id: int):
        """The RDD of ``stage_id``'s output records ``(p, (task, ipc))``, never computed twice.

        A stage whose output is on the driver is parallelized from there; one
        whose shuffle ran is read back from its shuffle files.
        """
        if stage_id in self.values:
            records = [(p, (t, ipc)) for p, t, ipc in self.values[stage_id]]
            return self.sc.parallelize(records, 1)
        if stage_id in self.ran and stage_id in self.shuffled:
            return self.shuffled[stage_id].map(lambda r: (r[0], r[1][1:]))
        return self._stage_rdd(stage_id)

    def _shuffled(self, stage_id: int):
        """``stage_id``'s records partitioned by consumer partition, tagged with the stage id."""
        if stage_id not in self.shuffled:
            n = self._graph.stage(stage_id).output.num_partitions
            self.shuffled[stage_id] = (
                self._records(stage_id)
                .map(lambda r, sid=stage_id: (r[0], (sid,) + r[1]))
                .partitionBy(n, self.identity)
            )
        return self.shuffled[stage_id]

    @staticmethod
    def _shuffle_dependency(shuffled):
        """The JVM ``ShuffleDependency`` of a PySpark ``partitionBy`` result (``submitMapStage``).

        PySpark's ``partitionBy`` returns ``valueOfPair(ShuffledRDD)``: a
        one-to-one child of the ``ShuffledRDD``, whose one dependency is the shuffle.
        """
        jrdd = shuffled._jrdd  # noqa: SLF001 (pyspark exposes no ShuffleDependency)
        return jrdd.rdd().dependencies().head().rdd().dependencies().head()

    def _stage_rdd(self, stage_id: int):
        """The RDD of ``stage_id``'s output records, built once per graph (it has not run)."""
        if stage_id in self.rdds:
            return self.rdds[stage_id]
        stage = self._graph.stage(stage_id)
        read = [inp for inp in stage.inputs if inp.boundary != BROADCAST]
        broadcast = {
            i: self.broadcasts[inp.stage_id]
            for i, inp in enumerate(stage.inputs)
            if inp.boundary == BROADCAST
        }
        scan = spark_scan(stage)
        if scan is not None and read:
            msg = (
                f"stage {stage_id} reads Spark table {scan.source.name!r} and stage "
                f"{read[0].stage_id} through a {read[0].boundary}: the planner reads a Spark "
                "table in a stage of its own"
            )
            raise PlanningError(msg)
        if read:
            # Each input is partitioned on its own, inside the producer's Python
            # worker; the union of RDDs with one partitioner is Spark's
            # PartitionerAwareUnionRDD: partition i holds partition i of every input.
            producers = list(dict.fromkeys(inp.stage_id for inp in read))
            parts = [self._shuffled(sid) for sid in producers]
            base = parts[0] if len(parts) == 1 else self.sc.union(parts)
            n = self._graph.stage(producers[0]).output.num_partitions
            if base.getNumPartitions() != n:  # not co-partitioned: would lose rows
                msg = f"stage {stage_id}: Spark did not co-partition its {len(parts)} inputs"
                raise PlanningError(msg)
            if stage.num_tasks < n:  # partitions coalesced by adaptive execution
                base = base.coalesce(stage.num_tasks)
        else:
            base = self.sc.parallelize(range(stage.num_tasks), stage.num_tasks)
        if has_feeds(stage):
            stage = self.feeds.serve(self.runtime.feed_endpoint(), stage)
        threads = task_threads(
            self.runtime.target_partitions, stage.num_tasks, self.runtime.target_partitions
        )
        table = scan.source.name if scan is not None else None
        # The task's plan sets no memory pool (the task's own TaskMemory, below).
        record = stage_record(by_value(stage), (), threads, None, table, keep_output=False)
        args = (
            self.query_id,
            record,
            bool(read),
            broadcast,
            self.runtime.compression,
            self.acc,
            self.metrics_acc,
            self.runtime.task_memory_bytes(self._graph),
        )
        tasks = [(stage_id, t) for t in range(stage.num_tasks)]
        if scan is None:
            rdd = base.mapPartitionsWithIndex(task_function(tasks, run_shuffle_task, *args))
        else:
            # Over the DataFrame's partitions; tasks past them read an empty one.
            arrow, parts, read_schema = spark_input(self.sc, stage, scan)
            spark = (table, read_schema, 0, False)
            rdd = arrow.mapPartitionsWithIndex(task_function(tasks, run_shuffle_task, *args, spark))
            if parts < stage.num_tasks:
                rest = stage.num_tasks - parts
                empty = (table, None, parts, True)
                fn = task_function(tasks[parts:], run_shuffle_task, *args, empty)
                pad = self.sc.parallelize(range(rest), rest).mapPartitionsWithIndex(fn)
                rdd = self.sc.union([rdd, pad])
        rdd.setName(f"distfusion {self.query_id[:8]} stage {stage_id}")
        if self.uses.get(stage_id, 0) > 1:
            rdd.persist()
            self.persisted.append(rdd)
        self.rdds[stage_id] = rdd
        return rdd

    def _prepare_broadcasts(self, stages: list[Stage], outputs: bool) -> None:
        """Create the broadcasts ``stages`` read (with ``outputs``, their broadcast outputs too).

        One Spark job per round: a round collects every broadcast whose producer
        needs no broadcast of a later round (:func:`_rounds`), as a union tagged
        with the producer's stage id, so independent broadcasts run side by side.
        A one-task producer that has not run runs on the driver instead
        (:meth:`_run_on_driver`); the same job collects its inputs that Spark produces.
        """
        graph = self._graph
        needed = {i.stage_id for s in stages for i in s.inputs if i.boundary == BROADCAST}
        if outputs:
            needed |= {s.stage_id for s in stages if s.output.kind == BROADCAST}
        needed -= set(self.broadcasts)
        for round_ in _rounds(graph, needed, self.ran):
            here = [
                sid
                for sid in round_
                if graph.stage(sid).num_tasks == 1
                and sid not in self.ran
                and spark_scan(graph.stage(sid)) is None  # a Spark table is read by Spark
            ]
            # Inputs of stages run here come in the same job, unless run here
            # earlier in the round (stage ids are in producer order).
            inputs = [i.stage_id for sid in here for i in graph.stage(sid).inputs]
            self._collect([sid for sid in round_ + inputs if sid not in here])
            for sid in here:
                self._run_on_driver(graph.stage(sid))
            for sid in round_:
                values = [(t, ipc) for _, t, ipc in self.values[sid]]
                self._check_open()
                self.broadcasts[sid] = self.sc.broadcast(values)

    def _run_on_driver(self, stage: Stage) -> None:
        """Run one-task broadcast ``stage`` here; its output goes to ``self.values``.

        As a Spark job it would pay a job's scheduling (~0.15 s) to use one
        executor core; here it runs at once with every driver core, as the head
        stage does. Its inputs are on the driver already (``self.values``).

        Raises:
            TaskError: the fragment failed (worker ``spark-driver://HOST``).
        """
        plan = TaskPlan.for_task(
            self.query_id,
            stage,
            0,
            _dummy_workers(stage, self._graph),
            self.runtime.target_partitions,
        )
        inputs = [self._input_values(i) for i in stage.inputs]
        worker = f"spark-driver://{socket.gethostname()}"
        budget = self.runtime.task_memory_bytes(self._graph)
        with tempfile.TemporaryDirectory(prefix="distfusion-spill-") as spill_dir:
            parts = run_task(
                plan,
                lambda i: decode_records(inputs[i]),
                worker=worker,
                feed_chunks=self.feeds.local_chunks(stage),
                memory=TaskMemory(budget, spill_dir),
                on_metrics=self.observer.task_finished,
            )
        self.acc.add(partition_stats(stage.stage_id, 0, parts))
        self.values[stage.stage_id] = [
            (p, 0, ipc) for p, (_, ipc) in output_records(0, parts, self.runtime.compression)
        ]
        self.on_driver.add(stage.stage_id)
        self._hold(sum(len(v[2]) for v in self.values[stage.stage_id]))


def _merge_param():
    """A Spark ``AccumulatorParam`` merging dicts (later keys win: a retried task overwrites).

    Defined in a function, so cloudpickle ships the class by value: executors
    need nothing of distfusion to merge.
    """
    from pyspark.accumulators import AccumulatorParam  # optional dependency

    class MergeDicts(AccumulatorParam):
        def zero(self, value):
            return {}

        def addInPlace(self, value1, value2):
            value1.update(value2)
            return value1

    return MergeDicts()


def _rounds(graph: StageGraph, needed: set[int], ran: set[int]) -> list[list[int]]:
    """The broadcast producers ``needed``, grouped by collection round, earliest first.

    ``depth(s)`` is how many rounds must finish before stage *s* can run: the
    largest, over its inputs, of the input's depth plus one for a broadcast
    input; a stage that ran has depth 0. A producer is collected in round
    ``depth(producer)``.
    """
    depth: dict[int, int] = {}
    for s in graph.stages:  # producers first
        depth[s.stage_id] = (
            0
            if s.stage_id in ran
            else max(
                (depth[i.stage_id] + (1 if i.boundary == BROADCAST else 0) for i in s.inputs),
                default=0,
            )
        )
    rounds: dict[int, list[int]] = {}
    for sid in sorted(needed):
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
