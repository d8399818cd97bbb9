"""The Spark runtime on a Spark Connect session: every stage a DataFrame job, no RDD.

A Spark Connect session (``SparkSession.builder.remote("sc://host:15002")``,
``pyspark-client``, Databricks serverless and shared clusters) has no
SparkContext: no RDDs, broadcasts, accumulators, job groups or local
properties, and its client may run where the executors cannot reach it (a
laptop outside the cluster). ``SparkRuntime(spark=<Connect session>)`` makes a
:class:`SparkConnectRuntime`. Its queries run as on the classic Flight data
plane (:class:`~distfusion.runtime.spark.flight_plane.SparkFlightQuery`, whose retries,
recovery of lost outputs and cleanup it keeps): each executor Python worker
hosts a Flight worker that keeps its tasks' outputs, consumers read them
executor to executor, and the same executor-side code runs every task
(:func:`~distfusion.worker.spark_tasks.flight_task`). What changes is how a round
of tasks is started and how its records, and the result, come back::

    client (Connect)                                   executors (Python workers)
    round k  spark.range(0, n, 1, n)                    partition i = task tasks[i]:
               .mapInArrow(run task i) ──────────────>    its plan made from the stage
             (the round's stages pickled once in the       (pickled once per job), run on
              function; a partition carries only its id)   this process's Flight worker
         <── (stage, task, worker URL, metrics, error)     output kept there
    Spark    df.select(columns).coalesce(n)
    table      .mapInArrow(run task = partition) ─────>  the partition's Arrow batches
    head     spark.range(0, 1, 1, 1)                     reads its inputs over Flight,
               .mapInArrow(run the head) ─────────────>    yields its batches as Arrow
         <── rows of Arrow IPC streams, streamed            IPC; then cancel_query on
             (the result, through Connect)                  every worker of the query

Nothing connects to the client: no work unit feed endpoint and no driver
worker is started, small one-task stages run as Spark jobs too, and
everything the classic plane asks the executors' workers from the driver
(where outputs were lost, keepalives, the cleanup of a failed or cancelled
query, :meth:`SparkConnectRuntime.stats`) runs as a one-task Spark job whose
task asks them (:func:`~distfusion.worker.spark_connect_tasks.control`). A
query that ends normally needs no such job: its head task cleans up. The
functions the jobs run on the executors are in
:mod:`~distfusion.worker.spark_connect_tasks`; the reading of Connect
DataFrames (what Spark's explanations say of them) in
:mod:`~distfusion.runtime.spark.connect_frames`.

Jobs are tagged (``SparkSession.addTag``): ``distfusion-<query id>`` on every
job of a query (closing the query runs ``interruptTag`` with it) and a tag
naming the query and its stages (Connect sets a job's description itself).

What does not carry over (docs/spark.md, "On Spark Connect"): work unit feeds (Iceberg
tables, ``register_feed_table``) are produced on the client and streamed to the
tasks from there: refused with a :class:`~distfusion.errors.PlanningError`. A
task that panics fails its query when its job ends (the classic plane is told
at once through the driver's worker). The shuffle data plane needs RDDs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import pickle
import re
import secrets
import threading
import time
from collections.abc import Generator, Iterator

import pyarrow as pa

from distfusion.coordinator.checks import first_line
from distfusion.coordinator.feeds import has_feeds
from distfusion.coordinator.query_run import (
    QueryRun,
    default_target_partitions,
)
from distfusion.errors import (
    DistfusionError,
    PlanningError,
    TaskError,
)
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import task_error_from_json
from distfusion.runtime.spark.config import (
    ENCRYPTION_SETTINGS,
    encryption_settings,
    is_connect_session,
)
from distfusion.runtime.spark.connect_frames import (
    ProgressHandler,
    collect_arrow,
    explain_text,
    is_connect_dataframe,
    stream_arrow,
)
from distfusion.runtime.spark.dataframes import (
    held_dataframe,
    spark_arrow_schema,
    spark_scan,
)
from distfusion.runtime.spark.flight_plane import KEEP_WARM_S, SparkFlightQuery
from distfusion.runtime.spark.jobs import by_value, spark_call
from distfusion.runtime.spark.runtime import SparkRuntime
from distfusion.stages import SourceScan, Stage, StageGraph
from distfusion.transport.tls import TlsMaterial, self_signed_tls
from distfusion.worker.head_parts import HeadPart, head_parts
from distfusion.worker.memory import spark_memory_per_task_bytes
from distfusion.worker.spark_codec import StageRecord, TaskRecord
from distfusion.worker.spark_connect_tasks import (
    BATCHES,
    CLEANED,
    CONTROL_SCHEMA,
    FAILED,
    HEAD_SCHEMA,
    METRICS,
    PARTS_ARROW,
    PARTS_SCHEMA,
    ROUND_ARROW,
    ROUND_SCHEMA,
    SCHEMA,
    control,
    nothing,
    run_head,
    run_parts,
    run_table_task,
    run_task,
)
from distfusion.worker.spark_entries import mapper
from distfusion.worker.spark_tasks import EXECUTOR_QUERY_TTL_S, DataPlaneAccess

__all__ = ["SparkConnectRuntime", "connect_session"]

log = logging.getLogger(__name__)

SLOTS_TTL_S = 10.0
"""Seconds :meth:`SparkConnectRuntime.num_workers` keeps the slot count it asked Spark for."""

CLEANUP_WAIT_S = 30.0
"""Most seconds :meth:`SparkConnectRuntime.close` waits for the cleanup jobs still running."""

_SPLITS = re.compile(r"splits=(\d+)")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
_TAG_UNSAFE = re.compile(r"[,\s]+")


def executors_next_to_client(master: str | None, host: str) -> bool:
    """Whether the executors are on the client's machine: a local-mode server on loopback.

    ``master`` is the server application's ``spark.master`` (None: not
    exposed), ``host`` the server's host as the client names it.
    """
    return (master or "").startswith("local") and host in _LOOPBACK


def _tag(text: str) -> str:
    """``text`` as a Spark job tag: no commas (Spark's separator), no runs of blanks."""
    return _TAG_UNSAFE.sub(" ", text).strip()[:200]


class SparkConnectRuntime(SparkRuntime):
    """Runs stage graphs on a Spark Connect session: each round of tasks a DataFrame job.

    Made by ``SparkRuntime(spark=<Connect session>)`` (the same arguments); see
    the module's docstring for how tasks run and what does not carry over.
    The session's settings are the server's: ``spark.task.maxFailures``
    (attempts per task, else ``task_max_failures``), ``spark.master``,
    ``spark.executor.memory``, ``spark.executor.pyspark.memory`` and
    ``spark.executor.cores`` are read from it when the server exposes them.

    Args:
        spark: the Spark Connect session.
        master: not used (the server's application runs the tasks).
        target_partitions: cores of one executor (default: this machine's).
        compression: not used (the Flight data plane moves Arrow as it is).
        task_max_failures: attempts per task when the server does not say.
        conf: must be empty: a Connect session cannot change the server's
            settings (runtime SQL settings: ``spark.conf.set``).
        progress: not used (Spark's console progress is the server's).
        executor_wait_s: not used.
        data_plane: ``"flight"`` only (the shuffle data plane needs RDDs).
        head_on_client: where a query's head stage runs. True: on this client,
            reading the executors' Flight workers directly, as on a classic
            session (one Spark job less per query; the client must reach the
            executors). False: as a one-task Spark job whose result comes back
            through Connect (nothing connects to the client or from it). None
            (default): True when the server is on this machine
            (``localhost``/``127.0.0.1``) and runs in local mode, so its
            executors are too; False otherwise.

    Raises:
        TypeError: ``spark`` is not a Spark Connect session.
        ValueError: ``data_plane`` is not ``"flight"``, or ``conf`` is given.
    """

    driver_stage_bytes = SparkRuntime.driver_stage_bytes
    """Executors cannot read from the client, so every stage runs as a Spark job here;
    a one-part head whose inputs hold at most this many bytes is still run first
    and its result handed to ``createDataFrame`` by ``SparkDataFrame.to_spark()``."""

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
        data_plane: str = "flight",
        head_on_client: bool | None = None,
    ) -> None:
        if not is_connect_session(spark):
            msg = f"SparkConnectRuntime needs a Spark Connect session, got {type(spark)!r}"
            raise TypeError(msg)
        if data_plane != "flight":
            msg = (
                f"data_plane={data_plane!r}: on Spark Connect stage outputs move over the "
                "Flight data plane only (the shuffle data plane needs RDDs)"
            )
            raise ValueError(msg)
        if conf:
            msg = (
                "conf: a Spark Connect session cannot change its server's settings; set "
                "runtime SQL settings with spark.conf.set, the others on the server"
            )
            raise ValueError(msg)
        self.spark = spark
        self.sc = None
        self._owns_session = False
        self.target_partitions = target_partitions or default_target_partitions()
        self.compression = compression
        self._held: dict[str, int] = {}
        self.data_plane = "flight"
        self._conf = {key: _conf_value(spark, key) for key in (*_CONF_KEYS, *ENCRYPTION_SETTINGS)}
        self.encryption = encryption_settings(self._conf)
        """The server's settings asking for encryption (:data:`ENCRYPTION_SETTINGS`)."""
        self.tls = _data_plane_tls(self.encryption)
        self.explain_note = ""
        """What ``explain()`` says about this runtime's data plane ("" when nothing to say)."""
        if self.encryption:
            asked = ", ".join(f"{k}=true" for k in self.encryption)
            self.explain_note = f"Spark data plane: Flight over TLS (Spark encrypts: {asked})"
        self.token = secrets.token_hex(16)  # executors' Flight workers accept only this runtime
        self.access = DataPlaneAccess(self.token, self.tls)
        # Only for the client's own bookkeeping (abort_query): no call leaves the client.
        self.transport = self.access.transport()
        self.executor_urls: set[str] = set()
        self._feed_endpoint = None
        self._driver_worker = None
        self._live_runs: dict[str, SparkFlightQuery] = {}
        self._endpoint_lock = threading.Lock()
        self._memory_per_task_bytes: int | None = None
        self.held_results: dict[str, QueryRun] = {}
        self.task_max_failures = int(self._conf["spark.task.maxFailures"] or task_max_failures)
        self._slots: tuple[int, float] = (0, 0.0)  # (slots, monotonic time asked)
        self._cleanups: list[threading.Thread] = []
        self.progress_handler = ProgressHandler()
        with contextlib.suppress(Exception):  # a client without progress reports
            spark.registerProgressHandler(self.progress_handler)
        if head_on_client is None:
            head_on_client = executors_next_to_client(self._conf["spark.master"], self.server_host)
        self.head_on_client = head_on_client
        """Whether heads run on this client, reading the executors (see ``head_on_client``)."""

    @property
    def server_host(self) -> str:
        """The Connect server's host name, as the session was given it."""
        return getattr(self.spark.client, "host", "?")

    @property
    def master(self) -> str:
        """The Connect server, ``sc://host``, and its application's master when it says."""
        master = self._conf["spark.master"]
        return f"sc://{self.server_host}" + (f" ({master})" if master else "")

    @property
    def local(self) -> bool:
        """Whether the server's application runs in local mode (executors on its machine)."""
        return (self._conf["spark.master"] or "").startswith("local")

    def serves(self, spark) -> bool:
        """Whether ``spark`` is this runtime's Connect session, still open."""
        return (
            is_connect_session(spark)
            and spark.session_id == self.spark.session_id
            and not getattr(self.spark, "is_stopped", False)
        )

    @property
    def memory_per_task_bytes(self) -> int:
        """Default DataFusion memory pool of one task, from the server's settings, bytes.

        As :attr:`SparkRuntime.memory_per_task_bytes`, with the settings the
        server exposes (local mode: half of the machine over the slots).
        """
        if self._memory_per_task_bytes is None:
            conf = {k: v for k, v in self._conf.items() if v is not None}
            conf.setdefault("spark.master", "yarn")  # unknown: a cluster's settings
            if self.local:
                slots = self.num_workers()
            else:
                slots = int(self._conf["spark.executor.cores"] or "1")
            self._memory_per_task_bytes = spark_memory_per_task_bytes(conf, slots)
        return self._memory_per_task_bytes

    @property
    def broadcast_copies(self) -> int:
        """Copies of a broadcast at most: one per task slot (each loads what it reads)."""
        return self.num_workers()

    def num_workers(self) -> int:
        """Task slots of the server's application (Spark's default parallelism).

        Read from the plan Spark makes for ``spark.range`` without a partition
        count (``Range (..., splits=N)``: ``spark.sql.leafNodeDefaultParallelism``,
        by default the application's default parallelism): one ``AnalyzePlan``
        call, nothing runs; kept for :data:`SLOTS_TTL_S` seconds.

        Raises:
            PlanningError: the server cannot be asked, or reports no slot.
        """
        slots, asked = self._slots
        if slots and time.monotonic() - asked < SLOTS_TTL_S:
            return slots
        try:
            text = explain_text(self.spark.range(0, 1 << 20), "simple")
        except Exception as exc:
            msg = f"the Spark Connect server {self.master} cannot be asked: {first_line(exc)}"
            raise PlanningError(msg) from exc
        found = _SPLITS.search(text)
        slots = int(found.group(1)) if found else 0
        if slots < 1:
            msg = f"the Spark application behind {self.master} reports no task slot"
            raise PlanningError(msg)
        self._slots = (slots, time.monotonic())
        return slots

    def start_query(self, query_id: str) -> QueryRun:
        """Start query ``query_id`` (a :class:`~distfusion.coordinator.query_run.QueryRun`)."""
        return _ConnectFlightQuery(self, query_id)

    def executor_worker_args(self) -> tuple[str, str | None, tuple, int, None]:
        """``(bind host, advertised host, access, task memory, None)`` for executor workers.

        As the classic runtime's, with no driver worker (executors never call the client).
        """
        bind = "127.0.0.1" if self.local else "0.0.0.0"
        return bind, None, self.access.plain(), self.memory_per_task_bytes, None

    def stats(self) -> dict[str, dict]:
        """Tasks of this runtime's running jobs, and what every executor worker holds.

        ``live_tasks`` of the server's entry (:attr:`master`): tasks running in
        jobs of this runtime now (the progress the server reports); ``bytes_held``:
        0 (nothing is kept on the client). The executors' workers are asked by
        one Spark job (:func:`~distfusion.worker.spark_connect_tasks.control`),
        which needs a free task slot.

        Raises:
            TransportError: the job failed.
        """
        live = sum(self.progress_handler.inflight.values())
        stats = {self.master: {"live_tasks": live, "bytes_held": 0}}
        urls = sorted(self.executor_urls)
        if urls:
            for url, ok, answer in self.control("stats", urls):
                if ok:
                    stats[url] = json.loads(answer)
                else:  # its Python worker exited: it holds nothing
                    self.executor_urls.discard(url)
        return stats

    def control(self, action: str, urls: list[str], query_id: str = "") -> list[tuple]:
        """Ask the executor workers at ``urls`` through a one-task Spark job.

        The job's task is :func:`~distfusion.worker.spark_connect_tasks.control`.

        Args:
            action: ``"stats"``, ``"cancel"`` (``cancel_query``) or ``"keepalive"``.
            urls: the workers.
            query_id: the query of ``cancel`` and ``keepalive``.

        Returns:
            ``(url, answered, stats JSON)`` per URL.

        Raises:
            TransportError: the job failed.
        """
        fn = mapper(
            [(-1, -1)],
            control,
            False,
            self.access.plain(),
            action,
            query_id,
            list(urls),
        )
        what = _tag(f"distfusion {action} {query_id[:8]}")
        self.spark.addTag(what)
        try:
            frame = self.spark.range(0, 1, 1, 1).mapInArrow(fn, CONTROL_SCHEMA)
            table = spark_call(lambda: collect_arrow(frame), lambda: None, self.master)
        finally:
            self.spark.removeTag(what)
        return list(
            zip(*(table.column(n).to_pylist() for n in ("url", "ok", "stats")), strict=True)
        )

    def cleanup(self, query_id: str, urls: list[str]) -> None:
        """Cancel ``query_id`` on the executor workers at ``urls``, in a background job.

        For a query that did not end with its head task (failed, cancelled, a
        result held by Spark released): its outputs are freed now rather than
        after the workers' time-to-live. Best effort: a failed job is logged.
        """

        def run() -> None:
            try:
                self.control("cancel", urls, query_id)
            except Exception as exc:  # the session stopped: the workers' TTL frees it
                log.debug("cleanup of query %s failed: %s", query_id[:8], exc)

        thread = threading.Thread(target=run, name=f"distfusion-cleanup-{query_id[:8]}")
        thread.daemon = True
        self._cleanups = [t for t in self._cleanups if t.is_alive()] + [thread]
        thread.start()

    def interrupt(self, tag: str) -> None:
        """Interrupt the session's operations tagged ``tag`` (``interruptTag``; best effort)."""
        try:
            self.spark.interruptTag(tag)
        except Exception as exc:  # the session stopped: nothing runs
            log.debug("interruptTag(%s) failed: %s", tag, exc)

    def feed_endpoint(self):
        """Refused: executors cannot pull work unit feeds from a Spark Connect client.

        Raises:
            PlanningError: always.
        """
        msg = (
            "work unit feeds are produced on the client and streamed to the tasks from "
            "there, which executors cannot reach on Spark Connect"
        )
        raise PlanningError(msg)

    def driver_worker(self):
        """Refused: no Flight worker runs on a Spark Connect client.

        Raises:
            PlanningError: always.
        """
        msg = "no Flight worker runs on a Spark Connect client (executors cannot reach it)"
        raise PlanningError(msg)

    def close(self) -> None:
        """Release every held result and wait for the cleanup jobs; the session stays open."""
        super().close()
        deadline = time.monotonic() + CLEANUP_WAIT_S
        for thread in self._cleanups:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._cleanups.clear()
        with contextlib.suppress(Exception):
            self.spark.removeProgressHandler(self.progress_handler)

    def __repr__(self) -> str:
        return f"SparkConnectRuntime(server={self.master!r})"


