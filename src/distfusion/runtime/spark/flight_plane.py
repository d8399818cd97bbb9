"""The Spark runtime's Flight data plane (the default): outputs stay on the executors.

Stages run round by round, each round one Spark job of task plans; each
executor Python worker keeps its tasks' outputs in an Arrow Flight server of
its own (:func:`~distfusion.worker.spark_tasks._executor_worker`), and consumer
tasks (and the head stage, on the driver) read them from there. Nothing but
plans and per-task sizes crosses the JVM; Spark still schedules and retries
every task, and lost outputs are computed again (docs/spark-data-path.md).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from distfusion.coordinator.feeds import QueryFeeds, has_feeds
from distfusion.coordinator.query_run import (
    WorkerQueryRun,
    task_threads,
)
from distfusion.errors import (
    TaskError,
    TaskPanicked,
    WorkerUnavailableError,
)
from distfusion.io.write import WriteSpec, write_part
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import (
    task_error_from_json,
)
from distfusion.protocol.task_plan import TaskPlan
from distfusion.runtime.spark.dataframes import spark_input, spark_scan
from distfusion.runtime.spark.jobs import (
    CallSite,
    by_value,
    job_group,
    spark_call,
    spark_progress,
)
from distfusion.stages import SourceScan, Stage, StageGraph
from distfusion.transport.flight import FlightWorkerTransport
from distfusion.worker.head_parts import HeadPart
from distfusion.worker.spark_codec import StageRecord, TaskRecord, stage_record
from distfusion.worker.spark_entries import task_function
from distfusion.worker.spark_tasks import (
    EXECUTOR_QUERY_TTL_S,
    run_flight_table_task,
    run_flight_task,
    run_head_part,
)

log = logging.getLogger(__name__)


KEEP_WARM_S = 20.0
"""Seconds between the keep-warm jobs of a held result (PySpark's idle timeout is 60 s)."""


class SparkFlightQuery(WorkerQueryRun):
    """One query on Spark whose stage outputs move over Arrow Flight, not Spark's shuffle.

    Spark schedules every task; each Python worker process of an executor
    hosts a :class:`~distfusion.worker.flight_server.FlightWorker` for the life
    of the process, started by the first task it runs (:func:`_executor_worker`).
    A task runs on that worker and its output stays there; the Spark task
    returns where it ran and what it produced. Consumers, planned once their
    producers finished, read their inputs from those workers as the Flight
    runtime's tasks do; the head stage reads them here::

        round 1: one Spark job, every task of the stages whose inputs all ran
                 -> (stage, task, worker URL, rows, bytes) per task
        round 2: the next stages' task plans name those URLs; ...
        head:    read over Flight on the driver; close(): cancel_query everywhere

    Attempts are counted here, not by Spark: a Python exception would end the
    PySpark worker process and every output it holds, so a failed task
    returns its error as its record and runs again (at most
    ``task_max_failures`` attempts). Outputs lost with a process (killed,
    out of memory, idle-timed-out by PySpark) are computed again: when a
    round fails, the workers of the query that no longer answer are found,
    their tasks run again (producers first), then the failed tasks (at most
    ``task_max_failures`` times per query).
    """

    transport: FlightWorkerTransport  # the runtime's: Flight, with keepalives

    def __init__(self, runtime, query_id: str) -> None:  # runtime: the SparkRuntime
        super().__init__(
            query_id,
            runtime.transport,
            [runtime.master],
            target_partitions=runtime.target_partitions,
            keep_outputs=True,
            on_close=self._forget,
        )
        self.runtime = runtime
        self.sc = runtime.sc
        self.group = job_group(query_id)
        runtime.track_run(self)
        # Executors cannot be pushed to: tasks pull their feed partitions from the
        # driver's endpoint; a retried attempt replays its partition.
        self.feeds = QueryFeeds(query_id, on_error=lambda err: self.close(), replayable=True)
        self._task_stats: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._stages: dict[int, Stage] = {}  # stage id -> stage, for running lost tasks again
        self._rounds: list[list[int]] = []  # stage ids by round, in the order they ran
        self._used: set[str] = set()  # every worker URL a task of this query ran on
        self._recoveries = 0  # times lost outputs were computed again (at most task_max_failures)
        self._spark_inputs: dict[int, tuple] = {}  # stage id -> spark_input(...)
        self._running = False
        self._panic: TaskPanicked | None = None  # a task that panicked (see panicked)
        self._memory: int | None = None  # the graph's memory_per_task_bytes
        self._keepalive = threading.Event()
        self.observer.add_refresher(self._progress)
        threading.Thread(
            target=self._keep_alive, name=f"distfusion-keepalive-{query_id[:8]}", daemon=True
        ).start()

    def close(self) -> None:
        """Cancel the query's Spark jobs and drop its outputs on every worker used.

        Closed while a Spark job ran, the job's tasks that finished never said
        where they ran: every executor worker this runtime knows is told.
        """
        if self._running and not self.closed:
            self._used |= self.runtime.executor_urls
            self._cancel_jobs()
        super().close()

    def _cancel_jobs(self) -> None:
        """Cancel the query's running Spark jobs (its job group)."""
        self.sc.cancelJobGroup(self.group)

    def _progress(self) -> tuple[int, int]:
        """``(tasks done, tasks)`` of the query's Spark jobs (the observer's refresher)."""
        return spark_progress(self.sc, self.group)

    def panicked(self, err: TaskPanicked) -> None:
        """Task ``err`` names panicked on an executor: fail the query now.

        A panic is not run again (the same input panics again). The query is
        failed with ``err`` (:meth:`WorkerQueryRun.fail`): its Spark job is
        cancelled and its tasks on every worker with it, and the wait for the
        job raises ``err``. Otherwise the job would end, and the failure be
        seen, only when its slowest task did. (Task failures on the Flight data
        plane are otherwise retried, so the failure watch of other runtimes,
        which fails the query on any task error, does not run here.)
        """
        if self._panic is not None or self.closed:
            return
        self._panic = err
        self._used |= self.runtime.executor_urls  # the job's tasks said nothing yet
        name = f"distfusion-panic-{self.query_id[:8]}"
        threading.Thread(target=self.fail, args=(err,), name=name, daemon=True).start()

    def _forget(self) -> None:
        self._keepalive.set()
        self.runtime.forget_query(self.query_id)
        # failed attempts, cancelled jobs
        self._cancel_on_workers(sorted(self._used - set(self.placement.values())))
        self.transport.forget_query(self.query_id)

    def _keep_alive(self) -> None:
        """Tell the workers holding outputs that the query lives (their TTL is a safety net)."""
        while not self._keepalive.wait(EXECUTOR_QUERY_TTL_S / 4):
            for url in set(self.placement.copy().values()):
                self.transport.keepalive(url, [self.query_id])

    def _before_head(self) -> None:
        """Outputs lost since they ran (a Python worker died) are computed again."""
        lost = self._lost_workers()
        if lost:
            self._run_lost_again(lost)

    def _place(self, graph: StageGraph, stages: list[Stage]) -> None:
        """Nothing: Spark places the tasks; :meth:`_deliver` learns where they ran."""

    def _deliver(self, graph: StageGraph, stages: list[Stage]) -> None:
        """Run ``stages`` round by round, each round a Spark job, and wait for them.

        A small one-task stage (:meth:`_small`) runs on the driver's Flight
        worker instead, while its round's Spark job runs; so does a larger
        one alone in its round, where the executors share the driver's cores.
        """
        self._memory = graph.memory_per_task_bytes
        pending = list(stages)
        while pending:
            ready = [s for s in pending if all(i.stage_id in self._delivered for i in s.inputs)]
            if not ready:
                self._input_workers(pending[0])  # raises: reads a stage that never runs
            for stage in ready:
                if has_feeds(stage):  # sessions open now: discovery starts with the round
                    stage = self.feeds.serve(self.runtime.feed_endpoint(), stage)
                self._stages[stage.stage_id] = stage
                self._started[stage.stage_id] = time.monotonic()
            self._rounds.append([s.stage_id for s in ready])
            small = [s for s in ready if self._small(s, alone=len(ready) == 1)]
            rest = [s for s in ready if s not in small]
            self._run_round(small, [(s.stage_id, t) for s in rest for t in range(s.num_tasks)])
            for stage in ready:
                self._delivered[stage.stage_id] = stage.num_tasks
            pending = [s for s in pending if s not in ready]

    def _run_round(self, small: list[Stage], tasks: list[tuple[int, int]]) -> None:
        """Run the ``small`` stages on the driver while the Spark job runs ``tasks``.

        The driver's stages run at once, each in a thread of its own. One that
        fails fails the query at once (:meth:`fail`: the job is cancelled, and
        its wait raises that error), as a panic on an executor does; else the
        round ends when all of them and the job have.

        Raises:
            TaskError, TaskPanicked, QueryCancelledError, TransportError: as
                :meth:`_run_on_driver` and :meth:`_run_tasks`.
        """
        if len(small) <= 1 and not tasks:
            for stage in small:
                self._run_on_driver(stage)
            return

        def failed(future) -> None:
            err = future.exception()
            if isinstance(err, TaskError):
                self.fail(err)

        with ThreadPoolExecutor(max(1, len(small)), "distfusion-driver-stage") as pool:
            running = [pool.submit(self._run_on_driver, stage) for stage in small]
            for future in running:
                future.add_done_callback(failed)
            try:
                self._run_tasks(tasks)  # failed by a driver stage: raises (the caller says why)
            finally:
                errors = [f.exception() for f in running]
        for err in errors:
            if err is not None:
                raise err

    def _small(self, stage: Stage, alone: bool = False) -> bool:
        """Whether one-task ``stage`` runs on the driver (:attr:`SparkRuntime.driver_stage_bytes`).

        One task; no Spark table or feed read, and files of at most
        ``driver_scan_bytes`` in all; inputs of at most ``driver_stage_bytes``.
        A stage ``alone`` in its round may read up to the runtime's in-place
        bound of each (:meth:`SparkRuntime.lone_stage_bytes`): no Spark task
        runs beside it, and its Spark job would cost more than the driver's
        run where the executors add no core.
        """
        limit = self.runtime.driver_stage_bytes
        if stage.num_tasks != 1 or not limit:
            return False
        scan_limit = self.runtime.driver_scan_bytes
        if alone:
            lone = self.runtime.lone_stage_bytes()
            limit, scan_limit = max(limit, lone), max(scan_limit, lone)
        if stage.scans:
            if spark_scan(stage) is not None or has_feeds(stage):
                return False
            files = sum(u.size_bytes for s in stage.scans for u in s.task_units[0])
            if files > scan_limit:
                return False
        held = 0
        for inp in stage.inputs:
            for (sid, _), (_, nbytes) in self._task_stats.items():
                if sid == inp.stage_id:
                    held += sum(nbytes)
        return held <= limit

    def _run_on_driver(self, stage: Stage) -> None:
        """Run one-task ``stage`` on the driver's Flight worker, not as a Spark job.

        Raises:
            TaskError: the fragment failed (named by stage, task and the driver's worker).
            QueryCancelledError: the run was closed meanwhile.
        """
        self._check_open()
        worker = self.runtime.driver_worker()
        plan = TaskPlan.for_task(
            self.query_id,
            stage,
            0,
            self._input_workers(stage),
            self.target_partitions,
            keep_output=True,
            memory_per_task_bytes=self._memory,
        )
        self._used.add(worker.url)
        m = worker.run_task(plan)
        self.placement[(stage.stage_id, 0)] = worker.url
        self._task_stats[(stage.stage_id, 0)] = (m.partition_rows, m.partition_bytes)
        self.observer.task_finished(m)

    def _run_tasks(self, tasks: list[tuple[int, int]]) -> None:
        """Run ``tasks`` (``(stage, task)``; their inputs are placed) until each succeeded.

        No task: nothing runs (no Spark job).

        Raises:
            TaskError: a task failed ``task_max_failures`` times.
            TaskPanicked: a task panicked (at its first attempt).
            QueryCancelledError: the run was closed meanwhile.
            TransportError: Spark failed the job.
        """
        attempts = dict.fromkeys(tasks, 0)
        pending = list(tasks)
        while pending:
            failed = self._spark_round(pending, attempts)
            if not failed:
                return
            panic = self._panic or next(
                (err for _, err in failed if isinstance(err, TaskPanicked)), None
            )
            if panic is not None:  # not run again; the others were cancelled for it
                raise panic
            lost = self._lost_workers()
            if lost and self._recoveries < self.runtime.task_max_failures:
                self._recoveries += 1  # the failed tasks may have read what was lost
                self._run_lost_again(lost)
            else:
                for key, err in failed:
                    attempts[key] += 1
                    if attempts[key] >= self.runtime.task_max_failures:
                        cause = f"{err.cause} (gave up after {attempts[key]} attempts)"
                        raise TaskError(
                            err.stage_id, err.task_index, err.worker, cause, err.remote_traceback
                        )
            pending = [key for key, _ in failed]

    def _spark_round(
        self, tasks: list[tuple[int, int]], attempts: dict[tuple[int, int], int]
    ) -> list[tuple[tuple[int, int], TaskError]]:
        """One Spark job running ``tasks``; records where each ran; returns the failed ones.

        Every task travels in the one Spark task encoding
        (:mod:`~distfusion.worker.spark_codec`): its stage's record once in the
        job's closure, the task as ``(stage, task, attempt)``. Tasks of a stage
        reading a Spark table run over the DataFrame's partitions
        (:func:`spark_input`), the others over their task records
        (``parallelize``); all in one job (a union), except a stage reading a
        Spark table with only some of its tasks to run (a retry), which runs
        those partitions only, in a job of its own (``SparkContext.runJob``).
        """
        self._check_open()
        slots = self.runtime.num_workers()
        plain: list[TaskRecord] = []  # by Spark partition
        on_tables: dict[int, dict[int, int]] = {}  # Spark table stage -> {task: attempt}
        stages: dict[int, StageRecord] = {}
        description = self.observer.description(list(dict.fromkeys(sid for sid, _ in tasks)))
        stage_ids = ", ".join(str(sid) for sid in dict.fromkeys(sid for sid, _ in tasks))
        with CallSite(self.sc, self.group, description):  # an adaptive DataFrame runs here
            for sid, t in tasks:
                stage = self._stages[sid]
                if sid not in stages:
                    stages[sid] = self.stage_record(stage, slots)
                scan = spark_scan(stage)
                if scan is not None and t < self._spark_input(stage, scan)[1]:
                    on_tables.setdefault(sid, {})[t] = attempts[(sid, t)]
                else:
                    plain.append((sid, t, attempts[(sid, t)]))
            whole, partial = [], []
            worker_args = self.runtime.executor_worker_args()
            if plain:
                fn = task_function(
                    [(sid, t) for sid, t, _ in plain],
                    run_flight_task,
                    self.query_id,
                    {sid: stages[sid] for sid in dict.fromkeys(sid for sid, _, _ in plain)},
                    *worker_args,
                )
                rdd = self.sc.parallelize(plain, len(plain)).mapPartitionsWithIndex(fn)
                whole.append(rdd)
            for sid, wanted in on_tables.items():
                stage = self._stages[sid]
                scan = spark_scan(stage)
                assert scan is not None  # on_tables: the stages that read a Spark table
                arrow, parts, read_schema = self._spark_input(stage, scan)
                fn = task_function(
                    [(sid, t) for t in range(parts)],
                    run_flight_table_task,
                    self.query_id,
                    wanted,
                    stages[sid],
                    read_schema,
                    *worker_args,
                )
                rdd = arrow.mapPartitionsWithIndex(fn)
                if len(wanted) == parts:
                    whole.append(rdd)
                else:
                    partial.append((rdd, sorted(wanted)))
            self._running = True
            self.runtime.used_workers()
            results = []
            try:
                if whole:
                    rdd = whole[0] if len(whole) == 1 else self.sc.union(whole)
                    rdd.setName(f"distfusion {self.query_id[:8]} stages {stage_ids}")
                    results += spark_call(rdd.collect, self._check_open, self.sc.master)
                for rdd, partitions in partial:
                    results += spark_call(
                        lambda rdd=rdd, partitions=partitions: self.sc.runJob(
                            rdd, lambda it: it, partitions
                        ),
                        self._check_open,
                        self.sc.master,
                    )
            finally:
                self._running = False
        return self._task_results(results)

    def stage_record(self, stage: Stage, slots: int) -> StageRecord:
        """``stage``'s record for a Spark job (:func:`~distfusion.worker.spark_codec.stage_record`).

        Pickled by value with its session (the query's UDFs and object
        stores); its inputs where their tasks ran; ``slots``: the task slots
        its tasks share.
        """
        scan = spark_scan(stage)
        return stage_record(
            by_value(stage),
            self._input_workers(stage),
            task_threads(self.target_partitions, stage.num_tasks, slots),
            self._memory,
            scan.source.name if scan is not None else None,
            keep_output=True,
        )

    def _task_results(self, results: list) -> list[tuple[tuple[int, int], TaskError]]:
        """Record where each task of a round ran and what it made; return the failed ones.

        ``results``: the tasks' records ``(stage, task, worker URL, metrics, error)``
        (:func:`~distfusion.worker.spark_tasks.flight_task`).
        """
        failed = []
        for sid, t, url, metrics, report in results:
            self._used.add(url)
            self.runtime.executor_urls.add(url)
            if report is not None:
                failed.append(((sid, t), task_error_from_json(report)))
                continue
            self.placement[(sid, t)] = url
            m = TaskMetrics.from_dict(metrics)
            self._task_stats[(sid, t)] = (m.partition_rows, m.partition_bytes)
            self.observer.task_finished(m)
        return failed

    def head_input_bytes(self, graph: StageGraph) -> int:
        """Arrow bytes of every output the head stage of ``graph`` reads (as its tasks reported)."""
        wanted = {i.stage_id for i in graph.head.inputs}
        return sum(sum(b) for (sid, _), (_, b) in self._task_stats.items() if sid in wanted)

    def part_args(self, graph: StageGraph, parts: list[HeadPart]) -> tuple[str, int, int]:
        """``(access, memory bytes, DataFusion threads)`` a head part needs on an executor.

        ``access``: :meth:`DataPlaneAccess.plain` (token, and TLS when on).
        """
        budget = self.runtime.task_memory_bytes(graph)
        threads = task_threads(self.target_partitions, len(parts), self.runtime.num_workers())
        return self.runtime.access.plain(), budget, threads

    def map_head_parts(self, graph: StageGraph, fn, split: bool = True) -> list:
        """Run the stages of ``graph``, then ``fn(part, attempt, batches)`` on the executors.

        One Spark job: task *i* runs head part *i*
        (:func:`~distfusion.worker.head_parts.run_part`), reading its inputs
        over Flight from the executors' workers, and returns ``fn``'s result
        (which must pickle). Attempts are counted here, as for every task of
        this data plane: a failed part returns its error, and runs again (at
        most ``task_max_failures`` attempts); outputs lost with a Python
        worker are computed again first. The run stays open; the caller closes it.

        Returns:
            ``fn``'s results, by part.

        Raises:
            TaskError: a part failed ``task_max_failures`` times (names the
                head stage, the part as its task and the executor).
            QueryCancelledError: the run was closed meanwhile.
            TransportError: Spark failed the job.
        """
        parts = self.head_parts(graph, split)
        if has_feeds(graph.head):  # its feed streams from the driver: the head runs here
            return [fn(0, 0, self.stream_head(graph))]
        attempts = {p.index: 0 for p in parts}
        results: dict[int, object] = {}
        pending = list(parts)
        while pending:
            self._check_open()
            out = self._part_job(graph, parts, [(attempts[p.index], p) for p in pending], fn)
            failed = set()
            for index, value, report in out:
                if report is None:
                    results[index] = value
                    continue
                err = task_error_from_json(report)
                attempts[index] += 1
                if attempts[index] >= self.runtime.task_max_failures:
                    cause = f"{err.cause} (gave up after {attempts[index]} attempts)"
                    raise TaskError(
                        err.stage_id, err.task_index, err.worker, cause, err.remote_traceback
                    )
                failed.add(index)
            if failed:  # inputs lost with a Python worker run again; parts name the new places
                parts = self.head_parts(graph, split)
            pending = [p for p in parts if p.index in failed]
        return [results[p.index] for p in parts]

    def _part_job(self, graph: StageGraph, parts: list[HeadPart], pending: list, fn) -> list:
        """One Spark job running ``fn`` over the ``pending`` parts ``(attempt, part)`` of ``parts``.

        Returns each part's record ``(part index, fn's result, error)``
        (:func:`~distfusion.worker.spark_tasks.run_head_part`).
        """
        sid = graph.head.stage_id
        access, budget, threads = self.part_args(graph, parts)
        job = task_function(
            [(sid, p.index) for _, p in pending], run_head_part, access, budget, threads, fn
        )
        records = [(attempt, by_value(part)) for attempt, part in pending]  # as on Connect
        rdd = self.sc.parallelize(records, len(records)).mapPartitionsWithIndex(job)
        rdd.setName(f"distfusion {self.query_id[:8]} head stage {sid} parts")
        self._running = True
        self.runtime.used_workers()
        try:
            with CallSite(self.sc, self.group, self.observer.description([sid])):
                return spark_call(rdd.collect, self._check_open, self.sc.master)
        finally:
            self._running = False

    def write_head_parts(self, graph: StageGraph, spec: WriteSpec) -> list:
        """Every head part writes its rows as a task of ``spec``'s job, on the executors.

        :meth:`map_head_parts` with :func:`~distfusion.io.write.write_part`: Spark
        schedules the parts, and a failed one runs again (its attempt's files
        deleted, or left in the job's temporary directory when killed).
        """
        return self.map_head_parts(graph, functools.partial(write_part, spec))

    def keep_warm(self) -> None:
        """Keep the executors' Python workers, and the outputs they hold, alive until :meth:`close`.

        PySpark ends every idle Python worker of an executor after a minute
        without a Python task there (``PythonWorkerFactory``'s idle timeout),
        and the outputs it holds with it. A result read later by Spark
        (:meth:`SparkDataFrame.to_spark`) needs them for as long as it is held:
        a tiny Python Spark job (one task per slot) runs every
        :data:`KEEP_WARM_S` seconds until the run is closed.
        """

        def warm() -> None:
            while not self._keepalive.wait(KEEP_WARM_S):
                try:
                    what = f"distfusion keep warm {self.query_id[:8]}"
                    self.runtime.warm_job(f"{self.group}-warm", what)
                except Exception:  # the session stopped: nothing to keep
                    return

        name = f"distfusion-warm-{self.query_id[:8]}"
        threading.Thread(target=warm, name=name, daemon=True).start()

    def _spark_input(self, stage: Stage, scan: SourceScan) -> tuple:
        """:func:`spark_input` of ``stage``, made once per stage of the query."""
        if stage.stage_id not in self._spark_inputs:
            self._spark_inputs[stage.stage_id] = spark_input(self.sc, stage, scan)
        return self._spark_inputs[stage.stage_id]

    def _collect_metrics(self) -> None:
        """Nothing to ask: every task's metrics came back with its Spark record."""

    def _poll_metrics(self) -> tuple[int, int] | None:
        """Nothing to ask the executors (see :meth:`_collect_metrics`)."""
        return None

    def _lost_workers(self) -> set[str]:
        """Workers holding outputs of this query that no longer answer."""
        lost = set()
        for url in set(self.placement.values()):
            try:
                self.transport.stats(url, timeout_s=5.0)
            except WorkerUnavailableError:
                lost.add(url)
        return lost

    def _run_lost_again(self, lost: set[str]) -> None:
        """Run again every task whose output was on a ``lost`` worker, round by round."""
        log.warning("query %s: lost worker(s) %s; their tasks run again", self.query_id[:8], lost)
        again = {key for key, url in self.placement.items() if url in lost}
        for key in again:
            del self.placement[key]
        for round_ in self._rounds:
            tasks = sorted(key for key in again if key[0] in round_)
            if tasks:
                self._run_tasks(tasks)

    def _task_output(self, stage_id: int, task_index: int) -> tuple[tuple[int, ...], ...]:
        """What the task reported with its Spark record (no call to its worker)."""
        return self._task_stats[(stage_id, task_index)]

