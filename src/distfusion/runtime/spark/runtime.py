"""The Spark runtime: Spark schedules and runs every task of a stage graph.

Two data planes move stage outputs between tasks (``SparkRuntime(data_plane=...)``):

- ``"flight"`` (default, :mod:`~distfusion.runtime.spark.flight_plane`): stages
  run round by round, each round one Spark job of task plans; each executor
  Python worker keeps its tasks' outputs in an Arrow Flight server of its own,
  and consumer tasks (and the head stage, on the driver) read them from there.
  Nothing but plans and per-task sizes crosses the JVM. Lost outputs are
  computed again.
- ``"shuffle"`` (:mod:`~distfusion.runtime.spark.shuffle_plane`): outputs go
  through Spark's shuffle and broadcasts; Spark keeps them in its shuffle files.

docs/spark-data-path.md measures both. What runs on the executors is in
:mod:`distfusion.worker.spark_tasks`; Spark DataFrames read as tables in
:mod:`~distfusion.runtime.spark.dataframes`; a Spark Connect session runs on
:class:`~distfusion.runtime.spark.connect.SparkConnectRuntime`.

``pyspark`` is an optional dependency: it is imported inside the functions
that need it (each marked so), when a SparkRuntime is created or a task runs.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from distfusion.allocator import keep_freed_memory
from distfusion.coordinator.query_run import (
    QueryRun,
    RuntimeProfile,
    default_target_partitions,
)
from distfusion.errors import (
    PlanningError,
    TaskPanicked,
    TransportError,
    WorkerUnavailableError,
)
from distfusion.planner.config import in_place_bytes
from distfusion.protocol.errors import (
    error_from_dict,
)
from distfusion.runtime.resolver import SparkWorkerResolver
from distfusion.runtime.spark.config import (
    DATA_PLANES,
    encryption_settings,
    import_pyspark,
    is_connect_session,
    same_interpreter,
    with_local_retries,
)
from distfusion.runtime.spark.flight_plane import SparkFlightQuery
from distfusion.runtime.spark.jobs import missing_module, missing_module_message, translate_error
from distfusion.runtime.spark.reach import check_connect_server, check_master
from distfusion.runtime.spark.session import gateway_ends_with_this_process, stop_session
from distfusion.runtime.spark.shuffle_plane import SparkShuffleQuery
from distfusion.stages import StageGraph
from distfusion.transport.feed_endpoint import FeedEndpoint
from distfusion.transport.tls import self_signed_tls
from distfusion.worker.memory import spark_memory_per_task_bytes
from distfusion.worker.spark_tasks import EXECUTOR_QUERY_TTL_S, DataPlaneAccess, import_probe

log = logging.getLogger(__name__)

WARM_INTERVAL_S = 20.0
"""Seconds between keep-warm checks (:meth:`SparkRuntime.used_workers`); PySpark
ends a Python worker idle for 60 s."""

WARM_FOR_S = 600.0
"""Seconds after a query's last Spark job that its Python workers are kept warm."""

WARM_CLOSE_WAIT_S = 10.0
"""Seconds :meth:`SparkRuntime.close` waits for a running keep-warm job to end."""

WARM_JOB_GROUP = "distfusion-keep-warm"
"""The Spark job group of the keep-warm jobs (no query's)."""


