"""What every runtime provides, and the coordinator loop shared by worker runtimes.

See docs/architecture.md for where runtimes sit and how adaptive execution uses
:class:`QueryRun`.

```
coordinator (WorkerQueryRun)                  workers (via a WorkerTransport)
  assign each new task a worker URL (routing;
    kept for the whole query)
  set_plan(task) for every task, ────────────> tasks queue, run, read inputs
    stage by stage, producers first               from producer tasks, hold output
  run_stages only: wait, measure <──────────── task_stats(task): rows, bytes
                                                  per output partition
  leaf stage reading a work unit feed:
    stream_feed(task, units) per task  ─────────> units into the task's bounded inbox
  head stage: read its inputs  <────────────── execute_partition(task, partition)
    run the fragment here, stream batches
  finally: cancel_query on every worker ─────> free whatever is left
```

:func:`execute_graph` runs a graph at once (partitions freed after their
planned reads); :meth:`Runtime.start_query` runs it stage by stage (outputs
kept until the query is closed). Both are one :class:`WorkerQueryRun`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa

from distfusion.coordinator.feeds import QueryFeeds, has_feeds
from distfusion.errors import DistfusionError, QueryCancelledError, TaskError
from distfusion.io.write import WriteSpec, WrittenFile, write_part
from distfusion.metrics.observer import QueryObserver, observer_for
from distfusion.planner.config import RuntimeProfile
from distfusion.protocol.task_plan import TaskKey, TaskPlan
from distfusion.stages import Stage, StageGraph
from distfusion.transport.base import (
    AbortsReads,
    ReportsFailedTasks,
    ReportsQueryMetrics,
    WorkerTransport,
    WritesParts,
)
from distfusion.worker.execute_task import stream_head_stage
from distfusion.worker.head_parts import HeadPart, head_parts, run_part
from distfusion.worker.memory import TaskMemory, machine_memory_bytes
from distfusion.worker.stream_inputs import InputStreams

__all__ = [
    "Runtime",
    "RuntimeProfile",
    "QueryRun",
    "MapsHeadParts",
    "WritesHeadParts",
    "StageStats",
    "Routing",
    "round_robin",
    "WorkerQueryRun",
    "execute_graph",
    "task_threads",
]


@dataclass(frozen=True)
class StageStats:
    """What a finished stage produced, measured on the workers.

    Adaptive execution plans the rest of a query with these figures instead
    of estimates (Spark's AQE reads ``MapOutputStatistics`` the same way).

    Attributes:
        stage_id: the stage.
        partition_rows: rows of each output partition, summed over the tasks
            (``len == stage.output.num_partitions``).
        partition_bytes: Arrow bytes (``RecordBatch.nbytes``, the in-memory
            size estimates also use) of each output partition, summed over
            the tasks.
        elapsed_s: wall seconds from the stage's start to its last task's end.
    """

    stage_id: int
    partition_rows: tuple[int, ...]
    partition_bytes: tuple[int, ...]
    elapsed_s: float = 0.0

    @property
    def rows(self) -> int:
        """Rows of the whole output."""
        return sum(self.partition_rows)

    @property
    def bytes(self) -> int:
        """Arrow bytes of the whole output."""
        return sum(self.partition_bytes)


@runtime_checkable
class QueryRun(Protocol):
    """One query's execution on a runtime, stage by stage (adaptive execution).

    ```
    run = runtime.start_query(query_id)
    stats = run.run_stages(graph_1, [1, 2])     # run stages 1 and 2, keep outputs
    ...                                         # plan again with stats
    for batch in run.stream_head(graph_2): ...  # the rest, then the head stage
    run.close()                                 # free every output of the query
    ```

    Stage ids stay valid across graphs: a stage that ran keeps its id, output
    and workers in every later graph of the query, where consumers may read it
    differently than first planned (a shuffle output read as a broadcast, its
    partitions coalesced into fewer tasks, see :attr:`StageInput.groups`).

    Optional abilities, for results that stay distributed (``to_spark``,
    ``write_*``), used when a run declares them (as :class:`WorkerQueryRun`
    does): :class:`MapsHeadParts` and :class:`WritesHeadParts`.
    """

    def run_stages(self, graph: StageGraph, stage_ids: list[int]) -> dict[int, StageStats]:
        """Run the stages ``stage_ids`` of ``graph`` and wait for them to finish.

        Every input of those stages ran in an earlier call or is in
        ``stage_ids`` (producers first). Outputs are kept until :meth:`close`.

        Returns:
            Stage id -> its :class:`StageStats`.

        Raises:
            TaskError: a task failed (names the stage, the task and the worker).
            TransportError: a worker could not be reached.
        """
        ...

    def stream_head(self, graph: StageGraph) -> Generator[pa.RecordBatch, None, None]:
        """Run the stages of ``graph`` that have not run yet, then the head stage.

        Yields the head stage's batches. Raises as :meth:`run_stages`.
        """
        ...

    def close(self) -> None:
        """Cancel whatever still runs and free every output of the query. Idempotent."""
        ...


@runtime_checkable
class MapsHeadParts(Protocol):
    """A :class:`QueryRun` that runs a function over the head stage's parts where they are."""

    def map_head_parts(self, graph: StageGraph, fn, split: bool = True) -> list:
        """``fn(part, attempt, batches)`` over every part of ``graph``'s head, its results.

        Without this ability the head runs whole on the coordinator, as part
        0 (:func:`~distfusion.coordinator.results.map_head_parts`).
        """
        ...


@runtime_checkable
class WritesHeadParts(Protocol):
    """A :class:`QueryRun` that writes each part of the head stage as a task of a write job."""

    def write_head_parts(self, graph: StageGraph, spec: WriteSpec) -> list[list[WrittenFile]]:
        """Write every part of ``graph``'s head as ``spec`` says; each part's committed files.

        Without this ability: :class:`MapsHeadParts` with the writer, or the
        head whole on the coordinator.
        """
        ...


Routing = Callable[[StageGraph, list[str]], dict[tuple[int, int], str]]
"""Assigns every non-head task ``(stage_id, task_index)`` a worker URL."""


@runtime_checkable
class Runtime(Protocol):
    """Runs a :class:`StageGraph` and streams the head stage's batches.

    Implementations: :class:`~distfusion.runtime.local.LocalRuntime`,
    :class:`~distfusion.runtime.flight.FlightRuntime`,
    :class:`~distfusion.runtime.spark.SparkRuntime`; each has a line in
    :data:`distfusion.runtime.registry.RUNTIMES`, and the contract suite
    (``tests/contract/``) runs on every entry. See docs/architecture.md.

    What a runtime tells the planner and the coordinator beyond these methods
    (task sizes, a task cap, broadcast copies, remote workers, Spark
    DataFrame reads, an explain note) it declares in one place,
    :meth:`profile`, every field with a default.

    Attributes:
        name: the registry name (``"local"``, ``"flight"``, ``"spark"``).
    """

    name: str

    def profile(self) -> RuntimeProfile:
        """What this runtime tells the planner and the coordinator (:class:`RuntimeProfile`).

        Asked before each planning. The default: every field's default (a
        runtime without this method plans with them too,
        :meth:`RuntimeProfile.of`).
        """
        return RuntimeProfile()

    def num_workers(self) -> int:
        """Workers available now; caps the tasks per stage during planning.

        Raises:
            PlanningError: no worker is available.
        """
        ...

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """Run ``graph``; yields the result batches.

        Closing the iterator early cancels every task of the query.

        Raises:
            TaskError: a task failed (names the stage, the task and the worker).
            TransportError: a worker could not be reached.
        """
        ...

    def start_query(self, query_id: str) -> QueryRun:
        """Start running query ``query_id`` stage by stage (see :class:`QueryRun`)."""
        ...

    def stats(self) -> dict[str, dict]:
        """What every worker holds now, by worker URL (the Spark master's URL on Spark).

        Returns:
            URL -> a dict with at least ``"live_tasks"`` (tasks queued or
            running) and ``"bytes_held"`` (bytes of stage outputs kept); both
            are zero between queries.

        Raises:
            WorkerUnavailableError: a worker cannot be reached.
        """
        ...

    def close(self) -> None:
        """Release the runtime's threads, processes or sessions."""
        ...


def round_robin(graph: StageGraph, urls: list[str]) -> dict[tuple[int, int], str]:
    """Default routing: tasks go to consecutive workers, round-robin.

    Each stage continues where the previous one stopped, so one-task stages
    spread out too.
    """
    placement: dict[tuple[int, int], str] = {}
    i = 0
    for stage in graph.stages[:-1]:
        for t in range(stage.num_tasks):
            placement[(stage.stage_id, t)] = urls[i % len(urls)]
            i += 1
    return placement


def default_target_partitions() -> int:
    """Threads one task may use inside DataFusion: the machine's cores."""
    return max(1, os.cpu_count() or 1)


def task_threads(cores: int, num_tasks: int, slots: int) -> int:
    """DataFusion partitions per task: ``cores`` shared by a stage's concurrent tasks.

    Tasks of one stage already run in parallel (at most ``slots`` at once); giving
    each every core would make DataFusion repartition inside each task on top of
    the stage's own split. Used where tasks share cores: the local runtime's
    workers, a Spark executor's task slots.
    """
    return max(1, cores // max(1, min(num_tasks, slots)))


def _run_each(fn: Callable, items: list, threads: int) -> list:
    """``fn(item)`` for every item, ``threads`` at a time; each result in order.

    Every call runs to its end before anything is raised.

    Raises:
        Exception: the first failed item's error.
    """
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        raise failed[0]
    return [f.result() for f in futures]


FAILURE_POLL_S = 0.5
"""Seconds between two polls of a running query's workers for failed tasks
(:meth:`WorkerQueryRun.fail`): a task's failure ends its query within about this
long, however long its other tasks would run on. One ``failed_tasks`` call per
worker of the query per poll (a Flight action; in process, a dict lookup)."""


class WorkerQueryRun:
    """A :class:`QueryRun` on workers reached through a :class:`WorkerTransport`.

    The local and the Flight runtimes run every query through one, stage by
    stage for adaptive execution (:meth:`Runtime.start_query`) or all at once
    (:func:`execute_graph`)::

        run_stages(g1, [1, 2])   place stages 1, 2; set_plan producers first;
                                 wait for every task (task_stats); StageStats
        run_stages(g2, [4])      stage 4 reads 1 and 2 where they ran
        stream_head(g3)          place and deliver the stages not run yet,
                                 run the head stage here; then close()
        close()                  cancel_query on every worker used

    While stages run, a thread polls their workers for failed tasks
    (``failed_tasks``, every :data:`FAILURE_POLL_S`): the first failure fails
    the query at once (:meth:`fail`), so its other tasks are cancelled and the
    caller gets the task's error, rather than when a reader of the failed
    task's output gets there (after the tasks before it in the reader's
    order, however long they run).

    Placement persists for the whole query: a task keeps its worker in every
    later graph, so a consumer planned later reads a finished stage where it
    ran. Stages placed later continue the round-robin where it stopped (the
    routing sees only the new stages and the URLs rotated by the tasks
    already placed).

    Args:
        query_id: the query's UUID; names its tasks on every worker (the
            graphs' own ``query_id`` is not used).
        transport: reaches the workers.
        urls: worker URLs (non-empty), fixed for the query.
        routing: assigns tasks to URLs (default :func:`round_robin`).
        target_partitions: DataFusion threads per task (default: the cores).
        keep_outputs: workers keep every output partition until :meth:`close`
            (stage by stage: a later graph may read a finished stage again,
            differently). False frees each partition after its planned
            readers, as a graph run at once needs.
        on_close: called once by :meth:`close`, after the workers were told
            (the Flight runtime ends the query's keepalives there).
        head_memory_bytes: the head stage's memory pool when the graph sets
            no ``memory_per_task_bytes``, bytes; None: a quarter of the
            machine's memory. It spills to a temporary directory of the
            query, deleted by :meth:`close`.
        observer: told what runs and each task's metrics (default: the one
            registered for ``query_id``, :func:`~distfusion.metrics.observer_for`).
            Workers keep their tasks' metrics; :meth:`close` asks each
            worker used for them once (``query_metrics``), before
            ``cancel_query`` drops them: one call per worker per query.
        remote_workers: the workers are other processes (the Flight
            runtime): the head stage streams its inputs without tokio
            threads beyond the cores
            (:class:`~distfusion.worker.stream_inputs.PullSlots`).

    Raises:
        ValueError: ``urls`` is empty.
    """

    def __init__(
        self,
        query_id: str,
        transport: WorkerTransport,
        urls: list[str],
        routing: Routing = round_robin,
        target_partitions: int | None = None,
        keep_outputs: bool = True,
        on_close: Callable[[], None] | None = None,
        head_memory_bytes: int | None = None,
        observer: QueryObserver | None = None,
        remote_workers: bool = False,
    ) -> None:
        if not urls:
            msg = f"query {query_id} needs at least one worker URL"
            raise ValueError(msg)
        self.query_id = query_id
        self.transport = transport
        self.urls = list(urls)
        self.routing = routing
        self.target_partitions = target_partitions or default_target_partitions()
        self.keep_outputs = keep_outputs
        self.placement: dict[tuple[int, int], str] = {}
        """``(stage_id, task_index)`` -> worker URL of every task delivered so far."""
        self._delivered: dict[int, int] = {}  # stage id -> its task count
        self._started: dict[int, float] = {}  # stage id -> monotonic time of delivery
        self._stats: dict[int, StageStats] = {}
        self._on_close = on_close
        self.head_memory_bytes = head_memory_bytes
        self.remote_workers = remote_workers
        self._head_spill_dir: str | None = None
        self._head_writers: set[str] = set()  # workers that wrote head parts (cancelled too)
        self._closed = False
        self._lock = threading.Lock()
        self._failure: TaskError | None = None  # the task error that failed the query (fail)
        self._watching = threading.Event()  # set once the failure watch started
        self._closing = threading.Event()  # set by close(): the watch ends
        # Work unit feeds: a provider's failure tears the query down at once.
        self.feeds = QueryFeeds(query_id, on_error=lambda err: self.close(), replayable=False)
        self.observer = observer if observer is not None else observer_for(query_id)
        self.observer.add_refresher(self._poll_metrics)
        self.observer.add_canceller(self.close)

    # ------------------------------------------------------------- QueryRun
    def run_stages(self, graph: StageGraph, stage_ids: list[int]) -> dict[int, StageStats]:
        """See :meth:`QueryRun.run_stages`.

        Stages of ``stage_ids`` that ran in an earlier call are not run again;
        their stats are returned again. On any error the run is closed.

        Raises:
            ValueError: a stage is not in ``graph``, is its head stage, or
                reads a stage that has not run and is not in ``stage_ids``.
            QueryCancelledError: the run was closed.
            TaskError: a task failed (names the stage, the task and the worker).
            TransportError: a worker could not be reached.
        """
        self._check_open()
        with self._closed_on_error():
            order = {s.stage_id: i for i, s in enumerate(graph.stages)}
            unknown = [sid for sid in stage_ids if sid not in order]
            if unknown or graph.head.stage_id in stage_ids:
                msg = (
                    f"run_stages runs non-head stages of the graph; got {list(stage_ids)} "
                    f"(stages {sorted(order)}, head {graph.head.stage_id})"
                )
                raise ValueError(msg)
            wanted = sorted(set(stage_ids), key=order.__getitem__)
            self.observer.planned(graph)
            new = [graph.stage(sid) for sid in wanted if sid not in self._delivered]
            self._deliver(graph, new)
            for stage in new:
                self._stats[stage.stage_id] = self._measure(stage)
        return {sid: self._stats[sid] for sid in wanted}

    def stream_head(self, graph: StageGraph) -> Generator[pa.RecordBatch, None, None]:
        """See :meth:`QueryRun.stream_head`.

        Delivers the stages not run yet (producers first) without waiting for
        them, then runs the head stage here, reading its inputs as
        :meth:`TaskPlan.input_reads` says (coalesced groups and broadcasts
        included). Ends the query: when the batches are all read, the
        iterator is closed or an error is raised, the run is closed.

        Raises:
            ValueError: a stage reads a stage that is not in ``graph`` and never ran.
            QueryCancelledError: the run was closed.
            TaskError: a task failed, here or on a worker.
            TransportError: a worker could not be reached.
        """
        try:
            head = graph.head
            plan = self._head_plan(graph)
            # named like a worker's spill root: deleted by the next one made
            # should this process die before close() (worker.memory.remove_stale_roots)
            prefix = f"distfusion-spill-{os.getpid()}-head-{self.query_id[:8]}-"
            self._head_spill_dir = tempfile.mkdtemp(prefix=prefix)
            memory = TaskMemory(self.head_budget(graph), self._head_spill_dir)

            def opener(url: str, producer: TaskKey, part: int):
                return lambda: self.transport.execute_partition(url, producer, part)

            def read_input(i: int) -> InputStreams:
                return InputStreams(opener(*read) for read in plan.input_reads(i))

            yield from stream_head_stage(
                plan,
                read_input,
                self.feeds.local_chunks(head),
                memory,
                cancelled=lambda: self._closed,
                on_metrics=self.observer.task_finished,
                remote_inputs=self.remote_workers,
            )
        except DistfusionError as exc:
            self.close()
            self._raise_feed_error(exc)
            self._raise_failure(exc)
            raise
        finally:
            self.close()

    def head_budget(self, graph: StageGraph) -> int:
        """The head stage's memory pool, bytes (the one place it is resolved).

        The graph's ``memory_per_task_bytes`` (the query's setting), else
        ``head_memory_bytes``, else a quarter of the machine's memory.
        """
        return graph.memory_per_task_bytes or self.head_memory_bytes or machine_memory_bytes() // 4

    @contextlib.contextmanager
    def _closed_on_error(self) -> Iterator[None]:
        """Close the run when the block raises (a feed's error first: :meth:`_raise_feed_error`)."""
        try:
            yield
        except DistfusionError as exc:
            self.close()
            self._raise_feed_error(exc)
            self._raise_failure(exc)
            raise
        except BaseException:
            self.close()
            raise

    def _head_plan(self, graph: StageGraph) -> TaskPlan:
        """Deliver every stage of ``graph`` not delivered yet; the head stage's task plan."""
        self._check_open()
        self.observer.planned(graph)
        rest = [s for s in graph.stages[:-1] if s.stage_id not in self._delivered]
        self._deliver(graph, rest)
        self._before_head()
        head = graph.head
        return TaskPlan.for_task(
            self.query_id,
            head,
            0,
            self._input_workers(head),
            self.target_partitions,
            memory_per_task_bytes=graph.memory_per_task_bytes,
        )

    def head_parts(self, graph: StageGraph, split: bool = True) -> list[HeadPart]:
        """Run every stage of ``graph`` but the head; the head cut into parts.

        For results that stay distributed (``to_spark``, ``write_parquet``):
        the caller runs each part where it likes (:func:`~distfusion.worker.head_parts.run_part`),
        reading the head's inputs from the workers, which keep them until
        :meth:`close`. See :func:`~distfusion.worker.head_parts.head_parts`
        for how the head is cut (``split``: one part per producer task when
        the head is row-wise).

        Raises:
            As :meth:`run_stages`; on any error the run is closed.
        """
        with self._closed_on_error():
            return head_parts(self._head_plan(graph), graph.head, split)

    def map_head_parts(
        self,
        graph: StageGraph,
        fn: Callable[[int, int, Iterator[pa.RecordBatch]], object],
        split: bool = True,
    ) -> list:
        """Run the stages of ``graph``, then ``fn(part, attempt, batches)`` for every head part.

        Here the parts run in threads of this process (as many at once as
        there are workers), reading the head's inputs through the transport:
        on the local runtime these are the workers' own threads; on Flight,
        the coordinator reads each part's inputs (streamed, one part's rows
        at a time per thread) from the workers. ``attempt`` is 0 (no retry).
        A head reading a work unit feed runs whole, as :meth:`stream_head`
        runs it. The run stays open; the caller closes it.

        Returns:
            ``fn``'s results, by part.

        Raises:
            As :meth:`head_parts`, and whatever ``fn`` raises (the first
            failed part's error, after every part stopped).
        """
        parts = self.head_parts(graph, split)
        if has_feeds(graph.head):  # its feed streams from here: the head runs here, whole
            return [fn(0, 0, self.stream_head(graph))]
        budget = self.head_budget(graph)
        threads = task_threads(self.target_partitions, len(parts), len(self.urls))

        def one(part: HeadPart):
            # a spill root's name: deleted by the next one made if this process is killed
            prefix = f"distfusion-spill-{os.getpid()}-part-{self.query_id[:8]}-"
            with tempfile.TemporaryDirectory(prefix=prefix) as spill:
                memory = TaskMemory(budget // max(1, min(len(parts), len(self.urls))), spill)
                batches = run_part(part, self.transport, memory, lambda: self._closed, threads)
                return fn(part.index, 0, batches)

        return _run_each(one, parts, min(len(parts), len(self.urls)))

    def write_head_parts(self, graph: StageGraph, spec: WriteSpec) -> list[list[WrittenFile]]:
        """Run the stages of ``graph``; every head part writes its rows as a task of ``spec``'s job.

        A transport that can (Flight: ``write_part``) has the workers write:
        each part of a row-wise head goes to the worker holding the output it
        reads (nothing crosses the network), a single part to the first
        worker. Otherwise (in process) the parts run as :meth:`map_head_parts`
        runs them. Tasks are committed; the caller commits or aborts the job.

        Returns:
            Each part's committed files, by part.

        Raises:
            As :meth:`map_head_parts`; TaskError naming the head stage and the
            part when a worker failed to write it.
        """
        transport = self.transport
        if not isinstance(transport, WritesParts):
            return self.map_head_parts(graph, functools.partial(write_part, spec))
        parts = self.head_parts(graph)
        if has_feeds(graph.head):  # its feed streams from here: the head runs here, whole
            return [write_part(spec, 0, 0, self.stream_head(graph))]

        def where(part: HeadPart) -> str:
            for i, tasks in enumerate(part.tasks):
                if tasks:  # a split part reads one producer task: write where it ran
                    return part.plan.input_workers[i][tasks[0]]
            return self.urls[part.index % len(self.urls)]

        def one(part: HeadPart) -> list[WrittenFile]:
            body = json.dumps({"part": part.to_json(), "spec": spec.to_json()})
            what = f"writing part {part.index} of stage {part.plan.key.stage_id}"
            session = part.plan.session
            stores = session.store_specs() if session is not None else ()
            url = where(part)
            with self._lock:  # a worker no stage task ran on holds the query too
                self._head_writers.add(url)
            files = transport.write_part(url, body, what, part.plan.key.query_id, stores)
            return [WrittenFile.from_json(f) for f in files]

        return _run_each(one, parts, len(parts))

    def _raise_feed_error(self, exc: DistfusionError) -> None:
        """Raise the feed failure that tore the query down, rather than what it caused."""
        err = self.feeds.error
        if err is not None and exc is not err:
            raise err from exc

    def fail(self, err: TaskError) -> None:
        """Fail the query with task error ``err``: close it now (its tasks are cancelled).

        The caller's wait (:meth:`run_stages`, :meth:`stream_head`) raises
        ``err`` instead of the cancellation it causes. Called by the failure
        watch (:data:`FAILURE_POLL_S`); the first error wins; a closed run
        stays as it is.
        """
        with self._lock:
            if self._closed or self._failure is not None:
                return
            self._failure = err
        self.close()

    def _raise_failure(self, exc: DistfusionError) -> None:
        """Raise the task error that failed the query (:meth:`fail`), rather than what it caused."""
        err = self._failure
        if err is not None and exc is not err:
            raise err from exc

    def _watch_failures(self) -> None:
        """Start polling the workers of the query for failed tasks (once; see :meth:`fail`)."""
        transport = self.transport
        if not isinstance(transport, ReportsFailedTasks) or self._watching.is_set():
            return
        self._watching.set()

        def watch() -> None:
            while not self._closing.wait(FAILURE_POLL_S):
                for url in sorted(set(self.placement.copy().values())):
                    try:
                        errors = transport.failed_tasks(url, self.query_id)
                    except Exception:  # lost or closed meanwhile: other paths report it
                        continue
                    if errors:
                        self.fail(errors[0])
                        return

        name = f"distfusion-failures-{self.query_id[:8]}"
        threading.Thread(target=watch, name=name, daemon=True).start()

    def close(self) -> None:
        """See :meth:`QueryRun.close`: ``cancel_query`` on every worker used. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        try:
            self.feeds.close()
            if isinstance(self.transport, AbortsReads):  # blocked reads of this process end now
                reason = self._failure or QueryCancelledError(f"query {self.query_id} was closed")
                self.transport.abort_query(self.query_id, reason)
            self._collect_metrics()
            self._cancel_on_workers(sorted(set(self.placement.values()) | self._head_writers))
        finally:
            if self._head_spill_dir is not None:
                shutil.rmtree(self._head_spill_dir, ignore_errors=True)
            if self._on_close is not None:
                self._on_close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _cancel_on_workers(self, urls: list[str]) -> None:
        """Tell the workers at ``urls`` to cancel the query and free its state."""
        for url in urls:
            self.transport.cancel_query(url, self.query_id)

    # ------------------------------------------------------------- internals
    def _collect_metrics(self) -> None:
        """Ask every worker used for its tasks' metrics (once per worker), for the observer.

        A worker that cannot answer (lost, or a transport without
        ``query_metrics``) is skipped: its tasks have no metrics.
        """
        self._poll_metrics()

    def _poll_metrics(self) -> tuple[int, int] | None:
        """Metrics of the tasks finished so far on every worker used, to the observer."""
        transport = self.transport
        if not isinstance(transport, ReportsQueryMetrics):
            return None
        for url in sorted(set(self.placement.copy().values())):
            try:
                self.observer.tasks_finished(transport.query_metrics(url, self.query_id))
            except Exception:  # lost worker, or closed meanwhile: best effort
                continue
        return None

    def _check_open(self) -> None:
        if self._closed:
            msg = f"query {self.query_id} was closed"
            raise QueryCancelledError(msg)

    def _place(self, graph: StageGraph, stages: list[Stage]) -> None:
        """Give every task of ``stages`` (not placed yet) a worker URL."""
        if not stages:
            return
        shift = len(self.placement) % len(self.urls)
        urls = self.urls[shift:] + self.urls[:shift]
        proposed = self.routing(StageGraph(self.query_id, (*stages, graph.head)), urls)
        for stage in stages:
            for t in range(stage.num_tasks):
                key = (stage.stage_id, t)
                if key not in proposed:
                    msg = f"routing {self.routing!r} placed no worker for stage {key[0]} task {t}"
                    raise ValueError(msg)
                self.placement[key] = proposed[key]

    def _input_workers(self, stage: Stage) -> tuple[tuple[str, ...], ...]:
        workers = []
        for inp in stage.inputs:
            if inp.stage_id not in self._delivered:
                msg = (
                    f"stage {stage.stage_id} reads stage {inp.stage_id}, which has not "
                    "run and is not among the stages to run"
                )
                raise ValueError(msg)
            n = self._delivered[inp.stage_id]
            workers.append(tuple(self.placement[(inp.stage_id, j)] for j in range(n)))
        return tuple(workers)

    def _deliver(self, graph: StageGraph, stages: list[Stage]) -> None:
        """Place ``stages`` (producers first) and send every task plan.

        Every task of a stage is delivered before any task of a later stage:
        the order the workers' FIFO pools rely on to never deadlock.
        """
        self._place(graph, stages)
        n_workers = len(self.urls)
        for stage in stages:
            inputs = self._input_workers(stage)
            threads = task_threads(self.target_partitions, stage.num_tasks, n_workers)
            self._started[stage.stage_id] = time.monotonic()
            self.observer.stage_started(stage)
            for t in range(stage.num_tasks):
                plan = TaskPlan.for_task(
                    self.query_id,
                    stage,
                    t,
                    inputs,
                    threads,
                    keep_output=self.keep_outputs,
                    memory_per_task_bytes=graph.memory_per_task_bytes,
                )
                self.transport.set_plan(self.placement[(stage.stage_id, t)], plan)
            if has_feeds(stage):  # stream each feed partition to its task

                def url(t: int, sid: int = stage.stage_id) -> str:
                    return self.placement[(sid, t)]

                self.feeds.push(self.transport, stage, url)
            self._delivered[stage.stage_id] = stage.num_tasks
        if stages:
            self._watch_failures()

    def _measure(self, stage: Stage) -> StageStats:
        """Wait for every task of ``stage``; its output summed over the tasks."""
        n = stage.output.num_partitions
        rows, nbytes = [0] * n, [0] * n
        for t in range(stage.num_tasks):
            task_rows, task_bytes = self._task_output(stage.stage_id, t)
            assert len(task_rows) == n == len(task_bytes), (stage.stage_id, t, task_rows, n)
            for p in range(n):
                rows[p] += task_rows[p]
                nbytes[p] += task_bytes[p]
        elapsed_s = time.monotonic() - self._started[stage.stage_id]
        return StageStats(stage.stage_id, tuple(rows), tuple(nbytes), elapsed_s)

    def _before_head(self) -> None:
        """Called once every stage was delivered, before the head stage reads its inputs."""

    def _task_output(self, stage_id: int, task_index: int) -> tuple[tuple[int, ...], ...]:
        """``(rows, bytes)`` per output partition of a task, once it is done (asks its worker)."""
        key = TaskKey(self.query_id, stage_id, task_index)
        return self.transport.task_stats(self.placement[(stage_id, task_index)], key)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"WorkerQueryRun({self.query_id[:8]}, stages run {sorted(self._delivered)}, {state})"


def execute_graph(
    graph: StageGraph,
    transport: WorkerTransport,
    urls: list[str],
    routing: Routing = round_robin,
    target_partitions: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run ``graph`` on the workers at ``urls``; yield the head stage's batches.

    A :class:`WorkerQueryRun` of query ``graph.query_id`` that frees each
    partition after its planned reads, streaming the head at once. Every task
    plan is delivered before the head stage starts reading, stage by stage
    (the order the workers' FIFO pools rely on). Whatever happens — the
    result fully read, an error, the iterator closed early — every worker is
    told to cancel the query and free its state.

    Args:
        graph: the planned query.
        transport: reaches the workers.
        urls: worker URLs from the resolver (non-empty).
        routing: assigns tasks to URLs (default :func:`round_robin`).
        target_partitions: DataFusion threads per task (default: the cores).

    Raises:
        TaskError: a task failed, here or on a worker.
        QueryCancelledError: a worker cancelled the query.
        TransportError: a worker could not be reached.
    """
    run = WorkerQueryRun(
        graph.query_id, transport, urls, routing, target_partitions, keep_outputs=False
    )
    try:
        yield from run.stream_head(graph)
    finally:
        run.close()
