"""The Flight runtime: stages run on standalone Arrow Flight workers.

```
 DistributedContext ──plan──> StageGraph
        │ num_workers(): len(resolver.get_urls())   (caps tasks per stage)
        ▼
 FlightRuntime.execute(graph)
   urls = resolver.get_urls()          right before execution
   WorkerQueryRun(FlightWorkerTransport, urls, routing).stream_head(graph)
     (wrapped: a lost worker -> run again on the others)
        │  set_plan / DoGet / cancel_query over gRPC
        ▼
 workers: distfusion worker --port P   (FlightWorker)
```

While a query runs, a background thread sends a keepalive for it to its
workers every ``heartbeat_s`` seconds; a worker drops the state of a query it
has not heard about for its time-to-live, so a coordinator that disappears
leaves nothing behind.

Faults: when a query fails before yielding a row, the runtime asks every
worker of the attempt for its stats; workers that do not answer are dropped
and the query runs again, with a fresh query id, on the remaining ones (at
most ``max_retries`` times; a query run stage by stage runs the stages that
ran so far again first). Otherwise, or when no worker remains, the error
is raised: it names the worker URL, the stage and the task.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Generator, Iterator

import pyarrow as pa

from distfusion.coordinator.query_run import (
    QueryRun,
    Routing,
    RuntimeProfile,
    StageStats,
    WorkerQueryRun,
    round_robin,
)
from distfusion.errors import PlanningError, TaskError, TransportError, WorkerUnavailableError
from distfusion.metrics.observer import QueryObserver, observer_for
from distfusion.runtime.resolver import StaticWorkerResolver, WorkerResolver
from distfusion.stages import StageGraph
from distfusion.transport.flight import FlightWorkerTransport
from distfusion.worker.memory import default_memory_per_task_bytes

__all__ = ["FlightRuntime", "start_local_workers", "stop_local_workers"]

_READY = "distfusion worker listening on "

log = logging.getLogger("distfusion.runtime.flight")


class FlightRuntime:
    """Runs stage graphs on Arrow Flight workers found through a resolver.

    Args:
        resolver: a :class:`~distfusion.runtime.resolver.WorkerResolver`, or a list of
            URLs (``["grpc://127.0.0.1:50051", ...]``) for a static one.
        token: shared secret of the workers; default ``$DISTFUSION_TOKEN``.
        tls_root_certs: PEM bytes verifying ``grpc+tls://`` workers.
        routing: assigns tasks to URLs right before execution (default round-robin).
        target_partitions: DataFusion threads per task (default: the
            coordinator's cores).
        max_retries: times a query is run again on the remaining workers after
            losing a worker before its first row (0 fails at once).
        heartbeat_s: seconds between keepalives for running queries; keep it
            well under the workers' ``--query-ttl``. A worker that misses one
            (no answer within ``2 * probe_timeout_s``) fails its queries.
        probe_timeout_s: how long a worker may take to answer the stats probe
            after a failure before it counts as lost, seconds.

    The workers the resolver reports at construction are asked for their
    stats (within ``probe_timeout_s``): a runtime none of whose workers answer
    fails at once, naming them, and one that does not answer among others
    that do is logged (it is skipped when queries run). A query that would
    run wholly on the coordinator (one task, no stage cut) runs on a worker
    (``remote_workers`` in its :meth:`profile`).

    Raises:
        ImportError: pyarrow has no Flight support.
        ValueError: ``resolver`` is an empty list.
        WorkerUnavailableError: no worker the resolver reports answers (names
            each URL and why).
    """

    name = "flight"

    def __init__(
        self,
        resolver: WorkerResolver | list[str],
        *,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        routing: Routing = round_robin,
        target_partitions: int | None = None,
        max_retries: int = 1,
        heartbeat_s: float = 1.0,
        probe_timeout_s: float = 2.0,
    ) -> None:
        if isinstance(resolver, list | tuple):
            resolver = StaticWorkerResolver(list(resolver))
        self.resolver = resolver
        self.transport = FlightWorkerTransport(token=token, tls_root_certs=tls_root_certs)
        self.routing = routing
        self.target_partitions = target_partitions
        self.max_retries = max(0, max_retries)
        self.heartbeat_s = heartbeat_s
        self.probe_timeout_s = probe_timeout_s
        # query id -> (worker URLs, task placement {(stage, task): URL})
        self._running: dict[str, tuple[list[str], dict[tuple[int, int], str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._check_workers()

    def _check_workers(self) -> None:
        """Ask each worker the resolver reports now for its stats (see the class).

        Raises:
            WorkerUnavailableError: none of them answers.
        """
        urls = list(dict.fromkeys(self.resolver.get_urls()))
        down: dict[str, WorkerUnavailableError] = {}
        for url in urls:
            try:
                self.transport.stats(url, timeout_s=self.probe_timeout_s)
            except WorkerUnavailableError as exc:
                down[url] = exc
            except TransportError:
                pass  # it answered (e.g. rejected the token): queries say why
        if not down:
            return
        reasons = "; ".join(f"{url}: {exc.detail}" for url, exc in down.items())
        if len(down) == len(urls):
            self.transport.close()
            msg = (
                f"no Flight worker answered within {self.probe_timeout_s} s ({reasons}); "
                "check each URL (grpc://host:port) and that `distfusion worker` runs there"
            )
            raise WorkerUnavailableError(urls[0], msg)
        log.warning("Flight workers not answering, skipped by queries: %s", reasons)

    # ------------------------------------------------------------- Runtime
    def _urls(self) -> list[str]:
        urls = list(dict.fromkeys(self.resolver.get_urls()))
        if not urls:
            msg = f"no Flight worker available: {self.resolver!r} returned no URL"
            raise PlanningError(msg)
        return urls

    def profile(self) -> RuntimeProfile:
        """See :meth:`Runtime.profile`: the defaults, and ``remote_workers``.

        Its workers are other processes: the planner puts every query's scans
        on them.
        """
        return RuntimeProfile(remote_workers=True)

    def num_workers(self) -> int:
        """Workers the resolver reports now.

        Raises:
            PlanningError: the resolver returned no URL.
        """
        return len(self._urls())

    def execute(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """See :meth:`Runtime.execute`.

        Each run gets a fresh query id, so a planned DataFrame can run again.

        Raises:
            PlanningError: the resolver returned no URL.
            TaskError: a task failed (names the stage, the task and the worker).
            WorkerUnavailableError: a worker could not be reached and no retry
                was left or possible (names its URL).
            AuthenticationError: a worker rejected the token.
        """
        return self._execute(graph, self._urls())

    def _execute(self, graph: StageGraph, urls: list[str]) -> Iterator[pa.RecordBatch]:
        # A generator: nothing starts (no keepalive either) before the first batch is asked for.
        # A fresh query id on the workers; the metrics go to the graph's query's observer.
        run = _RetryingQueryRun(
            self, str(uuid.uuid4()), urls, keep_outputs=False, observer=observer_for(graph.query_id)
        )
        yield from run.stream_head(graph)

    def start_query(self, query_id: str) -> QueryRun:
        """See :meth:`Runtime.start_query`: a run on the workers the resolver reports now.

        The workers keep every output of the query until the run is closed;
        keepalives are sent for it meanwhile. A worker lost before the head
        stage yields a row: the stages run so far run again, under a fresh
        query id, on the remaining workers (at most ``max_retries`` times),
        then the failed call.

        Raises:
            PlanningError: the resolver returned no URL.
        """
        return _RetryingQueryRun(self, query_id, self._urls(), keep_outputs=True)

    def start_run(
        self,
        query_id: str,
        urls: list[str],
        keep_outputs: bool,
        observer: QueryObserver | None = None,
    ) -> WorkerQueryRun:
        """One attempt of query ``query_id`` on ``urls``, its workers kept alive (heartbeat).

        Called by the retrying query run for its first attempt and each retry.
        """

        def finish() -> None:
            self._end_heartbeat(query_id)
            self.transport.forget_query(query_id)

        run = WorkerQueryRun(
            query_id,
            self.transport,
            urls,
            self.routing,
            self.target_partitions,
            keep_outputs=keep_outputs,
            on_close=finish,
            observer=observer,
            remote_workers=True,
        )
        self._start_heartbeat(query_id, urls, run.placement)
        return run

    def lost_workers(self, urls: list[str]) -> list[str]:
        """The workers of ``urls`` that do not answer (one stats call each)."""
        lost = []
        for url in urls:
            try:
                self.transport.stats(url, timeout_s=self.probe_timeout_s)
            except WorkerUnavailableError:
                lost.append(url)
            except TransportError:
                pass  # it answered (e.g. rejected the token): not lost
        return lost

    # ------------------------------------------------------------- heartbeat
    def _start_heartbeat(
        self, query_id: str, urls: list[str], placement: dict[tuple[int, int], str]
    ) -> None:
        with self._lock:
            self._running[query_id] = (list(urls), placement)
            if self._heartbeat is None and not self._stop.is_set():
                self._heartbeat = threading.Thread(
                    target=self._beat, name="distfusion-flight-heartbeat", daemon=True
                )
                self._heartbeat.start()

    def _end_heartbeat(self, query_id: str) -> None:
        with self._lock:
            self._running.pop(query_id, None)

    def _beat(self) -> None:
        """Send keepalives every ``heartbeat_s`` to each worker of a running query.

        A worker that stopped answering aborts its queries (the coordinator may
        be waiting on another worker and would not notice otherwise).
        """
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                by_url: dict[str, list[str]] = {}
                for qid, (urls, _) in self._running.items():
                    for url in urls:
                        by_url.setdefault(url, []).append(qid)
            for url, qids in by_url.items():
                if self.transport.keepalive(url, qids, timeout_s=self.probe_timeout_s * 2):
                    continue
                for qid in qids:
                    with self._lock:
                        placement = self._running.get(qid, (None, {}))[1]
                    # a copy: the query's run may be placing more stages meanwhile
                    tasks = sorted(k for k, u in placement.copy().items() if u == url)
                    named = ", ".join(f"stage {s} task {t}" for s, t in tasks) or "no task"
                    detail = f"stopped answering while query {qid[:8]} ran; it held {named}"
                    self.transport.abort_query(qid, WorkerUnavailableError(url, detail))

    # ------------------------------------------------------------- extras
    def stats(self) -> dict[str, dict]:
        """Live tasks and bytes held, per worker URL (zero between queries).

        Returns:
            URL -> ``{"live_tasks", "bytes_held", "plans_received", "live_queries"}``.

        Raises:
            WorkerUnavailableError: a worker cannot be reached.
        """
        return {url: self.transport.stats(url) for url in self.resolver.get_urls()}

    @classmethod
    def with_local_workers(
        cls,
        workers: int = 3,
        *,
        slots: int = 1,
        memory_per_task_bytes: int | None = None,
        udfs: tuple[str, ...] = (),
        **kwargs,
    ) -> FlightRuntime:
        """A runtime on ``workers`` new worker processes on 127.0.0.1 (free ports).

        The processes are stopped by :meth:`close`; for one machine and benchmarks.

        Args:
            workers: worker processes to start.
            slots: tasks each worker runs at the same time.
            memory_per_task_bytes: each worker's default task budget (its
                ``--memory`` is this times ``slots``), bytes; None: half of the
                machine's memory shared by every slot of the workers started.
            udfs: ``package.module:name`` references of Python UDFs each worker
                loads (``distfusion worker --udf``).
            **kwargs: passed to :class:`FlightRuntime`; ``token`` is given to
                the workers too.

        Raises:
            RuntimeError: a worker did not start within 60 s.
        """
        token = kwargs.get("token")
        per_task = memory_per_task_bytes or default_memory_per_task_bytes(workers * slots)
        args = ["--slots", str(slots), "--memory", str(per_task * slots)]
        for reference in udfs:
            args += ["--udf", reference]
        env = {"DISTFUSION_TOKEN": token} if token else None
        procs = start_local_workers(workers, args, env=env)
        runtime = cls([url for _, url in procs], **kwargs)
        runtime._processes = [p for p, _ in procs]
        return runtime

    def close(self) -> None:
        """Stop the heartbeat, the Flight clients and the workers this runtime started.

        Workers started elsewhere keep running.
        """
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        self.transport.close()
        stop_local_workers(getattr(self, "_processes", []))
        self._processes: list[subprocess.Popen] = []

    def __repr__(self) -> str:
        return f"FlightRuntime({self.resolver!r})"


class _RetryingQueryRun:
    """A :class:`QueryRun` on Flight workers that survives losing a worker.

    Runs the query as a :class:`WorkerQueryRun` (an attempt) and records every
    :meth:`run_stages` call. When a call fails with a task or transport error
    before the head stage yields a row, the workers are probed; if some are
    lost, the attempt is closed, a new one starts on the remaining workers
    under a fresh query id, replays the recorded calls (the lost outputs are
    computed again) and makes the failed call again. At most
    ``runtime.max_retries`` new attempts; otherwise, or when no worker
    remains, the error is raised.
    """

    def __init__(
        self,
        runtime: FlightRuntime,
        query_id: str,
        urls: list[str],
        keep_outputs: bool,
        observer: QueryObserver | None = None,
    ) -> None:
        self._runtime = runtime
        self._urls = list(urls)
        self._keep_outputs = keep_outputs
        self._attempts = 0
        self._calls: list[tuple[StageGraph, list[int]]] = []
        # Attempts run under fresh query ids; their metrics go to the first id's observer.
        self._observer = observer if observer is not None else observer_for(query_id)
        self._run = runtime.start_run(query_id, self._urls, keep_outputs, self._observer)

    @property
    def query_id(self) -> str:
        """The query id of the current attempt on the workers."""
        return self._run.query_id

    @property
    def placement(self) -> dict[tuple[int, int], str]:
        """``(stage_id, task_index)`` -> worker URL in the current attempt."""
        return self._run.placement

    def run_stages(self, graph: StageGraph, stage_ids: list[int]) -> dict[int, StageStats]:
        """See :meth:`QueryRun.run_stages` (lost workers: see the class)."""
        while True:
            try:
                stats = self._run.run_stages(graph, stage_ids)
            except (TaskError, TransportError) as exc:
                self._retry(exc)
                continue
            self._calls.append((graph, list(stage_ids)))
            return stats

    def stream_head(self, graph: StageGraph) -> Generator[pa.RecordBatch, None, None]:
        """See :meth:`QueryRun.stream_head` (lost workers: see the class)."""
        try:
            while True:
                batches = self._run.stream_head(graph)
                yielded = False
                try:
                    for batch in batches:
                        yielded = True
                        yield batch
                    return
                except (TaskError, TransportError) as exc:
                    if yielded:
                        raise
                    self._retry(exc)
                finally:
                    batches.close()
        finally:
            self.close()

    def head_parts(self, graph: StageGraph, split: bool = True):
        """See :meth:`WorkerQueryRun.head_parts` (a lost worker is not retried here)."""
        return self._run.head_parts(graph, split)

    def write_head_parts(self, graph: StageGraph, spec) -> list:
        """See :meth:`WorkerQueryRun.write_head_parts` (a lost worker is not retried here)."""
        return self._run.write_head_parts(graph, spec)

    def map_head_parts(self, graph: StageGraph, fn, split: bool = True) -> list:
        """See :meth:`WorkerQueryRun.map_head_parts` (a lost worker is not retried here)."""
        return self._run.map_head_parts(graph, fn, split)

    def close(self) -> None:
        """See :meth:`QueryRun.close`."""
        self._run.close()

    def _retry(self, exc: Exception) -> None:
        """Start a new attempt on the workers that still answer, or raise ``exc``."""
        self._run.close()  # the failed attempt's tasks, on every worker it used
        while True:
            if self._attempts >= self._runtime.max_retries:
                raise exc
            lost = self._runtime.lost_workers(self._urls)
            if not lost:
                raise exc
            remaining = [u for u in self._urls if u not in lost]
            if not remaining:
                msg = f"every worker is unreachable ({', '.join(lost)}); last error: {exc}"
                raise WorkerUnavailableError(lost[0], msg) from exc
            log.warning(
                "lost worker(s) %s (%s); running the query again on %s", lost, exc, remaining
            )
            self._urls = remaining
            self._attempts += 1
            self._run = self._runtime.start_run(
                str(uuid.uuid4()), remaining, self._keep_outputs, self._observer
            )
            try:
                for graph, stage_ids in self._calls:
                    self._run.run_stages(graph, stage_ids)
                return
            except (TaskError, TransportError) as again:
                exc = again

    def __repr__(self) -> str:
        return f"_RetryingQueryRun({self._run!r}, attempt {self._attempts})"


def start_local_workers(
    n: int,
    args: list[str] | None = None,
    env: dict | None = None,
    timeout_s: float = 60.0,
    log_paths: list[str] | None = None,
) -> list[tuple[subprocess.Popen, str]]:
    """Start ``n`` ``distfusion worker --port 0`` processes on 127.0.0.1.

    Used by :meth:`FlightRuntime.with_local_workers` and the tests' worker processes.

    Args:
        n: processes to start.
        args: extra worker options (``["--token", "..."]``).
        env: extra environment variables of the processes.
        timeout_s: how long one worker may take to announce its URL, seconds.
        log_paths: one file per worker its stderr is written to (default: discarded).

    Each worker watches its standard input, a pipe this process holds
    (``--exit-with-parent``): it stops when this process ends, however it ends
    (an exception, SIGTERM, SIGKILL), or when its ``Popen`` is closed.

    Returns:
        ``(process, url)`` per worker; stop them with SIGTERM (or
        :meth:`FlightRuntime.close` when it started them).

    Raises:
        RuntimeError: a worker exited or did not start in time (the others are stopped).
    """
    started: list[tuple[subprocess.Popen, str]] = []
    try:
        for i in range(n):
            log_file = open(log_paths[i], "ab") if log_paths else None  # noqa: SIM115
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distfusion.worker.flight_cli",
                    "--port",
                    "0",
                    "--exit-with-parent",
                    *(args or []),
                ],
                stdin=subprocess.PIPE,  # closes with this process: the worker then stops
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL if log_file is None else log_file,
                env={**os.environ, **(env or {})},
                text=True,
            )
            if log_file is not None:
                log_file.close()  # the child has its own descriptor
            started.append((proc, ""))
            deadline = time.monotonic() + timeout_s
            line = ""
            out = proc.stdout
            assert out is not None  # stdout=PIPE
            while not line and time.monotonic() < deadline and proc.poll() is None:
                if select.select([out], [], [], 0.2)[0]:
                    line = out.readline()
            if not line.startswith(_READY):
                msg = f"a Flight worker did not start (exit code {proc.poll()}): {line!r}"
                raise RuntimeError(msg)
            started[-1] = (proc, line[len(_READY) :].strip())
    except BaseException:
        stop_local_workers([p for p, _ in started])
        raise
    return started


def stop_local_workers(procs: list[subprocess.Popen], timeout_s: float = 5.0) -> None:
    """Stop worker processes: SIGTERM to all, then SIGKILL those alive after ``timeout_s``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # a task stuck in DataFusion keeps it alive
            p.kill()
            p.wait()
        for pipe in (p.stdin, p.stdout):
            if pipe:
                pipe.close()