SparkRuntime.connect_runtime = SparkConnectRuntime


def connect_session(url: str):
    """A Spark Connect session to the server at ``url`` (``sc://host:port``).

    Made with the Connect client's own builder, so the process's classic
    PySpark stays classic (``SparkSession.builder.remote`` switches every
    ``pyspark.sql`` API of the process to Connect).

    Raises:
        ImportError: pyspark's Connect client is missing (``pip install
            'distfusion[connect]'``).
        Exception: the server cannot be reached (pyspark's error).
    """
    try:  # optional dependency: pyspark[connect]
        from pyspark.sql.connect.session import SparkSession
    except ImportError as exc:
        msg = (
            "Spark Connect needs pyspark's Connect client: pip install 'distfusion[connect]' "
            "(or pip install 'pyspark[connect]')"
        )
        raise ImportError(msg) from exc
    return SparkSession.builder.remote(url).getOrCreate()


_CONF_KEYS = (
    "spark.master",
    "spark.task.maxFailures",
    "spark.executor.memory",
    "spark.executor.pyspark.memory",
    "spark.executor.cores",
)
"""The server's settings :class:`SparkConnectRuntime` reads (with :data:`ENCRYPTION_SETTINGS`)."""


def _data_plane_tls(encryption: list[str]) -> TlsMaterial | None:
    """The Flight data plane's TLS material when the server's settings ``encryption`` ask for it.

    Raises:
        ImportError: Spark encrypts and ``cryptography`` is missing: on
            Connect there is no Spark shuffle to fall back to.
    """
    if not encryption:
        return None
    try:
        return self_signed_tls()
    except ImportError as exc:
        asked = ", ".join(f"{k}=true" for k in encryption)
        msg = (
            f"the Spark Connect server encrypts ({asked}), so the Flight data plane must "
            f"serve TLS, which needs {exc}; install distfusion[connect]"
        )
        raise ImportError(msg) from exc