class SparkRuntime:
    """Runs stage graphs on Spark: each stage is an RDD, each task a Spark task.

    Args:
        spark: the SparkSession to use; when None, an embedded session is started
            (or the active one reused) with ``master``, the Spark UI off and
            ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON``/``spark.pyspark.python``
            defaulting to this interpreter, so executors import the same
            distfusion and datafusion. A local-mode session given here whose
            Python nobody chose runs its Python workers with this interpreter
            too (:meth:`_use_driver_python`).
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
            as well only costs time (docs/benchmarks.md, "Spark stage outputs").
        task_max_failures: attempts per task before the query fails (Spark's
            ``spark.task.maxFailures``, default 4).
        conf: more Spark settings for the embedded session, e.g.
            ``{"spark.driver.memory": "8g"}``.
        progress: show Spark's console progress bar (embedded session only).
        executor_wait_s: for a cluster master, seconds to wait at start for a
            first executor to register.
        data_plane: how stage outputs move between tasks. ``"flight"``
            (default): each executor Python worker keeps its tasks' outputs in
            an Arrow Flight server of its own and consumers read them from
            there (docs/spark-data-path.md); Spark still schedules and retries
            every task. ``"shuffle"``: outputs go through Spark's shuffle
            (Spark keeps them in its shuffle files).

    Raises:
        ImportError: pyspark is not installed.
        TransportError: ``master`` names a host that does not resolve or takes
            no connection (checked in seconds, before Spark starts:
            :func:`~distfusion.runtime.spark.reach.check_master`); ``spark`` is
            a Connect session whose server does not answer
            (:func:`~distfusion.runtime.spark.reach.check_connect_server`).
        PlanningError: a cluster master has no executor after ``executor_wait_s``.
    """

    name = "spark"
    bytes_per_task = 256 * 1024 * 1024
    """Default input bytes per task (``DistributedConfig.bytes_per_task``).

    A Spark task with a Python worker costs ~0.1 s to schedule, start and
    return, and every task of a broadcast join loads the broadcast and builds
    its hash table again, so fewer, larger tasks than in process win
    (docs/benchmarks.md, "Task sizes on Spark"). Spark SQL reads files in
    128 MiB splits (``spark.sql.files.maxPartitionBytes``).
    """

    connect_runtime: type | None = None
    """The class that runs on a Spark Connect session (``SparkRuntime(spark=<Connect
    session>)`` makes one): :class:`~distfusion.runtime.spark.connect.SparkConnectRuntime`,
    set when that module is imported (the runtime registry imports it)."""

    _warming: threading.Thread | None = None
    """:meth:`used_workers`' keep-warm thread, once a query started it."""

    _warm_stop: threading.Event | None = None
    """Set to stop the keep-warm thread (set from the start with dynamic allocation);
    None on a Spark Connect runtime, which keeps no workers warm this way."""

    def __new__(cls, spark=None, *args, **kwargs):
        """A :attr:`connect_runtime` for a Spark Connect session, else a SparkRuntime.

        Raises:
            TransportError: ``spark`` is a Connect session whose server does not answer.
        """
        if is_connect_session(spark):
            check_connect_server(spark)  # before any call, which would retry for minutes
        if cls is SparkRuntime and is_connect_session(spark) and cls.connect_runtime is not None:
            cls = cls.connect_runtime
        return super().__new__(cls)

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
    ) -> None:
        given_conf = dict(conf or {})
        if data_plane not in DATA_PLANES:
            msg = f"data_plane must be one of {', '.join(DATA_PLANES)}; got {data_plane!r}"
            raise ValueError(msg)
        import_pyspark()
        from pyspark.sql import SparkSession  # optional dependency

        self._owns_session = False
        if spark is None:
            active = SparkSession.getActiveSession()
            if active is not None:
                spark = active
            else:
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
                os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
                settings = {
                    "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
                    "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "true" if progress else "false",
                    "spark.driver.memory": "4g",
                    "spark.task.maxFailures": str(task_max_failures),
                    "spark.sql.execution.arrow.pyspark.enabled": "true",
                    "spark.sql.session.timeZone": "UTC",
                    # Unix sockets to the Python workers: no TCP delayed-ACK
                    # stalls; ~40 ms less per Spark task here.
                    "spark.python.unix.domain.socket.enabled": "true",
                    # PySpark's daemon, quiet when Spark closes an idle worker's
                    # Unix socket (distfusion_spark_daemon).
                    "spark.python.daemon.module": "distfusion_spark_daemon",
                    **(conf or {}),
                }
                check_master(master)  # Spark takes ~67 s to fail, and hides the cause
                builder = SparkSession.builder.master(
                    with_local_retries(master, task_max_failures)
                ).appName("distfusion")
                for key, value in settings.items():
                    builder = builder.config(key, value)
                with gateway_ends_with_this_process():
                    spark = builder.getOrCreate()
                spark.sparkContext.setLogLevel("ERROR")
                self._owns_session = True
        self.spark = spark
        self.sc = spark.sparkContext
        keep_freed_memory(self.sc.environment)  # the Python workers' (distfusion.allocator)
        self._use_driver_python()
        self._checked_python: str | None = None  # the executors' Python found to import distfusion
        self._python_lock = threading.Lock()
        self.resolver = SparkWorkerResolver(self.sc)
        self.target_partitions = target_partitions or default_target_partitions()
        self.compression = compression
        self._held: dict[str, int] = {}  # query id -> bytes of stage outputs on the driver
        spark_conf = self.sc.getConf()
        self.task_max_failures = int(
            spark_conf.get("spark.task.maxFailures", str(task_max_failures))
        )
        if (
            data_plane == "flight"
            and spark_conf.get("spark.python.worker.reuse", "true") == "false"
        ):
            # Each task's Python worker exits after it, and the outputs it holds with it.
            log.warning("spark.python.worker.reuse is false: outputs go through Spark's shuffle")
            data_plane = "shuffle"
        self.encryption = encryption_settings({**dict(spark_conf.getAll()), **given_conf})
        """The Spark settings asking for encryption (:data:`ENCRYPTION_SETTINGS`)."""
        tls = None
        self.explain_note = ""
        """What ``explain()`` says about this runtime's data plane ("" when nothing to say)."""
        if self.encryption:  # the Flight plane and the feed endpoint serve TLS
            asked = ", ".join(f"{k}=true" for k in self.encryption)
            try:
                tls = self_signed_tls()
            except ImportError as exc:
                if data_plane == "flight":
                    data_plane = "shuffle"
                    self.explain_note = (
                        f"Spark data plane: shuffle, not Flight: Spark encrypts ({asked}) and {exc}"
                    )
                else:
                    self.explain_note = f"Spark feed endpoint without TLS: {exc}"
                log.warning("%s", self.explain_note)
            else:
                plane = "Flight over TLS" if data_plane == "flight" else "shuffle"
                self.explain_note = f"Spark data plane: {plane} (Spark encrypts: {asked})"
                log.info("%s: distfusion's Flight servers use TLS (its own certificate)", asked)
        self.data_plane = data_plane
        self.token = secrets.token_hex(16)  # executors' Flight workers accept only this runtime
        self.access = DataPlaneAccess(self.token, tls)
        self.tls = tls
        self.transport = self.access.transport()
        self.executor_urls: set[str] = set()  # Flight workers tasks reported, all queries
        self._feed_endpoint = None  # the driver's FeedEndpoint, started by the first feed
        self._driver_worker = None  # the driver's FlightWorker, started by the first small stage
        self._live_runs: dict[str, SparkFlightQuery] = {}  # query id -> run, until it is closed
        self._endpoint_lock = threading.Lock()
        self._memory_per_task_bytes: int | None = None
        self.held_results: dict[str, QueryRun] = {}  # query id -> run of a result Spark reads
        self.warm_interval_s = WARM_INTERVAL_S
        """Seconds between the checks of :meth:`used_workers`'s keep-warm thread."""
        self.warm_for_s = WARM_FOR_S
        """Seconds after a query's last Spark job that the workers are kept warm."""
        self._last_job = 0.0  # time.monotonic() of the last Spark job of a query
        self._warm_stop = threading.Event()
        if spark_conf.get("spark.dynamicAllocation.enabled", "false") == "true":
            self._warm_stop.set()  # idle executors stay free to go: none kept warm
        if not self.sc.master.startswith("local"):
            self.resolver.wait_for_executors(1, executor_wait_s)

    @property
    def master(self) -> str:
        """Where the tasks run: the Spark master URL."""
        return self.sc.master

    def serves(self, spark) -> bool:
        """Whether this runtime runs its tasks on ``spark``'s application, which is still up."""
        return (
            not is_connect_session(spark)
            and self.sc is spark.sparkContext
            and self.sc._jsc is not None  # noqa: SLF001 (pyspark: None once the context stopped)
        )

    flight_wave_bytes_per_task = 2 * 1024 * 1024 * 1024
    """Input bytes per task of a stage that needs more tasks than slots at
    ``bytes_per_task``, on the Flight data plane (its task count is then
    rounded up to whole waves of slots; ``DefaultTaskEstimator.wave_bytes_per_task``).

    On the Flight plane no output goes through Spark, so tasks past the slot
    count add no parallelism and only cost: a Spark task each, every broadcast
    read and its hash table built again, one more output piece for every
    consumer task to fetch. 2 GiB tasks take as little CPU as the local
    runtime (docs/benchmarks.md, "Task sizes on Spark").
    ``DistributedConfig.bytes_per_task`` set by the user turns this off.
    """

    @property
    def wave_bytes_per_task(self) -> int | None:
        """``DefaultTaskEstimator.wave_bytes_per_task`` on the Flight data plane, else None."""
        return self.flight_wave_bytes_per_task if self.data_plane == "flight" else None

    flight_shuffle_bytes_per_task: int | None = 64 * 1024 * 1024
    """Input bytes per task of a stage fed by a shuffle, on the Flight data plane
    (``DefaultTaskEstimator.shuffle_bytes_per_task``).

    Such a stage runs as a Spark job whatever its task count, so it fills the
    slots (a second task in the same job costs ~30 ms here) rather than waiting
    for 256 MiB, which left a large shuffle to one long task
    (docs/benchmarks.md, "Task sizes on Spark").
    """

    @property
    def shuffle_bytes_per_task(self) -> int | None:
        """``DefaultTaskEstimator.shuffle_bytes_per_task`` on the Flight data plane, else None."""
        return self.flight_shuffle_bytes_per_task if self.data_plane == "flight" else None

    max_tasks = 1024
    """Most tasks a stage gets: on Spark, slots limit how many tasks run at once,
    not how many a stage has (the scheduler queues them), so task counts follow
    the data size (``bytes_per_task``) up to this."""

    @property
    def memory_per_task_bytes(self) -> int:
        """Default DataFusion memory pool of one task, in bytes.

        Used when ``DistributedConfig.memory_per_task_bytes`` is None.

        From the application's settings
        (:func:`~distfusion.worker.memory.spark_memory_per_task_bytes`):
        ``spark.executor.pyspark.memory``, else ``spark.executor.memory`` (local
        mode: half of the machine), divided by one executor's task slots
        (``spark.executor.cores``; local mode: the master's threads).
        """
        if self._memory_per_task_bytes is None:
            conf = dict(self.sc.getConf().getAll())
            conf["spark.master"] = self.sc.master
            if self.sc.master.startswith("local"):
                slots = self.sc.defaultParallelism
            else:
                slots = int(conf.get("spark.executor.cores", "1"))
            self._memory_per_task_bytes = spark_memory_per_task_bytes(conf, slots)
        return self._memory_per_task_bytes

    def task_memory_bytes(self, graph: StageGraph) -> int:
        """The memory pool of a task of ``graph`` here, bytes (the one place it is resolved).

        The graph's ``memory_per_task_bytes`` (the query's setting), else
        :attr:`memory_per_task_bytes`.
        """
        return graph.memory_per_task_bytes or self.memory_per_task_bytes

    @property
    def broadcast_copies(self) -> int:
        """Copies of a broadcast Spark makes at most: one per task slot's Python worker.

        Executors fetch a ``Broadcast`` once and each reused Python worker loads
        it once, however many tasks of the stage read it.
        """
        return len(self.resolver.get_urls()) or 1

    def profile(self) -> RuntimeProfile:
        """See :meth:`Runtime.profile`: Spark's task sizes, task cap and broadcast copies.

        :attr:`bytes_per_task`, :attr:`wave_bytes_per_task` and
        :attr:`shuffle_bytes_per_task` (the last two on the Flight data plane
        only), :attr:`max_tasks`, :attr:`broadcast_copies` (the workers now);
        leaf stages may read Spark DataFrames; ``explain()`` notes the data
        plane when Spark encrypts (:attr:`explain_note`); its tasks' memory
        budget (:attr:`memory_per_task_bytes`); the query size that runs in
        place on the driver (:func:`~distfusion.planner.config.in_place_bytes`
        of the slots: 320 MiB per driver core in ``local[N]`` mode or on a
        cluster with no more slots than the driver has cores). The Spark
        Connect runtime declares the same (its own ``broadcast_copies`` and
        memory budget).
        """
        return RuntimeProfile(
            bytes_per_task=self.bytes_per_task,
            wave_bytes_per_task=self.wave_bytes_per_task,
            shuffle_bytes_per_task=self.shuffle_bytes_per_task,
            max_tasks=self.max_tasks,
            broadcast_copies=self.broadcast_copies,
            reads_spark_dataframes=True,
            explain_note=self.explain_note,
            in_place_bytes=in_place_bytes(self.num_workers()),
            task_memory_bytes=self.memory_per_task_bytes,
        )

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
        run = self.start_query(graph.query_id)
        try:
            yield from run.stream_head(graph)
        finally:
            run.close()

    def start_query(self, query_id: str) -> QueryRun:
        """Start query ``query_id`` stage by stage.

        Returns:
            a :class:`~distfusion.coordinator.query_run.QueryRun`.

        Raises:
            TransportError: the executors' Python cannot import distfusion,
                datafusion or pyarrow (:meth:`check_executor_python`).
        """
        self.check_executor_python()
        if self.data_plane == "flight":
            return SparkFlightQuery(self, query_id)
        return SparkShuffleQuery(self, query_id)

    def _use_driver_python(self) -> None:
        """Run a local-mode session's Python workers with this interpreter when nobody chose one.

        PySpark starts its Python workers with ``PYSPARK_PYTHON``, else
        ``python3`` from the ``PATH`` (``SparkContext.pythonExec``): a session
        made with ``SparkSession.builder`` in a venv that is not first on the
        ``PATH`` runs its tasks in another Python, without distfusion (nor
        pyarrow). In local mode the executors run on this machine, where this
        interpreter is, and PySpark requires the workers' Python version to be
        the driver's anyway, so a session whose Python was not chosen
        (``PYSPARK_PYTHON`` unset, no ``spark.pyspark.python``, PySpark's
        default ``python3``) runs them with ``sys.executable``, as the
        embedded session does. ``spark.pyspark.python`` set on a session
        whose ``PYSPARK_PYTHON`` is unset (PySpark reads only the variable,
        ``spark-submit`` sets it from the setting) is the Python its workers
        run, as Spark documents it. A cluster's executors otherwise keep what
        they are given (docs/spark.md, "Running on a Spark cluster: distfusion on the executors").
        """
        sc = self.sc
        if os.environ.get("PYSPARK_PYTHON") or sc.pythonExec != "python3":
            return  # chosen through the environment
        python = sc.getConf().get("spark.pyspark.python")
        if not python and sc.master.startswith("local"):
            python = sys.executable
        if python:
            log.info("Python workers run with %s (PYSPARK_PYTHON unset)", python)
            sc.pythonExec = python

    def check_executor_python(self) -> None:
        """Check once per executor interpreter that the executors' Python imports distfusion.

        A tiny Spark job (one task, standard library only in its closure, so
        it unpickles anywhere) imports distfusion, datafusion and pyarrow on an
        executor and returns the first ``ImportError`` instead of failing: a
        missing module then becomes one short error before any task of the
        query runs, rather than a failed job with Spark's logs and Java
        traces. Skipped in local mode when the executors run this
        interpreter. Called by :meth:`start_query`; the result is kept per
        ``SparkContext.pythonExec``.

        Raises:
            TransportError: the executors' Python cannot import one of them;
                the message names the interpreter, the module and the section of
                docs/spark.md on installing distfusion on executors. Also when the
                probe's job fails (Spark's error's last Python line).
        """
        python = self.sc.pythonExec
        with self._python_lock:
            if python == self._checked_python:
                return
            local = self.sc.master.startswith("local")
            if not (local and same_interpreter(python, sys.executable)):
                probe = self.sc.parallelize([0], 1).mapPartitions(import_probe())
                try:
                    failure = probe.collect()
                except Exception as exc:  # e.g. a Python PySpark refuses (another version)
                    missing = missing_module(str(exc))
                    if missing:  # the embedded session's daemon did not start
                        raise TransportError(missing_module_message(python, missing)) from None
                    raise translate_error(exc, self.sc.master) from None
                if failure:
                    raise TransportError(missing_module_message(python, failure[0]))
            self._checked_python = python

    def executor_worker_args(self) -> tuple[str, str | None, tuple, int, str | None]:
        """``(bind host, advertised host, access, task memory, driver URL)`` for executor workers.

        ``access``: the token, and the TLS certificate and key when the data
        plane is encrypted (:meth:`DataPlaneAccess.plain`).

        Local mode: 127.0.0.1. A cluster: every interface, advertised under the
        executor's own address (``None``: resolved on the executor). Memory:
        :attr:`memory_per_task_bytes`, for plans that set none. The driver's
        worker (:meth:`driver_worker`) is where an executor's worker says it
        started, so that closing a query reaches workers no task of it has
        reported yet (see :meth:`_executor_started`).
        """
        driver = self.driver_worker().url
        if self.sc.master.startswith("local"):
            return "127.0.0.1", None, self.access.plain(), self.memory_per_task_bytes, driver
        return "0.0.0.0", None, self.access.plain(), self.memory_per_task_bytes, driver

    def track_run(self, run: SparkFlightQuery) -> None:
        """``run`` runs until :meth:`forget_query`: started workers and panics reach it."""
        self._live_runs[run.query_id] = run

    def forget_query(self, query_id: str) -> None:
        """Query ``query_id`` ended: forget its run, its held result, its feeds and bytes held."""
        self._live_runs.pop(query_id, None)
        self.held_results.pop(query_id, None)
        self._held.pop(query_id, None)
        if self._feed_endpoint is not None:
            self._feed_endpoint.forget(query_id)

    def hold_bytes(self, query_id: str, nbytes: int) -> None:
        """Query ``query_id`` holds ``nbytes`` more of stage outputs on the driver (``stats``)."""
        self._held[query_id] = self._held.get(query_id, 0) + nbytes

    def _executor_started(self, url: str, query_id: str) -> bool:
        """An executor's Flight worker at ``url`` started for a task of ``query_id``.

        Known from now on, so closing any query tells it (before, the driver
        learnt a worker only from a task's result: a Python worker Spark
        started during a query ran a closed query's task on until Spark
        killed it). Returns True when ``query_id`` is no longer running here
        (closed, or unknown): its task must not run.
        """
        self.executor_urls.add(url)
        run = self._live_runs.get(query_id)
        return run is None or run.closed

    def _task_panicked(self, query_id: str, error: dict) -> None:
        """A task of ``query_id`` panicked on an executor (``error``: its encoded TaskPanicked).

        Called by the driver's worker (``task_failed``) while the task's Spark
        job still runs; the query's run fails at once (:meth:`SparkFlightQuery.panicked`).
        """
        run = self._live_runs.get(query_id)
        err = error_from_dict(error)
        if run is not None and isinstance(err, TaskPanicked):
            run.panicked(err)

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
        stats = {self.sc.master: {"live_tasks": live, "bytes_held": sum(self._held.values())}}
        for url in sorted(self.executor_urls):
            try:
                stats[url] = self.transport.stats(url, timeout_s=5.0)
            except WorkerUnavailableError:  # its Python worker exited: it holds nothing
                self.executor_urls.discard(url)
        return stats

    def feed_endpoint(self):
        """The driver's work unit feed endpoint (started on first use), where tasks pull feeds.

        Local mode: 127.0.0.1. A cluster: every interface, advertised as
        ``spark.driver.host``.

        Raises:
            ImportError: pyarrow has no Flight support.
        """
        with self._endpoint_lock:
            if self._feed_endpoint is None:
                if self.sc.master.startswith("local"):
                    self._feed_endpoint = FeedEndpoint("127.0.0.1", tls=self.tls)
                else:
                    host = self.sc.getConf().get("spark.driver.host", socket.gethostname())
                    self._feed_endpoint = FeedEndpoint("0.0.0.0", advertise_host=host, tls=self.tls)
            return self._feed_endpoint

    driver_stage_bytes = 64 * 1024 * 1024
    """On the Flight data plane, a one-task stage that reads no table (or few
    files, :attr:`driver_scan_bytes`) and at most this many bytes of inputs
    runs on the driver's own Flight worker (:meth:`driver_worker`) instead of
    as a Spark job: a job with one Python task costs ~60-130 ms here, the
    stage itself (a final aggregate or join over a few MiB, say) little more.
    Larger stages run beside the round's Spark tasks on the same cores and
    slow both (docs/benchmarks.md, "Small queries in place on shared cores").
    0 turns it off."""

    driver_scan_bytes = 64 * 1024 * 1024
    """A one-task leaf stage reading files of at most this many bytes in all
    (and inputs within :attr:`driver_stage_bytes`) runs on the driver too, at
    the same time as the rest of its round: DataFusion reads that much Parquet
    in about the time a Spark job takes to start (the small dimension sides
    of a TPC-H SF1 join, which a broadcast brings through the driver in Spark
    SQL anyway). The driver must reach the files, as it does for a query run
    in place."""

    def lone_stage_bytes(self) -> int:
        """Bytes of files and of inputs up to which a lone one-task stage runs on the driver.

        The in-place bound of the slots (:func:`~distfusion.planner.config.in_place_bytes`):
        where the executors share the driver's cores (``local[N]``: 320 MiB
        per slot), such a stage's Spark job adds ~0.1 s and its JVM's work to
        the same cores and nothing else, and no Spark task of its round runs
        beside it (TPC-H SF10: the filtered customer or part side of Q3, Q13,
        Q14, Q17, Q19). Elsewhere 16 MiB, below :attr:`driver_scan_bytes` and
        :attr:`driver_stage_bytes`, which then apply.

        Raises:
            PlanningError: Spark reports no executor.
        """
        return in_place_bytes(self.num_workers())

    def driver_worker(self):
        """This runtime's Flight worker in the driver process (started on first use).

        Runs the small one-task stages of the Flight data plane
        (:attr:`driver_stage_bytes`); executors' tasks and the head stage read
        their outputs over Flight like any other. Local mode: 127.0.0.1. A
        cluster: every interface, advertised as ``spark.driver.host``.

        Raises:
            ImportError: pyarrow has no Flight support.
        """
        from distfusion.worker.flight_server import FlightWorker  # optional: pyarrow.flight

        with self._endpoint_lock:
            if self._driver_worker is None:
                bind, advertise = "127.0.0.1", None
                if not self.sc.master.startswith("local"):
                    bind = "0.0.0.0"
                    advertise = self.sc.getConf().get("spark.driver.host", socket.gethostname())
                self._driver_worker = FlightWorker(
                    host=bind,
                    **self.access.worker_options(),
                    slots=self.target_partitions,
                    query_ttl_s=EXECUTOR_QUERY_TTL_S,
                    advertise_host=advertise,
                )
                self._driver_worker.on_worker_started = self._executor_started
                self._driver_worker.on_task_failed = self._task_panicked
                self.executor_urls.add(self._driver_worker.url)  # in stats() and idle checks
            return self._driver_worker

    def used_workers(self) -> None:
        """A query ran a Spark job: keep the executors' Python workers warm for a while.

        PySpark ends a Python worker idle for a minute (``PythonWorkerFactory``'s
        idle timeout); the next query's tasks then start new ones, which import
        distfusion, DataFusion and pyarrow and start their Flight servers
        again: TPC-H SF10 Q17 took 5.7 s after 70 s idle, 3.2-3.6 s back to
        back. So a thread started by the first query runs a tiny Python job
        (one task per slot) every :attr:`warm_interval_s` seconds in which no
        query ran one, until :attr:`warm_for_s` after the last query's (the
        workers then go as PySpark's would), and never with dynamic allocation,
        which releases idle executors and should not be kept from it.
        """
        self._last_job = time.monotonic()
        if self._warming is not None or self._warm_stop is None or self._warm_stop.is_set():
            return
        self._warming = threading.Thread(
            target=self._keep_workers_warm, name="distfusion-warm-workers", daemon=True
        )
        self._warming.start()

    def _keep_workers_warm(self) -> None:
        """The loop of :meth:`used_workers`' thread, until :meth:`close`."""
        stop = self._warm_stop
        assert stop is not None  # the thread starts only once it is set
        while not stop.wait(self.warm_interval_s):
            idle = time.monotonic() - self._last_job
            if idle < self.warm_interval_s or idle > self.warm_for_s:
                continue
            try:
                self.warm_job(WARM_JOB_GROUP, "distfusion: keep Python workers warm")
            except Exception:  # the session stopped: nothing to keep
                return

    def warm_job(self, group: str, description: str) -> None:
        """Run a tiny Python Spark job, one task per slot, in job group ``group``.

        Each task takes an idle Python worker of its executor, whose idle
        timer starts again. Job groups are per thread (PySpark pins threads):
        ``group`` is the calling thread's from then on.

        Raises:
            Exception: Spark's, when the session stopped.
        """
        n = max(1, self.num_workers())
        self.sc.setJobGroup(group, description, True)
        self.sc.parallelize(range(n), n).mapPartitions(lambda it: [0]).collect()

    def close(self) -> None:
        """Release every held result, stop the SparkSession when this runtime started it."""
        if self._warm_stop is not None:
            self._warm_stop.set()
            if self._warming is not None:  # a keep-warm job running ends first
                self._warming.join(WARM_CLOSE_WAIT_S)
        for run in list(self.held_results.values()):
            run.close()
        self.held_results.clear()
        if self._feed_endpoint is not None:
            self._feed_endpoint.close()
            self._feed_endpoint = None
        if self._driver_worker is not None:
            self.executor_urls.discard(self._driver_worker.url)
            self._driver_worker.close()
            self._driver_worker = None
        self.transport.close()
        if self._owns_session:
            stop_session(self.spark)
            self._owns_session = False

    def __repr__(self) -> str:
        return f"SparkRuntime(master={self.sc.master!r}, workers={len(self.resolver.get_urls())})"
