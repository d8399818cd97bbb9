"""Watching one query run: the tasks' metrics as they come back, and its progress.

The coordinator makes a :class:`QueryObserver` per run and registers it under
the run's query id (:func:`observing`); the runtime running the query finds it
with :func:`observer_for` (the Runtime protocol stays as it is) and tells it
what it learns on its own paths::

    DistributedDataFrame.execute_stream          runtime (QueryRun)
      observer = QueryObserver(query_id) ──────>   observer_for(query_id)
      with observing(observer):                    .planned(graph)  each graph it runs
        ... result batches ...                     .stage_started(stage)
                                                   .tasks_finished([TaskMetrics])
      observer.tasks -> QueryMetrics               .add_refresher(poll)  live progress
      observer.cancel()  (another thread) ──────>   .add_canceller(run.close)

A progress display (the CLI's status line, ``progress=True``) calls
:meth:`QueryObserver.refresh` about once a second, which runs the runtime's
pollers (the local and Flight runtimes ask each worker for the metrics of the
query's finished tasks; Spark's status tracker gives its tasks done), then
:meth:`QueryObserver.progress`. Without a display nothing polls.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from distfusion.metrics.task import TaskMetrics
from distfusion.stages import Stage, StageGraph

__all__ = ["Progress", "QueryObserver", "observer_for", "observing"]

log = logging.getLogger("distfusion.metrics")


@dataclass(frozen=True)
class Progress:
    """How far a query got.

    Attributes:
        stages_done: stages whose every task finished (head stage included).
        stages_total: stages of the latest plan (adaptive execution may change it).
        tasks_done: tasks finished.
        tasks_total: tasks of the latest plan.
        rows: rows produced by the finished tasks, all stages.
        result_rows: rows of the result streamed so far.
        elapsed_s: seconds since the run started.
    """

    stages_done: int
    stages_total: int
    tasks_done: int
    tasks_total: int
    rows: int
    result_rows: int
    elapsed_s: float

    def describe(self) -> str:
        """One line: ``stages 2/4, tasks 9/12, 1,234,567 rows, 3.2 s``."""
        return (
            f"stages {self.stages_done}/{self.stages_total}, tasks {self.tasks_done}/"
            f"{self.tasks_total}, {self.rows:,} rows, result {self.result_rows:,} rows, "
            f"{self.elapsed_s:.1f} s"
        )


class QueryObserver:
    """Collects what one run of a query did (see the module's docstring).

    Thread-safe: runtimes report from their own threads.

    Args:
        query_id: the run's query id.
        label: a short name of the query for Spark's UI (the SQL's first line).
    """

    def __init__(self, query_id: str, label: str = "") -> None:
        self.query_id = query_id
        self.label = label
        self.started = time.monotonic()
        self.graph: StageGraph | None = None
        self.result_rows = 0
        self._tasks: dict[tuple[int, int], TaskMetrics] = {}
        self._stages: dict[int, int] = {}  # stage id -> task count, every stage seen
        self._refreshers: list[Callable[[], tuple[int, int] | None]] = []
        self._cancellers: list[Callable[[], None]] = []
        self.cancelled = False
        self._live: dict[int, tuple[int, int]] = {}  # poller index -> (tasks done, total)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- runtimes
    def planned(self, graph: StageGraph) -> None:
        """``graph`` is the plan the runtime runs now (the latest of an adaptive run)."""
        if graph is self.graph:
            return
        log.info(
            "query %s: running %d stages, %d tasks",
            self.query_id[:8],
            len(graph.stages),
            sum(s.num_tasks for s in graph.stages),
            extra={"query_id": self.query_id},
        )
        with self._lock:
            self.graph = graph
            for s in graph.stages:
                self._stages[s.stage_id] = s.num_tasks

    def stage_started(self, stage: Stage) -> None:
        """The tasks of ``stage`` were handed out."""
        with self._lock:
            self._stages[stage.stage_id] = stage.num_tasks

    def tasks_finished(self, tasks: list[TaskMetrics]) -> None:
        """Tasks finished with these metrics (a task reported again replaces itself)."""
        with self._lock:
            for m in tasks:
                self._tasks[(m.stage_id, m.task_index)] = m
        if log.isEnabledFor(logging.DEBUG):
            for m in tasks:
                log.debug(
                    "query %s stage %d task %d on %s: %d rows, %.3f s, cpu %.3f s",
                    self.query_id[:8],
                    m.stage_id,
                    m.task_index,
                    m.worker,
                    m.output_rows,
                    m.elapsed_s,
                    m.cpu_s,
                    extra={
                        "query_id": self.query_id,
                        "stage_id": m.stage_id,
                        "task_index": m.task_index,
                    },
                )

    def task_finished(self, task: TaskMetrics) -> None:
        """One task finished (see :meth:`tasks_finished`)."""
        self.tasks_finished([task])

    def add_refresher(self, poll: Callable[[], tuple[int, int] | None]) -> None:
        """Call ``poll`` on each :meth:`refresh`.

        ``poll`` may report tasks finished through :meth:`tasks_finished`,
        and returns ``(tasks done, tasks total)`` the runtime counts itself
        (Spark's tracker: tasks of the running job), or None.
        """
        with self._lock:
            self._refreshers.append(poll)

    def add_canceller(self, cancel: Callable[[], None]) -> None:
        """Call ``cancel`` (a run's ``close``) when :meth:`cancel` is called; at once if it was."""
        with self._lock:
            self._cancellers.append(cancel)
            now = self.cancelled
        if now:
            cancel()

    def cancel(self) -> None:
        """Stop the run from any thread: every canceller the runtime added is called once.

        The result stream's ``close`` from a thread other than the one reading
        it (:class:`~distfusion.context.ResultStream`): the runs it started
        close, so their tasks are cancelled and the reading thread's waits end.
        Errors of a canceller are logged, never raised.
        """
        with self._lock:
            self.cancelled = True
            cancellers, self._cancellers = self._cancellers, []
        for cancel in cancellers:
            try:
                cancel()
            except Exception as exc:  # best effort: the reading thread is interrupted anyway
                log.debug("query %s: cancelling failed: %s", self.query_id[:8], exc)

    def description(self, stage_ids: list[int]) -> str:
        """What a Spark job running ``stage_ids`` is, for Spark's UI and event log."""
        stages = ", ".join(str(s) for s in stage_ids)
        what = f"stage {stages}" if len(stage_ids) == 1 else f"stages {stages}"
        label = f": {self.label}" if self.label else ""
        return f"distfusion query {self.query_id[:8]} {what}{label}"

    # ---------------------------------------------------------------- readers
    @property
    def tasks(self) -> list[TaskMetrics]:
        """Every task's metrics reported so far."""
        with self._lock:
            return list(self._tasks.values())

    def refresh(self) -> None:
        """Run the runtime's pollers (errors are logged, never raised)."""
        with self._lock:
            polls = list(enumerate(self._refreshers))
        for i, poll in polls:
            try:
                live = poll()
            except Exception as exc:  # a worker gone: progress is best effort
                log.debug("query %s: progress poll failed: %s", self.query_id[:8], exc)
                continue
            if live is not None:
                with self._lock:
                    self._live[i] = live

    def progress(self) -> Progress:
        """Where the run is now (as of the last reports and :meth:`refresh`)."""
        with self._lock:
            counts = dict(self._stages)
            if self.graph is not None:
                current = {s.stage_id for s in self.graph.stages}
                done_ids = {sid for sid, _ in self._tasks}
                counts = {sid: n for sid, n in counts.items() if sid in current or sid in done_ids}
            done = dict.fromkeys(counts, 0)
            rows = 0
            for (sid, _), m in self._tasks.items():
                if sid in done:
                    done[sid] += 1
                rows += m.output_rows
            tasks_done = sum(min(done[s], counts[s]) for s in counts)
            live_done = sum(d for d, _ in self._live.values())
            return Progress(
                stages_done=sum(1 for s in counts if counts[s] and done[s] >= counts[s]),
                stages_total=len(counts),
                tasks_done=max(tasks_done, min(live_done, sum(counts.values()))),
                tasks_total=sum(counts.values()),
                rows=rows,
                result_rows=self.result_rows,
                elapsed_s=time.monotonic() - self.started,
            )


_OBSERVERS: dict[str, QueryObserver] = {}
_REGISTRY_LOCK = threading.Lock()


@contextlib.contextmanager
def observing(observer: QueryObserver) -> Iterator[QueryObserver]:
    """Register ``observer`` under its query id while the block runs."""
    with _REGISTRY_LOCK:
        _OBSERVERS[observer.query_id] = observer
    try:
        yield observer
    finally:
        with _REGISTRY_LOCK:
            if _OBSERVERS.get(observer.query_id) is observer:
                del _OBSERVERS[observer.query_id]


def observer_for(query_id: str) -> QueryObserver:
    """The observer registered for ``query_id``, else a new one nobody reads.

    Runtimes call this once when a query starts; reporting to an unregistered
    observer costs what a registered one does and is dropped with the run.
    """
    with _REGISTRY_LOCK:
        found = _OBSERVERS.get(query_id)
    return found if found is not None else QueryObserver(query_id)