def _conf_value(spark, key: str) -> str | None:
    """Setting ``key`` of the Connect session, None when unset or not exposed."""
    try:
        value = spark.conf.get(key, None)
    except Exception:  # the server does not expose it
        return None
    return None if value in (None, "") else str(value)


class _ConnectFlightQuery(SparkFlightQuery):
    """One query on a Spark Connect session: the classic Flight plane's run, jobs as DataFrames.

    Retries, recovery of lost outputs and metrics are the classic run's
    (:class:`~distfusion.runtime.spark.flight_plane.SparkFlightQuery`); this class only
    starts Spark work differently, and asks the executors' workers through
    jobs (:meth:`SparkConnectRuntime.control`) where the classic run calls
    them from the driver.

    With ``head_on_client`` (:attr:`reaches_workers`), the head reads the
    executors' outputs from this client, and the client asks and frees the
    executors' workers directly, as on a classic session: no Spark job for
    the head, for lost outputs or for the cleanup. Its rounds of tasks are
    Connect jobs as for any Connect query.
    """

    runtime: SparkConnectRuntime

    def __init__(self, runtime: SparkConnectRuntime, query_id: str) -> None:
        self.spark = runtime.spark
        self.operations: dict[str, tuple[int, int]] = {}  # Connect operation -> (done, tasks)
        self._to_cancel: set[str] = set()  # workers to tell when the run closes
        self._cleaned = False  # the head task cancelled the query on every worker
        self._frames: dict[
            int, tuple
        ] = {}  # stage id -> (DataFrame, read schema) of its Spark table
        self._beyond: dict[int, set[int]] = {}  # stage -> tasks past its DataFrame's partitions
        self.reaches_workers = runtime.head_on_client
        """Whether this client reaches the executors' workers (``head_on_client``)."""
        super().__init__(runtime, query_id)

    # ------------------------------------------------------------ hooks
    def _cancel_jobs(self) -> None:
        self.runtime.interrupt(self.group)

    def _progress(self) -> tuple[int, int]:
        ops = list(self.operations.values())
        return sum(d for d, _ in ops), sum(t for _, t in ops)

    def _cancel_on_workers(self, urls: list[str]) -> None:
        """Told from here when it reaches them, else noted: one job tells them all (``_forget``)."""
        if self.reaches_workers:
            super()._cancel_on_workers(urls)
        else:
            self._to_cancel.update(urls)

    def _forget(self) -> None:
        super()._forget()
        if not self._cleaned and self._to_cancel:
            self.runtime.cleanup(self.query_id, sorted(self._to_cancel))

    def _keep_alive(self) -> None:
        """A keepalive job every quarter of the workers' time-to-live, while the query runs."""
        while not self._keepalive.wait(EXECUTOR_QUERY_TTL_S / 4):
            urls = sorted(set(self.placement.copy().values()))
            if urls:
                try:
                    self.runtime.control("keepalive", urls, self.query_id)
                except Exception as exc:  # the session stopped, or the job failed
                    log.debug("keepalive of query %s failed: %s", self.query_id[:8], exc)

    def _small(self, stage: Stage, alone: bool = False) -> bool:
        """Never: a stage run here would be read by executors, which cannot reach the client."""
        return False

    def _before_head(self) -> None:
        """Lost outputs computed again when this client reaches the workers (classic).

        Otherwise nothing is asked: outputs lost since they ran are found when the head fails.
        """
        if self.reaches_workers:
            super()._before_head()

    def _lost_workers(self) -> set[str]:
        """Workers holding outputs of this query that no longer answer.

        Asked from here when this client reaches them (classic), else by one Spark job.
        """
        if self.reaches_workers:
            return super()._lost_workers()
        urls = sorted(set(self.placement.values()))
        if not urls:
            return set()
        return {url for url, ok, _ in self.runtime.control("stats", urls) if not ok}

    # ------------------------------------------------------------ QueryRun
    def run_stages(self, graph: StageGraph, stage_ids: list[int]):
        """See :meth:`QueryRun.run_stages`; a graph reading a work unit feed is refused."""
        self._refuse_feeds(graph)
        return super().run_stages(graph, stage_ids)

    def stream_head(self, graph: StageGraph) -> Generator[pa.RecordBatch, None, None]:
        """Run the stages not run yet, then the head stage as a one-task Spark job.

        When this client reaches the workers, the head runs here instead,
        reading them (:meth:`WorkerQueryRun.stream_head`).

        The head task reads its inputs over Flight on an executor and its
        batches come back through the Connect client as they are sent; once
        the last one is out, it cancels the query on every worker. Before its
        first batch, a head that failed because outputs it reads were lost
        runs again after they were computed again. Ends the query.

        Raises:
            PlanningError: the graph reads a work unit feed.
            QueryCancelledError: the run was closed.
            TaskError: a task or the head failed.
            TransportError: Spark failed a job.
        """
        if self.reaches_workers:
            try:
                self._refuse_feeds(graph)
            except PlanningError:
                self.close()
                raise
            yield from super().stream_head(graph)
            return
        try:
            self._refuse_feeds(graph)
            plan = self._head_plan(graph)
            yield from self._stream_part(graph, head_parts(plan, graph.head, split=False)[0])
        except DistfusionError as exc:
            self.close()
            self._raise_failure(exc)
            raise
        finally:
            self.close()

    def map_head_parts(self, graph: StageGraph, fn, split: bool = True) -> list:
        """See :meth:`SparkFlightQuery.map_head_parts`; a graph reading a feed is refused."""
        self._refuse_feeds(graph)
        return super().map_head_parts(graph, fn, split)

    def keep_warm(self) -> None:
        """See :meth:`SparkFlightQuery.keep_warm`: a tiny Connect job every :data:`KEEP_WARM_S`."""

        def warm() -> None:
            what = _tag(f"distfusion keep warm {self.query_id[:8]}")
            while not self._keepalive.wait(KEEP_WARM_S):
                try:
                    n = max(1, self.runtime.num_workers())
                    self.spark.addTag(what)
                    try:
                        collect_arrow(self.spark.range(0, n, 1, n).mapInArrow(nothing, "x int"))
                    finally:
                        self.spark.removeTag(what)
                except Exception:  # the session stopped: nothing to keep
                    return

        name = f"distfusion-warm-{self.query_id[:8]}"
        threading.Thread(target=warm, name=name, daemon=True).start()

    # ------------------------------------------------------------ jobs
    def _refuse_feeds(self, graph: StageGraph) -> None:
        """Raise when ``graph`` reads a work unit feed: it would stream from this client.

        Raises:
            PlanningError: names the table and what to do.
        """
        for stage in graph.stages:
            if has_feeds(stage):
                table = next(s.source.name for s in stage.scans if s.source.is_feed)
                msg = (
                    f"table {table!r} is read through a work unit feed (an Iceberg table, "
                    "register_feed_table), produced on this client and streamed to the tasks "
                    "from here; on Spark Connect the executors cannot reach the client. Read it "
                    "through Spark instead (spark.table(...) of a Spark catalog) or use a "
                    "classic SparkSession (docs/spark.md, On Spark Connect)"
                )
                raise PlanningError(msg)

    @contextlib.contextmanager
    def _running_job(self):
        """The block runs a Spark job of this query: :meth:`close` interrupts it.

        The caller stopping inside it (``GeneratorExit``, Ctrl-C) interrupts it too.
        """
        self._check_open()
        self._running = True
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, Exception) and not self.closed:
                self._used |= self.runtime.executor_urls  # its tasks said nothing yet
                self._cancel_jobs()
            raise
        finally:
            self._running = False
            self.runtime.progress_handler.ended(self)

    @contextlib.contextmanager
    def _tagged(self, stage_ids: list[int]):
        """Jobs started in the block carry this query's tag and a tag naming ``stage_ids``.

        Tags are the thread's (the Connect client's), and a request takes
        them when it is sent: the block covers only that.
        """
        tags = [self.group, _tag(self.observer.description(stage_ids))]
        for tag in tags:
            self.spark.addTag(tag)
        try:
            with self.runtime.progress_handler.running(self):
                yield
        finally:
            for tag in tags:
                self.spark.removeTag(tag)

    def _collect(self, frame, stage_ids: list[int]) -> pa.Table:
        """Run job ``frame`` for ``stage_ids``; its rows."""
        with self._running_job(), self._tagged(stage_ids):
            return spark_call(lambda: collect_arrow(frame), self._check_open, self.runtime.master)

    def _next(self, stream: Iterator):
        """The next item of a job's result stream, or :data:`_END` (Spark's errors translated)."""
        with self.runtime.progress_handler.running(self):
            return spark_call(lambda: next(stream, _END), self._check_open, self.runtime.master)

    def _spark_round(self, tasks, attempts):
        """One Spark job running ``tasks``; records where each ran; returns the failed ones.

        Tasks of a stage reading a Spark table run over the DataFrame's
        partitions (:meth:`_frame`), the others over ``spark.range``; all in
        one job (a union of the DataFrames). A task past the DataFrame's
        partitions (Spark made fewer) runs over an empty one, in a second job.
        """
        slots = self.runtime.num_workers()
        worker_args = self.runtime.executor_worker_args()
        stages: dict[int, StageRecord] = {}
        plain: list[TaskRecord] = []  # by Spark partition
        on_frames: dict[int, dict[int, int]] = {}  # Spark table stage -> {task: attempt}
        for sid, t in tasks:
            stage = self._stages[sid]
            scan = spark_scan(stage)
            if sid not in stages:
                stages[sid] = self.stage_record(stage, slots)
            if scan is not None and t not in self._beyond.get(sid, ()):
                on_frames.setdefault(sid, {})[t] = attempts[(sid, t)]
            else:
                plain.append((sid, t, attempts[(sid, t)]))
        frames = []
        if plain:
            fn = mapper(
                [(sid, t) for sid, t, _ in plain],
                run_task,
                False,
                self.query_id,
                plain,
                stages,
                worker_args,
            )
            frames.append(
                self.spark.range(0, len(plain), 1, len(plain)).mapInArrow(fn, ROUND_SCHEMA)
            )
        for sid, wanted in on_frames.items():
            frame, read_schema = self._frame(self._stages[sid])
            fn = mapper(
                [(sid, t) for t in range(self._stages[sid].num_tasks)],
                run_table_task,
                True,
                self.query_id,
                wanted,
                stages[sid],
                worker_args,
            )
            frames.append(frame.mapInArrow(fn, ROUND_SCHEMA))
        job = functools.reduce(lambda a, b: a.union(b), frames)
        table = self._collect(job, list(dict.fromkeys(sid for sid, _ in tasks)))
        results = [
            (sid, t, url, None if metrics is None else json.loads(metrics), error)
            for sid, t, url, metrics, error in zip(
                *(table.column(n).to_pylist() for n in ROUND_ARROW.names), strict=True
            )
        ]
        failed = self._task_results(results)
        ran = {(r[0], r[1]) for r in results}
        missing = [
            (sid, t) for sid, wanted in on_frames.items() for t in wanted if (sid, t) not in ran
        ]
        for sid, t in missing:
            self._beyond.setdefault(sid, set()).add(t)
        if missing:  # past the partitions Spark made: over an empty partition
            failed += self._spark_round(missing, attempts)
        return failed

    def _frame(self, stage: Stage) -> tuple:
        """``(DataFrame, read schema)`` of the Spark table ``stage`` reads, made once per query.

        The columns the query reads, coalesced to the stage's task count (no
        shuffle; Spark may make fewer partitions); Spark converts each
        partition to Arrow for ``mapInArrow``.

        Raises:
            PlanningError: the DataFrame is gone, belongs to another session,
                or its schema has a type Arrow cannot express.
        """
        if stage.stage_id not in self._frames:
            scan = spark_scan(stage)
            if scan is None:
                raise PlanningError(f"stage {stage.stage_id} reads no Spark DataFrame")
            self._frames[stage.stage_id] = _spark_frame(self.spark, stage, scan)
        return self._frames[stage.stage_id]

    def _part_job(self, graph: StageGraph, parts: list[HeadPart], pending: list, fn) -> list:
        """One Spark job running ``fn`` over the ``pending`` parts (see the classic run's)."""
        sid = graph.head.stage_id
        access, budget, threads = self.part_args(graph, parts)
        records = [(attempt, by_value(part)) for attempt, part in pending]
        job = mapper(
            [(sid, p.index) for _, p in pending],
            run_parts,
            False,
            records,
            access,
            budget,
            threads,
            pickle.dumps(fn),
        )
        frame = self.spark.range(0, len(records), 1, len(records)).mapInArrow(job, PARTS_SCHEMA)
        table = self._collect(frame, [sid])
        return [
            (index, None if value is None else pickle.loads(value), error)
            for index, value, error in zip(
                *(table.column(n).to_pylist() for n in PARTS_ARROW.names), strict=True
            )
        ]

    def _stream_part(self, graph: StageGraph, part: HeadPart) -> Iterator[pa.RecordBatch]:
        """Run head ``part`` (the whole head) as a one-task job; yield its batches as they come.

        Raises:
            TaskError: the head failed (after its first batch, or not because
                outputs were lost), names the head stage and the executor.
        """
        sid = graph.head.stage_id
        access, budget, threads = self.part_args(graph, [part])
        attempt = 0
        while True:
            urls = sorted(set(self.placement.values()) | self._used | self._to_cancel)
            job = mapper(
                [(sid, 0)],
                run_head,
                False,
                self.query_id,
                attempt,
                by_value(part),
                access,
                budget,
                threads,
                urls,
            )
            frame = self.spark.range(0, 1, 1, 1).mapInArrow(job, HEAD_SCHEMA)
            error = schema = None
            yielded = False
            with self._running_job():
                stream = stream_arrow(frame)
                try:
                    with self._tagged([sid]):  # the request goes out with the first item
                        table = self._next(stream)
                    while table is not _END:
                        for kind, data in zip(
                            table.column("kind").to_pylist(), table.column("data"), strict=True
                        ):
                            if kind == SCHEMA:
                                schema = pa.ipc.read_schema(data.as_buffer())
                            elif kind == BATCHES:
                                with pa.ipc.open_stream(data.as_buffer()) as reader:
                                    for batch in reader:
                                        yielded = True
                                        yield batch.cast(schema) if schema else batch
                            elif kind == METRICS:
                                metrics = TaskMetrics.from_dict(json.loads(data.as_py()))
                                self.observer.task_finished(metrics)
                            elif kind == CLEANED:
                                self._cleaned = True
                            elif kind == FAILED:
                                error = task_error_from_json(data.as_py())
                        table = self._next(stream)
                finally:
                    stream.close()
            if error is None:
                return
            attempt += 1
            if yielded or attempt >= self.runtime.task_max_failures:
                raise _gave_up(error, attempt)
            lost = self._lost_workers()
            if not lost or self._recoveries >= self.runtime.task_max_failures:
                raise _gave_up(error, attempt)
            self._recoveries += 1
            self._run_lost_again(lost)
            part = head_parts(self._head_plan(graph), graph.head, split=False)[0]


def _gave_up(err: TaskError, attempts: int) -> TaskError:
    cause = f"{err.cause} (gave up after {attempts} attempts)" if attempts > 1 else err.cause
    return TaskError(err.stage_id, err.task_index, err.worker, cause, err.remote_traceback)


_END = object()


def _spark_frame(spark, stage: Stage, scan: SourceScan) -> tuple:
    """The DataFrame of ``scan`` for ``stage``'s tasks, and the Arrow schema Spark gives it.

    Raises:
        PlanningError: see :meth:`_ConnectFlightQuery._frame`.
    """
    table = scan.source.name
    df = held_dataframe(scan.source.options["dataframe_id"], table)
    if not is_connect_dataframe(df) or df.sparkSession.session_id != spark.session_id:
        msg = f"table {table!r}: its Spark DataFrame belongs to another SparkSession"
        raise PlanningError(msg)
    cols = scan.source.options.get("columns")
    if cols is not None:  # only what the query reads: Spark prunes the rest at its source
        names = df.columns
        df = df.select(*["`" + names[i].replace("`", "``") + "`" for i in cols])
    try:
        read_schema = spark_arrow_schema(df.schema, spark.conf.get("spark.sql.session.timeZone"))
    except Exception as exc:
        msg = f"table {table!r}: Spark cannot read it as Arrow batches: {first_line(exc)}"
        raise PlanningError(msg) from exc
    # Each row says which partition of the coalesced DataFrame it is in: inside a
    # union (a round's job) the Spark task's own partition id is the union's.
    frame = df.coalesce(stage.num_tasks).selectExpr("*", f"spark_partition_id() AS {_PARTITION}")
    return frame, read_schema


_PARTITION = "__distfusion_partition"
"""The column :func:`_spark_frame` adds: the row's partition of the coalesced DataFrame."""
