"""The Spark runtime: Spark schedules and runs every task of a stage graph.

Two data planes move stage outputs between tasks (``SparkRuntime(data_plane=...)``):

- ``"flight"`` (default, :class:`_SparkFlightQuery`): stages run round by
  round, each round one Spark job of task plans; each executor Python worker
  keeps its tasks' outputs in an Arrow Flight server of its own, and consumer
  tasks (and the head stage, on the driver) read them from there. Nothing but
  plans and per-task sizes crosses the JVM. Lost outputs are computed again.
- ``"shuffle"`` (:class:`_SparkQuery`, below): outputs go through Spark's
  shuffle and broadcasts; Spark keeps them in its shuffle files.

docs/spark-data-path.md measures both. The shuffle plane:

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
one line, ``DISTFUSION_TASK_ERROR {json}`` (the protocol's error codec,
:mod:`distfusion.protocol.errors`, plus Spark's attempt count), which the
driver turns back into a :class:`~distfusion.errors.TaskError` naming the
stage and the task.

A leaf stage reading a Spark DataFrame (:func:`~distfusion.sources.spark_source`)
starts from the DataFrame itself rather than from ``parallelize``: its RDD is
the DataFrame coalesced to the stage's task count and converted to Arrow by
Spark in each partition (``Dataset.toArrowBatchRdd``, what ``toArrow()``
collects, here left distributed), and task *i* runs in the Spark task that
computes partition *i*, fed that partition's batches
(:mod:`distfusion.worker.spark_partitions`). Spark's readers, pushdowns and
shuffles compute the DataFrame; nothing of it reaches the driver. On either
data plane the task's output then goes where every other task's goes::

    DataFrame.coalesce(n) -> toArrowBatchRdd (Spark)  partition i: Arrow batches
      .mapPartitionsWithIndex(run task i, fed partition i)  -> output as any task's

When Spark makes fewer partitions than the stage has tasks (an adaptive
shuffle coalesced), the tasks past them run over an empty partition.

``pyspark`` is an optional dependency: it is imported inside the functions
that need it (each marked so), when a SparkRuntime is created or a task runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from distfusion import object_store, udfs
from distfusion.errors import (
    PlanningError,
    QueryCancelledError,
    TaskError,
    TaskPanicked,
    TransportError,
    WorkerUnavailableError,
)
from distfusion.metrics.observer import observer_for
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import (
    error_from_dict,
    error_to_dict,
    is_task_failure,
    task_error,
)
from distfusion.protocol.task_plan import TaskPlan
from distfusion.resolver import SparkWorkerResolver
from distfusion.runtime.base import (
    QueryRun,
    StageStats,
    WorkerQueryRun,
    default_target_partitions,
    task_threads,
)
from distfusion.runtime.feeds import QueryFeeds, has_feeds
from distfusion.stages import BROADCAST, SourceScan, Stage, StageGraph, StageInput
from distfusion.transport.feed_endpoint import FeedEndpoint
from distfusion.transport.tls import TlsMaterial, self_signed_tls
from distfusion.worker.execute_task import run_task, stream_head_stage, without_views
from distfusion.worker.head_parts import HeadPart, run_part
from distfusion.worker.memory import TaskMemory, spark_memory_per_task_bytes
from distfusion.worker.spark_partitions import offering
from distfusion.worker.worker import pulled_feed_chunks
from distfusion.write import WriteSpec, write_part

__all__ = [
    "SparkRuntime",
    "DataPlaneAccess",
    "ENCRYPTION_SETTINGS",
    "encryption_settings",
    "FAIL_TASK_PROPERTY",
    "hold_dataframe",
    "import_pyspark",
    "is_connect_session",
    "job_group",
    "spark_scan",
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
A Spark Connect session has no local properties: tag the thread's jobs with
``spark.addTag(FAIL_TASK_PROPERTY + "=1:0:1")`` instead (job tags reach the tasks).
"""

DATA_PLANES = ("flight", "shuffle")
"""Values of ``SparkRuntime(data_plane=...)``."""

EXECUTOR_QUERY_TTL_S = 600.0
"""Seconds an executor's Flight worker keeps a query nobody asked about (driver gone)."""

KEEP_WARM_S = 20.0
"""Seconds between the keep-warm jobs of a held result (PySpark's idle timeout is 60 s)."""

ENCRYPTION_SETTINGS = (
    "spark.network.crypto.enabled",
    "spark.authenticate.enableSaslEncryption",
    "spark.io.encryption.enabled",
    "spark.ssl.enabled",
    "spark.ssl.rpc.enabled",
)
"""Spark settings that ask for encryption: with any of them ``true``, the
Flight data plane serves TLS too (:func:`encryption_settings`). Spark's RPC
(AES-based, or SASL), its shuffle and spill files, and TLS for all or for RPC
(Spark's security page). Files: distfusion's own spill files stay
unencrypted (docs/memory.md)."""

log = logging.getLogger("distfusion.runtime.spark")

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child calls before ``exec`` to get SIGTERM when its parent thread ends.

    ``PR_SET_PDEATHSIG``; None where there is no ``prctl`` (not Linux). Looked up here, in the parent: the child of a threaded process must not load
    libraries or take locks before ``exec``; the call itself allocates nothing.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    sigterm = int(signal.SIGTERM)
    return lambda: prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)


@contextlib.contextmanager
def _gateway_ends_with_this_process() -> Iterator[None]:
    """Within it, a Spark JVM that PySpark launches (an embedded session) ends with this process.

    PySpark's ``launch_gateway`` gives the JVM a pipe on standard input, to end
    it when Python goes; interrupted during start-up (Ctrl-C), it deletes the
    directory the JVM writes its connection file to, the JVM's main thread
    fails before reading that pipe, and py4j's server thread keeps the JVM
    alive (issue 25: still running 16 minutes later). So: a JVM started here
    is killed when the start-up fails or is interrupted (a Ctrl-C while
    ``Popen`` runs is held until it returned, so the process is known); and,
    started from the main thread, it gets SIGTERM when this process dies
    however it ends (``PR_SET_PDEATHSIG``; Spark's shutdown hooks stop it as
    on a normal exit). Wraps the module's ``Popen`` for the call only:
    ``launch_gateway`` overwrites a ``preexec_fn`` given to it.
    """
    import pyspark.java_gateway as java_gateway

    started: list = []
    original = java_gateway.Popen
    main = threading.current_thread() is threading.main_thread()
    die_with_parent = _parent_death_signal() if main else None  # a thread's end would kill it

    def popen(command, **kwargs):
        inner = kwargs.get("preexec_fn")

        def preexec() -> None:
            if inner is not None:
                inner()
            if die_with_parent is not None:
                die_with_parent()

        kwargs["preexec_fn"] = preexec
        held: list = []
        previous = signal.signal(signal.SIGINT, lambda *a: held.append(a)) if main else None
        try:
            proc = original(command, **kwargs)
            started.append(proc)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(*held[0])  # Python's handler raises KeyboardInterrupt
            raise KeyboardInterrupt
        return proc

    java_gateway.Popen = popen
    try:
        yield
    except BaseException:
        for proc in started:  # the start failed or was interrupted: no JVM left behind
            proc.kill()
            proc.wait()
        raise
    finally:
        java_gateway.Popen = original


def encryption_settings(settings: dict[str, str]) -> list[str]:
    """The :data:`ENCRYPTION_SETTINGS` that are ``true`` in ``settings`` (Spark's conf)."""
    return [k for k in ENCRYPTION_SETTINGS if str(settings.get(k, "")).strip().lower() == "true"]


@dataclass(frozen=True)
class DataPlaneAccess:
    """What an executor needs to serve and read a runtime's Flight data plane.

    Travels to the executors in Spark's task closures as the plain tuple of
    :meth:`plain` (standard types: a closure must unpickle on an executor
    without distfusion, to say it is missing), as the token always did (when
    Spark encrypts, its RPC carries them encrypted).

    Attributes:
        token: the runtime's shared secret; every call carries it.
        tls: the runtime's certificate and key when the data plane is
            encrypted (:mod:`distfusion.transport.tls`); None: plain gRPC.
    """

    token: str
    tls: TlsMaterial | None = None

    def plain(self) -> tuple[str, bytes | None, bytes | None, str | None]:
        """``(token, certificate PEM, key PEM, TLS name)``; None for the three without TLS."""
        if self.tls is None:
            return (self.token, None, None, None)
        return (self.token, self.tls.cert_pem, self.tls.key_pem, self.tls.hostname)

    @classmethod
    def of(cls, value: DataPlaneAccess | tuple) -> DataPlaneAccess:
        """``value`` itself, or the access a :meth:`plain` tuple describes (executor side)."""
        if isinstance(value, DataPlaneAccess):
            return value
        token, cert, key, name = value
        return cls(token, TlsMaterial(cert, key, name) if cert is not None else None)

    def transport(self):
        """A Flight transport reaching this data plane's workers (TLS verified when on)."""
        from distfusion.transport.flight import FlightWorkerTransport  # optional: pyarrow.flight

        if self.tls is None:
            return FlightWorkerTransport(token=self.token)
        return FlightWorkerTransport(
            token=self.token,
            tls_root_certs=self.tls.cert_pem,
            tls_override_hostname=self.tls.hostname,
        )

    def worker_options(self) -> dict:
        """``FlightWorker`` keyword arguments: the token, and TLS when on."""
        if self.tls is None:
            return {"token": self.token}
        return {
            "token": self.token,
            "tls_cert_chain": self.tls.cert_pem,
            "tls_private_key": self.tls.key_pem,
            "tls_override_hostname": self.tls.hostname,
        }

    def __repr__(self) -> str:  # never print the secrets
        return f"DataPlaneAccess(tls={self.tls is not None})"

_LOCAL_MASTER = re.compile(r"^local\[(\d+|\*)\]$")
_MISSING_MODULE = re.compile(r"No module named '(distfusion|datafusion|pyarrow)[^']*'")


def import_pyspark():
    """Import and return the ``pyspark`` package.

    Raises:
        ImportError: pyspark is not installed; says what to install.
    """
    try:  # optional dependency
        import pyspark
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        msg = (
            "the Spark runtime needs pyspark: pip install 'distfusion[spark]' "
            "(or pip install pyspark), or use LocalRuntime()"
        )
        raise ImportError(msg) from exc
    return pyspark


def is_connect_session(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote(...)``).

    Checked without importing pyspark's Connect client (its extras may be missing).
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def with_local_retries(master: str, task_max_failures: int) -> str:
    """``local[N]`` -> ``local[N,F]``: Spark's local mode retries a task only when F > 1."""
    m = _LOCAL_MASTER.match(master.replace(" ", ""))
    if m is None or task_max_failures <= 1:
        return master
    return f"local[{m.group(1)},{task_max_failures}]"


_DATAFRAMES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
"""Spark DataFrames read as tables, by id (driver side; weak: the context holds them)."""


def hold_dataframe(df) -> str:
    """An id for Spark DataFrame ``df``, under which the Spark runtime finds it to read it.

    Only a weak reference is kept here: whoever registered ``df`` as a table
    (a :class:`~distfusion.context.DistributedContext`) keeps it alive.
    """
    dataframe_id = uuid.uuid4().hex
    _DATAFRAMES[dataframe_id] = df
    return dataframe_id


def held_dataframe(dataframe_id: str, table: str):
    """The DataFrame :func:`hold_dataframe` gave ``dataframe_id``.

    Raises:
        PlanningError: it is gone (its context was closed or collected).
    """
    df = _DATAFRAMES.get(dataframe_id)
    if df is None:
        msg = (
            f"table {table!r}: its Spark DataFrame is no longer held (the context that "
            "registered it is gone); plan the query again"
        )
        raise PlanningError(msg)
    return df


def spark_scan(stage: Stage) -> SourceScan | None:
    """The Spark DataFrame ``stage`` reads, if any (the planner allows one per stage)."""
    return next((scan for scan in stage.scans if scan.source.is_spark), None)


def _spark_input(sc, stage: Stage, scan: SourceScan):
    """The DataFrame of ``scan`` as an RDD of Arrow batches, at most ``stage.num_tasks`` partitions.

    Only the columns the query reads (the scan's ``columns``) are selected;
    then ``DataFrame.coalesce(n)`` (no shuffle; fewer partitions stay as they are)
    then Spark's own Arrow conversion in each partition
    (``Dataset.toArrowBatchRdd``, batches of
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, time stamps in
    ``spark.sql.session.timeZone``). An adaptive plan runs its shuffles now.

    Returns:
        ``(rdd, partitions, read_schema)``: each record of ``rdd`` one Arrow
        IPC record batch message; ``read_schema`` the Arrow schema Spark wrote
        them with.

    Raises:
        PlanningError: the DataFrame is gone, or Spark cannot convert it to Arrow.
    """
    from pyspark.rdd import RDD  # optional dependency
    from pyspark.serializers import NoOpSerializer  # optional dependency

    table = scan.source.name
    df = held_dataframe(scan.source.options["dataframe_id"], table)
    if df.sparkSession.sparkContext is not sc:
        msg = f"table {table!r}: its Spark DataFrame belongs to another SparkSession"
        raise PlanningError(msg)
    cols = scan.source.options.get("columns")
    if cols is not None:  # only what the query reads: Spark prunes the rest at its source
        from pyspark.sql import functions as F  # optional dependency

        names = df.columns
        df = df.select(*[F.col("`" + names[i].replace("`", "``") + "`") for i in cols])
    conf = df.sparkSession.conf
    time_zone = conf.get("spark.sql.session.timeZone")
    max_records = int(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000"))
    try:
        read_schema = spark_arrow_schema(df.schema, time_zone)
        jrdd = df.coalesce(stage.num_tasks)._jdf.toArrowBatchRdd(
            max_records, time_zone, False, False
        )
    except Exception as exc:
        msg = f"table {table!r}: Spark cannot read it as Arrow batches: {_first_line(exc)}"
        raise PlanningError(msg) from exc
    rdd = RDD(jrdd.toJavaRDD(), sc, NoOpSerializer())
    return rdd, rdd.getNumPartitions(), read_schema


def spark_arrow_schema(struct, time_zone: str) -> pa.Schema:
    """Spark schema ``struct`` as Arrow types, as Spark's Arrow conversion writes them.

    PySpark's ``to_arrow_schema``: ``TimestampType`` -> ``timestamp[us, tz=time_zone]``,
    ``TimestampNTZType`` -> ``timestamp[us]``, ``StringType`` -> ``string``
    (not large), decimals, dates, nested types as Arrow's.

    Raises:
        Exception: a type Arrow cannot express (PySpark's error).
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # optional dependency

    return to_arrow_schema(struct, timezone=time_zone, prefers_large_types=False)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else repr(exc))[:limit]


def _spark_batches(records, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow IPC record batch messages (``toArrowBatchRdd``'s records) as batches of ``schema``."""
    for payload in records:
        yield pa.ipc.read_record_batch(pa.py_buffer(payload), schema)


def _drain(records) -> None:
    """Read what is left of a task's input: PySpark reuses a Python worker only then."""
    for _ in records:
        pass


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
        PlanningError: a cluster master has no executor after ``executor_wait_s``.
    """

    name = "spark"
    reads_spark_dataframes = True
    """Leaf stages may read Spark DataFrames (:func:`~distfusion.sources.spark_source`)."""
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
    session>)`` makes one): :class:`~distfusion.runtime.spark_connect.SparkConnectRuntime`,
    set when that module is imported (the runtime registry imports it)."""

    def __new__(cls, spark=None, *args, **kwargs):
        """A :attr:`connect_runtime` for a Spark Connect session, else a SparkRuntime."""
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
                    **(conf or {}),
                }
                builder = SparkSession.builder.master(
                    with_local_retries(master, task_max_failures)
                ).appName("distfusion")
                for key, value in settings.items():
                    builder = builder.config(key, value)
                with _gateway_ends_with_this_process():
                    spark = builder.getOrCreate()
                spark.sparkContext.setLogLevel("ERROR")
                self._owns_session = True
        self.spark = spark
        self.sc = spark.sparkContext
        self._use_driver_python()
        self._checked_python: str | None = None  # the executors' Python found to import distfusion
        self._python_lock = threading.Lock()
        self.resolver = SparkWorkerResolver(self.sc)
        self.target_partitions = target_partitions or default_target_partitions()
        self.compression = compression
        self._held: dict[str, int] = {}  # query id -> bytes of stage outputs on the driver
        conf = self.sc.getConf()
        self.task_max_failures = int(conf.get("spark.task.maxFailures", str(task_max_failures)))
        if data_plane == "flight" and conf.get("spark.python.worker.reuse", "true") == "false":
            # Each task's Python worker exits after it, and the outputs it holds with it.
            log.warning("spark.python.worker.reuse is false: outputs go through Spark's shuffle")
            data_plane = "shuffle"
        self.encryption = encryption_settings({**dict(conf.getAll()), **given_conf})
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
        self._live_runs: dict[str, _SparkFlightQuery] = {}  # query id -> run, until it is closed
        self._endpoint_lock = threading.Lock()
        self._memory_per_task_bytes: int | None = None
        self.held_results: dict[str, QueryRun] = {}  # query id -> run of a result Spark reads
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
            and self.sc._jsc is not None
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

    @property
    def broadcast_copies(self) -> int:
        """Copies of a broadcast Spark makes at most: one per task slot's Python worker.

        Executors fetch a ``Broadcast`` once and each reused Python worker loads
        it once, however many tasks of the stage read it.
        """
        return len(self.resolver.get_urls()) or 1

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
        """Start query ``query_id`` stage by stage (see :class:`~distfusion.runtime.base.QueryRun`).

        Raises:
            TransportError: the executors' Python cannot import distfusion,
                datafusion or pyarrow (:meth:`check_executor_python`).
        """
        self.check_executor_python()
        if self.data_plane == "flight":
            return _SparkFlightQuery(self, query_id)
        return _SparkQuery(self, query_id)

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
            if not (local and _same_interpreter(python, sys.executable)):
                probe = self.sc.parallelize([0], 1).mapPartitions(_import_probe())
                try:
                    failure = probe.collect()
                except Exception as exc:  # e.g. a Python PySpark refuses (another version)
                    raise _translate_error(exc, self.sc.master) from None
                if failure:
                    raise TransportError(_missing_module_message(python, failure[0]))
            self._checked_python = python

    def executor_worker_args(self) -> tuple[str, str | None, tuple, int, str]:
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
        job still runs; the query's run fails at once (:meth:`_SparkFlightQuery.panicked`).
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

    driver_stage_bytes = 16 * 1024 * 1024
    """On the Flight data plane, a one-task stage that reads no table and at most
    this many bytes of inputs runs on the driver's own Flight worker
    (:meth:`driver_worker`) instead of as a Spark job: a job with one Python
    task costs ~60-130 ms here, the stage itself (a final aggregate or join
    over a few KiB, say) milliseconds. 0 turns it off."""

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

    def close(self) -> None:
        """Release every held result, stop the SparkSession when this runtime started it."""
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
            self.spark.stop()
            self._owns_session = False

    def __repr__(self) -> str:
        return f"SparkRuntime(master={self.sc.master!r}, workers={len(self.resolver.get_urls())})"


def job_group(query_id: str) -> str:
    """The Spark job group of query ``query_id`` (every Spark job of the query runs in it)."""
    return f"distfusion-{query_id}"


class _CallSite:
    """Names the Spark jobs started inside the block: job group, description, call site.

    Spark shows a job's description (``setJobGroup``) in its UI and event log,
    and names a job's stages after the call site (``callSite.short``). PySpark
    sets the call site to the Python line of every action it runs (its
    ``SCCallSiteSync``) unless an outer block set it already: this block counts
    as that outer block, so the stages are named ``description`` too.
    """

    def __init__(self, sc, group: str, description: str) -> None:
        self.sc = sc
        self.group = group
        self.description = description

    def __enter__(self):
        from pyspark.traceback_utils import SCCallSiteSync  # optional dependency

        self.sc.setJobGroup(self.group, self.description, True)
        self.sc.setLocalProperty("callSite.long", self.description)
        if SCCallSiteSync._spark_stack_depth == 0:
            self.sc._jsc.setCallSite(self.description)
        SCCallSiteSync._spark_stack_depth += 1
        return self

    def __exit__(self, *exc) -> None:
        from pyspark.traceback_utils import SCCallSiteSync  # optional dependency

        SCCallSiteSync._spark_stack_depth -= 1
        if SCCallSiteSync._spark_stack_depth == 0:
            self.sc._jsc.setCallSite(None)
        self.sc.setLocalProperty("callSite.long", None)


def _spark_progress(sc, group: str) -> tuple[int, int]:
    """``(tasks done, tasks)`` of every Spark job of ``group`` (Spark's status tracker)."""
    tracker = sc.statusTracker()
    done = total = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        if info is None:
            continue
        for stage_id in info.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
    return done, total


class _SparkQuery:
    """One query on Spark, stage by stage, on the driver: a :class:`~distfusion.runtime.base.QueryRun`.

    A stage that ran keeps its output where Spark put it for every later graph
    of the query: its shuffle files (the map stage of its ``partitionBy``,
    run by ``SparkContext.submitMapStage`` as Spark's AQE runs query stages),
    or its records on the driver and their ``Broadcast``. Consumers planned
    later read those again: a shuffle output as a broadcast (collected from
    the shuffle files, nothing recomputed), or with partitions coalesced
    (``RDD.coalesce`` over the shuffled RDD; Spark picks which partitions a
    task reads, the count follows the plan).
    """

    def __init__(self, runtime: SparkRuntime, query_id: str) -> None:
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
        self.shuffled: dict[int, object] = {}  # stage id -> output partitionBy'd: (p, (sid, task, ipc))
        self.values: dict[int, list[tuple[int, int, bytes]]] = {}  # stage id -> output on the driver
        self.broadcasts: dict[int, object] = {}  # stage id -> Broadcast of [(task, ipc)], all partitions
        self.rdds: dict[int, object] = {}  # stage id -> output records (p, (task, ipc)); this graph
        self.on_driver: set[int] = set()  # stages run here rather than on Spark
        self.persisted: list = []
        self.uses: dict[int, int] = {}
        self.acc = self.sc.accumulator({}, _merge_param())  # (stage, task, partition) -> (rows, bytes)
        self.metrics_acc = self.sc.accumulator({}, _merge_param())  # (stage, task) -> metrics dict
        self.observer = observer_for(query_id)
        self.observer.add_refresher(lambda: _spark_progress(self.sc, self.group))
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
            futures = [self.sc._jsc.sc().submitMapStage(dep) for dep in dependencies]
        for future in futures:
            self._spark_call(future.get)
        self.ran.update(stage_ids)
        self._report_metrics()
        elapsed = time.perf_counter() - start
        return {s.stage_id: self._stage_stats(s, elapsed) for s in stages}

    def stream_head(self, graph: StageGraph) -> Iterator[pa.RecordBatch]:
        """See :meth:`QueryRun.stream_head`: one Spark job per broadcast round and one for the head's inputs."""
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
        budget = graph.memory_per_task_bytes or self.runtime.memory_per_task_bytes
        self._report_metrics()
        yield from stream_head_stage(
            plan,
            lambda i: _decode(inputs[i]),
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
        if self.runtime._feed_endpoint is not None:
            self.runtime._feed_endpoint.forget(self.query_id)
        if not self.finished:
            self.sc.cancelJobGroup(self.group)
        for b in self.broadcasts.values():
            b.destroy()
        for rdd in self.persisted:
            rdd.unpersist()
        self.runtime._held.pop(self.query_id, None)
        self.sc.setLocalProperty("spark.jobGroup.id", None)

    # ------------------------------------------------------------------ driver
    def _use(self, graph: StageGraph) -> None:
        """Plan Spark work for ``graph``: outputs of stages that did not run are forgotten."""
        if graph is self.graph:
            return
        self.graph = graph
        self.uses = _uses(graph)
        for cache in (self.rdds, self.shuffled, self.values, self.broadcasts):
            for sid in [sid for sid in cache if sid not in self.ran]:
                del cache[sid]

    def _named(self, stage_ids: list[int]) -> _CallSite:
        """The Spark jobs started in the block run stages ``stage_ids`` (their description)."""
        return _CallSite(self.sc, self.group, self.observer.description(stage_ids))

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
        held = self.runtime._held
        held[self.query_id] = held.get(self.query_id, 0) + nbytes

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
        """Run a Spark action (:func:`_spark_call`)."""
        return _spark_call(action, self._check_open, self.sc.master)

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
            n = self.graph.stage(stage_id).output.num_partitions
            self.shuffled[stage_id] = (
                self._records(stage_id)
                .map(lambda r, sid=stage_id: (r[0], (sid,) + r[1]))
                .partitionBy(n, self.identity)
            )
        return self.shuffled[stage_id]

    @staticmethod
    def _shuffle_dependency(shuffled):
        """The JVM ``ShuffleDependency`` of a PySpark ``partitionBy`` result (for ``submitMapStage``).

        PySpark's ``partitionBy`` returns ``valueOfPair(ShuffledRDD)``: a
        one-to-one child of the ``ShuffledRDD``, whose one dependency is the shuffle.
        """
        return shuffled._jrdd.rdd().dependencies().head().rdd().dependencies().head()

    def _stage_rdd(self, stage_id: int):
        """The RDD of ``stage_id``'s output records, built once per graph (it has not run)."""
        if stage_id in self.rdds:
            return self.rdds[stage_id]
        stage = self.graph.stage(stage_id)
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
            n = self.graph.stage(producers[0]).output.num_partitions
            if base.getNumPartitions() != n:  # not co-partitioned: would lose rows
                msg = f"stage {stage_id}: Spark did not co-partition its {len(parts)} inputs"
                raise PlanningError(msg)
            if stage.num_tasks < n:  # partitions coalesced by adaptive execution
                base = base.coalesce(stage.num_tasks)
        else:
            base = self.sc.parallelize(range(stage.num_tasks), stage.num_tasks)
        if has_feeds(stage):
            stage = self.feeds.serve(self.runtime.feed_endpoint(), stage)
        args = (
            self.query_id,
            pickle.dumps(stage),
            bool(read),
            broadcast,
            task_threads(
                self.runtime.target_partitions, stage.num_tasks, self.runtime.target_partitions
            ),
            self.runtime.compression,
            self.acc,
            self.metrics_acc,
            self.graph.memory_per_task_bytes or self.runtime.memory_per_task_bytes,
        )
        tasks = [(stage_id, t) for t in range(stage.num_tasks)]
        if scan is None:
            rdd = base.mapPartitionsWithIndex(_task_function(tasks, "_run_task", *args))
        else:
            # Over the DataFrame's partitions; tasks past them read an empty one.
            arrow, parts, read_schema = _spark_input(self.sc, stage, scan)
            table = scan.source.name
            spark = (table, read_schema, 0, False)
            rdd = arrow.mapPartitionsWithIndex(_task_function(tasks, "_run_task", *args, spark))
            if parts < stage.num_tasks:
                rest = stage.num_tasks - parts
                fn = _task_function(tasks[parts:], "_run_task", *args, (table, None, parts, True))
                pad = self.sc.parallelize(range(rest), rest).mapPartitionsWithIndex(fn)
                rdd = self.sc.union([rdd, pad])
        rdd.setName(f"distfusion {self.query_id[:8]} stage {stage_id}")
        if self.uses.get(stage_id, 0) > 1:
            rdd.persist()
            self.persisted.append(rdd)
        self.rdds[stage_id] = rdd
        return rdd

    def _prepare_broadcasts(self, stages: list[Stage], outputs: bool) -> None:
        """Create the broadcasts ``stages`` read (and, with ``outputs``, their own broadcast outputs).

        One Spark job per round: a round collects every broadcast whose producer
        needs no broadcast of a later round (:func:`_rounds`), as a union tagged
        with the producer's stage id, so independent broadcasts run side by side.
        A one-task producer that has not run runs on the driver instead
        (:meth:`_run_on_driver`); the same job collects its inputs that Spark produces.
        """
        graph = self.graph
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
            _dummy_workers(stage, self.graph),
            self.runtime.target_partitions,
        )
        inputs = [self._input_values(i) for i in stage.inputs]
        worker = f"spark-driver://{socket.gethostname()}"
        budget = self.graph.memory_per_task_bytes or self.runtime.memory_per_task_bytes
        with tempfile.TemporaryDirectory(prefix="distfusion-spill-") as spill_dir:
            parts = run_task(
                plan,
                lambda i: _decode(inputs[i]),
                worker=worker,
                feed_chunks=self.feeds.local_chunks(stage),
                memory=TaskMemory(budget, spill_dir),
                on_metrics=self.observer.task_finished,
            )
        self.acc.add(_partition_stats(stage.stage_id, 0, parts))
        self.values[stage.stage_id] = [
            (p, 0, ipc) for p, (_, ipc) in _output_records(0, parts, self.runtime.compression)
        ]
        self.on_driver.add(stage.stage_id)
        self._hold(sum(len(v[2]) for v in self.values[stage.stage_id]))


class _SparkFlightQuery(WorkerQueryRun):
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

    def __init__(self, runtime: SparkRuntime, query_id: str) -> None:
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
        runtime._live_runs[query_id] = self
        # Executors cannot be pushed to: tasks pull their feed partitions from the
        # driver's endpoint; a retried attempt replays its partition.
        self.feeds = QueryFeeds(query_id, on_error=lambda err: self.close(), replayable=True)
        self._task_stats: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._stages: dict[int, Stage] = {}  # stage id -> stage, for running lost tasks again
        self._rounds: list[list[int]] = []  # stage ids by round, in the order they ran
        self._used: set[str] = set()  # every worker URL a task of this query ran on
        self._recoveries = 0  # times lost outputs were computed again (at most task_max_failures)
        self._spark_inputs: dict[int, tuple] = {}  # stage id -> _spark_input(...)
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
        return _spark_progress(self.sc, self.group)

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
        self.runtime._live_runs.pop(self.query_id, None)
        self.runtime.held_results.pop(self.query_id, None)
        if self.runtime._feed_endpoint is not None:
            self.runtime._feed_endpoint.forget(self.query_id)
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
        worker instead, before its round's Spark job.
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
            small = [s for s in ready if self._small(s)]
            for stage in small:
                self._run_on_driver(stage)
            rest = [s for s in ready if s not in small]
            self._run_tasks([(s.stage_id, t) for s in rest for t in range(s.num_tasks)])
            for stage in ready:
                self._delivered[stage.stage_id] = stage.num_tasks
            pending = [s for s in pending if s not in ready]

    def _small(self, stage: Stage) -> bool:
        """One task, no table read, and inputs of at most ``driver_stage_bytes`` in all."""
        limit = self.runtime.driver_stage_bytes
        if stage.num_tasks != 1 or stage.scans or not limit:
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

        Tasks of a stage reading a Spark table run over the DataFrame's
        partitions (:func:`_spark_input`), the others over their plans
        (``parallelize``); all in one job (a union), except a stage reading a
        Spark table with only some of its tasks to run (a retry), which runs
        those partitions only, in a job of its own (``SparkContext.runJob``).
        """
        self._check_open()
        slots = self.runtime.num_workers()
        plain: list[tuple[int, int]] = []
        plain_plans = []
        spark_plans: dict[int, dict[int, tuple[int, str]]] = {}
        description = self.observer.description(list(dict.fromkeys(sid for sid, _ in tasks)))
        stage_ids = ", ".join(str(sid) for sid in dict.fromkeys(sid for sid, _ in tasks))
        with _CallSite(self.sc, self.group, description):  # an adaptive DataFrame runs here
            for sid, t in tasks:
                stage = self._stages[sid]
                threads = task_threads(self.target_partitions, stage.num_tasks, slots)
                plan = TaskPlan.for_task(
                    self.query_id,
                    stage,
                    t,
                    self._input_workers(stage),
                    threads,
                    keep_output=True,
                    memory_per_task_bytes=self._memory,
                )
                record = (attempts[(sid, t)], plan.to_json())
                scan = spark_scan(stage)
                if scan is not None and t < self._spark_input(stage, scan)[1]:
                    spark_plans.setdefault(sid, {})[t] = record
                    continue
                plain.append((sid, t))
                plain_plans.append(record if scan is None else (*record, scan.source.name))
            whole, partial = [], []
            if plain:
                fn = _task_function(plain, "_run_flight_task", *self.runtime.executor_worker_args())
                rdd = self.sc.parallelize(plain_plans, len(plain_plans)).mapPartitionsWithIndex(fn)
                whole.append(rdd)
            for sid, plans in spark_plans.items():
                stage = self._stages[sid]
                scan = spark_scan(stage)
                arrow, parts, read_schema = self._spark_input(stage, scan)
                fn = _task_function(
                    [(sid, t) for t in range(parts)],
                    "_run_flight_spark_task",
                    plans,
                    scan.source.name,
                    read_schema,
                    *self.runtime.executor_worker_args(),
                )
                rdd = arrow.mapPartitionsWithIndex(fn)
                if len(plans) == parts:
                    whole.append(rdd)
                else:
                    partial.append((rdd, sorted(plans)))
            self._running = True
            results = []
            try:
                if whole:
                    rdd = whole[0] if len(whole) == 1 else self.sc.union(whole)
                    rdd.setName(f"distfusion {self.query_id[:8]} stages {stage_ids}")
                    results += _spark_call(rdd.collect, self._check_open, self.sc.master)
                for rdd, partitions in partial:
                    results += _spark_call(
                        lambda rdd=rdd, partitions=partitions: self.sc.runJob(
                            rdd, lambda it: it, partitions
                        ),
                        self._check_open,
                        self.sc.master,
                    )
            finally:
                self._running = False
        return self._task_results(results)

    def _task_results(self, results: list) -> list[tuple[tuple[int, int], TaskError]]:
        """Record where each task of a round ran and what it made; return the failed ones.

        ``results``: the tasks' records ``(stage, task, worker URL, metrics, error)``
        (:func:`_flight_task`).
        """
        failed = []
        for sid, t, url, metrics, report in results:
            self._used.add(url)
            self.runtime.executor_urls.add(url)
            if report is not None:
                failed.append(((sid, t), error_from_dict(json.loads(report))))
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
        budget = graph.memory_per_task_bytes or self.runtime.memory_per_task_bytes
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
                err = error_from_dict(json.loads(report))
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

        Returns each part's record ``(part index, fn's result, error)`` (:func:`_run_head_part`).
        """
        sid = graph.head.stage_id
        access, budget, threads = self.part_args(graph, parts)
        job = _task_function(
            [(sid, p.index) for _, p in pending], "_run_head_part", access, budget, threads, fn
        )
        rdd = self.sc.parallelize(pending, len(pending)).mapPartitionsWithIndex(job)
        rdd.setName(f"distfusion {self.query_id[:8]} head stage {sid} parts")
        self._running = True
        try:
            with _CallSite(self.sc, self.group, self.observer.description([sid])):
                return _spark_call(rdd.collect, self._check_open, self.sc.master)
        finally:
            self._running = False

    def write_head_parts(self, graph: StageGraph, spec: WriteSpec) -> list:
        """Every head part writes its rows as a task of ``spec``'s job, on the executors.

        :meth:`map_head_parts` with :func:`~distfusion.write.write_part`: Spark
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
                    n = max(1, self.runtime.num_workers())
                    # Job groups are per thread (PySpark pins threads): this one's only.
                    what = f"distfusion keep warm {self.query_id[:8]}"
                    self.sc.setJobGroup(f"{self.group}-warm", what, True)
                    self.sc.parallelize(range(n), n).mapPartitions(lambda it: [0]).collect()
                except Exception:  # the session stopped: nothing to keep
                    return

        name = f"distfusion-warm-{self.query_id[:8]}"
        threading.Thread(target=warm, name=name, daemon=True).start()

    def _spark_input(self, stage: Stage, scan: SourceScan) -> tuple:
        """:func:`_spark_input` of ``stage``, made once per stage of the query."""
        if stage.stage_id not in self._spark_inputs:
            self._spark_inputs[stage.stage_id] = _spark_input(self.sc, stage, scan)
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


def _spark_call(action, check_open, master: str):
    """Run a Spark action; failures become distfusion errors.

    ``check_open`` runs before and after: it raises when the query was closed
    (from another thread), whose jobs then fail as cancelled.

    Raises:
        QueryCancelledError: the run was closed before or while the action ran.
        TaskError: a task failed on every attempt Spark made.
        TransportError: Spark failed the job for another reason.
    """
    check_open()
    try:
        result = action()
    except Exception as exc:
        check_open()
        err = _translate_error(exc, master)
        if _MISSING_MODULE.search(str(exc)):  # Spark's Java trace adds nothing to it
            raise err from None
        raise err from exc
    check_open()
    return result


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


def _partition_stats(stage_id: int, task_index: int, parts) -> dict:
    """``{(stage, task, partition): (rows, Arrow bytes)}`` of one task's output."""
    return {
        (stage_id, task_index, p): (
            sum(b.num_rows for b in batches),
            sum(b.nbytes for b in batches),
        )
        for p, batches in enumerate(parts)
    }


def _rounds(graph: StageGraph, needed: set[int], ran: set[int]) -> list[list[int]]:
    """The broadcast producers ``needed``, grouped by collection round, earliest first.

    ``depth(s)`` is how many rounds must finish before stage *s* can run: the
    largest, over its inputs, of the input's depth plus one for a broadcast
    input; a stage that ran has depth 0. A producer is collected in round
    ``depth(producer)``.
    """
    depth: dict[int, int] = {}
    for s in graph.stages:  # producers first
        depth[s.stage_id] = 0 if s.stage_id in ran else max(
            (depth[i.stage_id] + (1 if i.boundary == BROADCAST else 0) for i in s.inputs), default=0
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


def _group_inputs(stage: Stage, records) -> list[list[tuple[int, bytes]]]:
    """Records ``(p, (producer stage, task, ipc))`` -> per input of ``stage``, ``(task, ipc)`` by task.

    Broadcast inputs get nothing here (they come from their ``Broadcast``).
    """
    by_stage: dict[int, list[tuple[int, bytes]]] = {}
    for _, (sid, task, payload) in records:
        by_stage.setdefault(sid, []).append((task, payload))
    for values in by_stage.values():
        values.sort(key=lambda v: v[0])
    return [
        by_stage.get(inp.stage_id, []) if inp.boundary != BROADCAST else []
        for inp in stage.inputs
    ]


def _encode(batches: list[pa.RecordBatch], compression: str | None) -> pa.Buffer:
    """Batches as one Arrow IPC stream, buffers compressed with ``compression``.

    Returns an Arrow buffer, not ``bytes``: ``to_pybytes()`` was one more copy
    of every byte (~0.7 s/GiB here, docs/spark-data-path.md). A buffer has
    ``len``, pickles as its bytes (protocol 5, PySpark's) and comes back as a
    buffer over them, and ``pa.ipc.open_stream`` reads it without a copy.
    """
    return _ipc_stream([without_views(b) for b in batches], compression)


def _ipc_stream(batches: list[pa.RecordBatch], compression: str | None) -> pa.Buffer:
    """``batches`` (no view columns) written as one Arrow IPC stream.

    Uncompressed, the stream is measured first (``MockOutputStream`` writes
    nothing) and written once into a buffer of its exact size: a growing
    ``BufferOutputStream`` reallocates and copies as it doubles, and keeps up
    to twice the memory. Compressed, that would compress twice.
    """
    schema = batches[0].schema
    options = pa.ipc.IpcWriteOptions(compression=compression)
    if compression is None:
        mock = pa.MockOutputStream()
        with pa.ipc.new_stream(mock, schema, options=options) as writer:
            for b in batches:
                writer.write_batch(b)
        buf = pa.allocate_buffer(mock.size())
        sink = pa.FixedSizeBufferWriter(buf)
    else:
        sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)
    return buf if compression is None else sink.getvalue()


def _decode(values: list[tuple[int, bytes]]) -> list[pa.RecordBatch]:
    """Inverse of :func:`_encode` over the payloads of ``values`` (``(task, ipc)``)."""
    out: list[pa.RecordBatch] = []
    for _, payload in values:
        with pa.ipc.open_stream(payload) as reader:
            out.extend(reader)
    return out


CHUNK_BYTES = 4 * 2**20
"""Default ``chunk_bytes`` of :func:`_output_records` (Arrow buffer bytes per record).

The fastest record size through a Spark shuffle: larger records take longer,
smaller ones cost more encoding (docs/spark-data-path.md, "Record size";
``benchmarks/spark_data_path.py``).
"""


def _output_records(
    task_index: int,
    parts: list[list[pa.RecordBatch]],
    compression: str | None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[tuple[int, tuple[int, bytes]]]:
    """A task's output as records ``(consumer partition, (task_index, ipc bytes))``.

    Args:
        task_index: the producing task; consumers order payloads by it.
        parts: one list of RecordBatch per output partition (``run_task``'s result).
        compression: Arrow IPC buffer compression (None, ``"lz4"``, ``"zstd"``).
        chunk_bytes: most Arrow buffer bytes (``RecordBatch.nbytes``, before
            IPC compression) per record; IPC framing adds a schema message and
            a header per batch (~1 KiB). A batch larger than this is sliced by
            rows; a single row larger than this travels alone.

    Yields:
        For every non-empty partition ``p``, in order, one or more records
        ``(p, (task_index, ipc))``, each ``ipc`` a complete Arrow IPC stream
        (:func:`_encode`), in the order of the partition's rows. Spark's shuffle
        keeps the order of one map task's records for a reduce partition, and
        consumers sort payloads by task with a stable sort (:func:`_group_inputs`,
        ``_input_values``), so :func:`_decode` gives the rows back in order.
    """
    for p, batches in enumerate(parts):
        for chunk in _chunks(batches, chunk_bytes):
            yield p, (task_index, _ipc_stream(chunk, compression))


def _chunks(batches: list[pa.RecordBatch], chunk_bytes: int) -> Iterator[list[pa.RecordBatch]]:
    """``batches`` in consecutive groups of at most ``chunk_bytes`` (``nbytes``) each."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        for piece in _pieces(without_views(batch), chunk_bytes):
            nbytes = piece.nbytes
            if group and size + nbytes > chunk_bytes:
                yield group
                group, size = [], 0
            group.append(piece)
            size += nbytes
    if group:
        yield group


def _pieces(batch: pa.RecordBatch, chunk_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` sliced (zero-copy) by rows into pieces of at most ``chunk_bytes`` each."""
    if batch.nbytes <= chunk_bytes or batch.num_rows <= 1:
        yield batch
        return
    pieces = -(-batch.nbytes // chunk_bytes)
    rows = -(-batch.num_rows // pieces)
    for start in range(0, batch.num_rows, rows):
        yield from _pieces(batch.slice(start, rows), chunk_bytes)


# ---------------------------------------------------------------------- executor side
def _task_function(tasks, entry, *args):
    """The function Spark ships to the executors for one job.

    Args:
        tasks: ``(stage id, task index)`` of each RDD partition, by partition
            index, for the report of a task that cannot import distfusion.
        entry: the function of this module the task runs,
            ``entry(partition index, records, *args)``, or ``"module:function"``
            for one of another module of distfusion (imported on the executor).
        *args: the rest of ``entry``'s arguments (pickled with the closure).

    The driver's Python UDFs made by :func:`distfusion.udf` and its object
    stores (:mod:`distfusion.object_store`, explicit credentials included:
    Spark's closure is the channel) travel with the closure too and are
    registered on the executor before the task runs.

    It is a closure, so cloudpickle ships it by value, and it refers to nothing
    of distfusion until it runs: an executor that cannot import distfusion or
    datafusion then fails with a message saying so, naming the stage and task,
    instead of failing to unpickle the task. The report of that failure is
    encoded here, on the driver (``report``, the error codec's dict), so the
    executor needs only the standard library to fill in the task.
    """
    report = error_to_dict(TaskError(-1, -1, "", ""))
    missing_section = EXECUTORS_SECTION
    shipped = udfs.specs()  # the driver's Python UDFs, pickled with this closure
    stores = object_store.specs()  # and its object stores (credentials: Spark's channel)

    def run(index, records):
        try:
            # On purpose inside the task: see the docstring.
            import distfusion.runtime.spark as spark_runtime
        except ImportError as exc:
            import json as _json  # standard library only: distfusion is missing here
            import os as _os
            import socket as _socket

            cause = (
                f"ImportError: {exc} -- the Spark executors need distfusion and datafusion "
                "in their Python environment (same venv via PYSPARK_PYTHON, "
                "spark.archives with a packed venv, or --py-files; see docs/spark.md, "
                f'section "{missing_section}")'
            )
            stage_id, task_index = tasks[index]
            worker = f"spark-executor://{_socket.gethostname()}/pid{_os.getpid()}"
            failed = {**report, "stage_id": stage_id, "task_index": task_index}
            failed.update(worker=worker, cause=cause)
            failed["message"] = f"stage {stage_id} task {task_index} failed: {cause}"
            raise RuntimeError(ERROR_MARKER + _json.dumps(failed)) from None
        if shipped:
            spark_runtime.udfs.install(shipped)
        if stores:
            spark_runtime.object_store.install(stores)
        module, _, name = entry.rpartition(":")
        where = importlib.import_module(module) if module else spark_runtime
        out = getattr(where, name)(index, records, *args)
        spark_runtime.freeze_heap_once()
        return out

    return run


_heap_frozen = False


def freeze_heap_once() -> None:
    """Hide what this Python worker imported from the cyclic GC, once, after its first task.

    PySpark runs ``gc.collect()`` after every task of a reused Python worker. A
    full collection walks every tracked object, and what distfusion, datafusion,
    pyarrow and pyspark import is ~100,000 of them: a large share of a Python
    worker's time (docs/benchmarks.md, "Spark stage outputs"). After one
    collection, ``gc.freeze()`` moves them to the permanent generation; later
    collections walk only what later tasks create.
    """
    global _heap_frozen
    if not _heap_frozen:
        gc.collect()
        gc.freeze()
        _heap_frozen = True


def _run_task(
    task_index,
    records,
    query_id,
    stage_bytes,
    shuffled,
    broadcast,
    target_partitions,
    compression,
    stats=None,
    metrics=None,
    memory_per_task_bytes=None,
    spark=None,
):
    """Run task ``task_index`` of the pickled stage inside a Spark task.

    DataFusion runs within ``memory_per_task_bytes`` (None: unbounded),
    spilling to a temporary directory deleted when the task ends.

    ``spark``: for a stage reading a Spark DataFrame, ``(table, read schema,
    offset, empty)``: the task is ``offset + task_index`` and ``records`` are
    its partition's Arrow messages (:func:`_spark_input`), offered to the task
    as ``table``'s rows; ``empty``: the task has no partition (Spark made
    fewer), ``records`` are ignored.

    Yields records ``(consumer partition, (task_index, ipc bytes))``
    (:func:`_output_records`); adds each output partition's rows and Arrow
    bytes to the ``stats`` accumulator, and the task's metrics
    (``TaskMetrics.to_dict``) to the ``metrics`` accumulator under
    ``(stage, task)``: both reach the driver with the task's result.

    Raises:
        RuntimeError: the task failed; its message is ``DISTFUSION_TASK_ERROR``
            followed by a JSON report (stage, task, worker, cause, traceback).
    """
    stage: Stage = pickle.loads(stage_bytes)
    worker = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    table, batches = None, iter(())
    if spark is not None:
        table, read_schema, offset, empty = spark
        task_index += offset
        if not empty:
            batches = _spark_batches(records, read_schema)
    try:
        plan = TaskPlan.for_task(query_id, stage, task_index, (), target_partitions)
        _maybe_inject_failure(stage.stage_id, task_index)
        # Drain the input even when the stage reads none (a leaf reads its task
        # index): PySpark reuses a Python worker only after its task read the
        # whole input, and a fresh worker costs ~1 s of imports and zip scans.
        # A Spark table's partition is read by the task, then drained.
        records = list(records) if table is None else records
        inputs = _group_inputs(stage, records if shuffled else ())
        for i, bc in broadcast.items():
            inputs[i] = sorted(bc.value, key=lambda v: v[0])
        measured: list[TaskMetrics] = []
        with (
            tempfile.TemporaryDirectory(prefix="distfusion-spill-") as spill_dir,
            offering(plan.key, table, batches),
        ):
            parts = run_task(
                plan,
                lambda i: _decode(inputs[i]),
                worker=worker,
                feed_chunks=lambda share: pulled_feed_chunks(plan.key, share),
                memory=TaskMemory(memory_per_task_bytes, spill_dir),
                on_metrics=measured.append,
            )
        if table is not None:
            _drain(records)
        out = list(_output_records(task_index, parts, compression))
        if stats is not None:
            stats.add(_partition_stats(stage.stage_id, task_index, parts))
        if metrics is not None:
            metrics.add({(stage.stage_id, task_index): measured[0].to_dict()})
    except TaskError as err:
        raise RuntimeError(ERROR_MARKER + _report(err)) from None
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        err = task_error(stage.stage_id, task_index, worker, exc)
        raise RuntimeError(ERROR_MARKER + _report(err)) from None
    return iter(out)


_EXECUTOR_WORKERS: dict[str, object] = {}
"""This Python worker process's Flight worker, by the runtime's token (executor side)."""


def _executor_worker(
    bind_host: str,
    advertise_host: str | None,
    access: DataPlaneAccess | tuple,
    memory_per_task_bytes: int | None,
):
    """The FlightWorker of this process for the runtime of ``access``; started on first use.

    It serves ``grpc+tls://`` with the runtime's certificate when the data
    plane is encrypted.
    """
    from distfusion.worker.flight_server import FlightWorker  # optional: pyarrow.flight

    access = DataPlaneAccess.of(access)
    worker = _EXECUTOR_WORKERS.get(access.token)
    if worker is None:
        if advertise_host is None and bind_host == "0.0.0.0":
            advertise_host = socket.gethostbyname(socket.gethostname())
        worker = FlightWorker(
            host=bind_host,
            **access.worker_options(),
            slots=1,
            query_ttl_s=EXECUTOR_QUERY_TTL_S,
            advertise_host=advertise_host,
            memory_per_task_bytes=memory_per_task_bytes,
        )
        _EXECUTOR_WORKERS[access.token] = worker
    return worker


def _run_flight_task(
    index, records, bind_host, advertise_host, access, memory_per_task_bytes, driver_url
):
    """Run the task plan of this Spark partition on this process's Flight worker.

    The record is ``(attempt, task plan JSON)``, or ``(attempt, plan, table)``
    for a task of a stage reading Spark table ``table`` that has no partition
    of it (Spark made fewer partitions than the stage has tasks): the task
    reads an empty one. Returns one record
    ``(stage id, task index, worker URL, metrics, error)``: the output stays
    on the worker; the task's metrics travel (``TaskMetrics.to_dict``: rows
    and Arrow bytes per output partition among them), or, when the task
    failed, ``error`` (the error codec's JSON, with ``"attempts"``) instead.
    Never raises for a failed task: PySpark would end this process and every
    output it holds.
    """
    record = list(records)[0]  # drained: PySpark reuses this process
    attempt, payload = record[:2]
    table = record[2] if len(record) > 2 else None
    plan = TaskPlan.from_json(payload)
    result = _flight_task(
        plan,
        attempt,
        table,
        iter(()),
        (bind_host, advertise_host, access, memory_per_task_bytes, driver_url),
    )
    return iter([result])


def _run_flight_spark_task(index, records, plans, table, read_schema, *worker_args):
    """Run the task of Spark table ``table``'s partition ``index`` on this process's Flight worker.

    ``records`` are the partition's Arrow messages (:func:`_spark_input`);
    ``plans`` maps partition index to ``(attempt, task plan JSON)``. The
    partition's batches are offered to the task, which reads them as it runs;
    what it left is drained. Returns what :func:`_run_flight_task` does (no
    record for a partition without a plan).
    """
    if index not in plans:
        _drain(records)
        return iter(())
    attempt, payload = plans[index]
    plan = TaskPlan.from_json(payload)
    try:
        result = _flight_task(
            plan, attempt, table, _spark_batches(records, read_schema), worker_args
        )
    finally:
        _drain(records)
    return iter([result])


def _flight_task(plan, attempt, table, batches, worker_args):
    """Run ``plan`` on this process's Flight worker; ``(stage, task, url, metrics, error)``.

    ``table``: the Spark table whose partition (``batches``) the task reads, or
    None; ``worker_args``: :meth:`SparkRuntime.executor_worker_args`. A worker
    started here says so to the driver's worker first (when there is one: not
    on Spark Connect); when the driver answers that the query was closed
    meanwhile, the task fails as cancelled.
    """
    key = plan.key
    url = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    bind_host, advertise_host, access, memory, driver_url = worker_args
    access = DataPlaneAccess.of(access)
    try:
        new = access.token not in _EXECUTOR_WORKERS
        worker = _executor_worker(bind_host, advertise_host, access, memory)
        url = worker.url
        if (
            new
            and driver_url is not None
            and _executor_transport(access).worker_started(
                driver_url, url, key.query_id, WORKER_STARTED_TIMEOUT_S
            )
        ):
            msg = f"query {key.query_id} was closed before its task started"
            raise QueryCancelledError(msg)
        _maybe_inject_failure(key.stage_id, key.task_index, attempt)
        with offering(key, table, batches):
            metrics = worker.run_task(plan)
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        err = exc
        if not isinstance(exc, TaskError):
            err = task_error(key.stage_id, key.task_index, url, exc)
        if isinstance(err, TaskPanicked) and driver_url is not None:  # fail the query now
            _executor_transport(access).task_failed(
                driver_url, key.query_id, error_to_dict(err), WORKER_STARTED_TIMEOUT_S
            )
        report = json.dumps({**error_to_dict(err), "attempts": attempt + 1})
        return (key.stage_id, key.task_index, url, None, report)
    return (key.stage_id, key.task_index, url, metrics.to_dict(), None)


WORKER_STARTED_TIMEOUT_S = 5.0
"""How long a new executor worker waits for the driver's answer to ``worker_started``
(seconds); past it the task runs, and the driver learns the worker from its result."""

_EXECUTOR_TRANSPORTS: dict[str, object] = {}
"""This process's Flight transport to the runtime's workers, by token (head parts read with it)."""


def _executor_transport(access: DataPlaneAccess | tuple):
    access = DataPlaneAccess.of(access)
    transport = _EXECUTOR_TRANSPORTS.get(access.token)
    if transport is None:
        transport = _EXECUTOR_TRANSPORTS[access.token] = access.transport()
    return transport


def part_batches(
    part: HeadPart,
    access: DataPlaneAccess | tuple,
    budget: int | None,
    threads: int,
    attempt: int | None = None,
    on_metrics=None,
) -> Iterator[pa.RecordBatch]:
    """Run head ``part`` in this process (an executor), reading its inputs over Flight.

    Columns are the stage output's (``c0..``); ``on_metrics`` is called with
    the part's :class:`TaskMetrics` after its last batch. After the first batch was
    taken, :data:`FAIL_TASK_PROPERTY` naming the head stage and the part
    fails it (tests: a task killed mid-write). Spills go to a temporary
    directory deleted when the part ends.

    Raises:
        TaskError: an input could not be read (its producer failed, or the
            query's outputs were released) or the fragment failed.
    """
    transport = _executor_transport(access)
    with tempfile.TemporaryDirectory(prefix="distfusion-part-") as spill:
        first = True
        memory = TaskMemory(budget, spill)
        batches = run_part(
            part, transport, memory, target_partitions=threads, on_metrics=on_metrics
        )
        for b in batches:
            yield b
            if first:
                first = False
                _maybe_inject_failure(part.plan.key.stage_id, part.index, attempt)


def _run_head_part(index, records, access, budget, threads, fn):
    """Spark task of :meth:`_SparkFlightQuery.map_head_parts`: ``fn`` over one head part.

    The record is ``(attempt, part)``. Returns one record ``(part index,
    fn's result, error)``: ``error`` is the error codec's JSON (with
    ``"attempts"``) when it failed. Never raises (see :func:`_run_flight_task`).
    """
    attempt, part = list(records)[0]
    url = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    try:
        value = fn(part.index, attempt, part_batches(part, access, budget, threads, attempt))
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        err = exc
        if not isinstance(exc, TaskError):
            err = task_error(part.plan.key.stage_id, part.index, url, exc)
        report = json.dumps({**error_to_dict(err), "attempts": attempt + 1})
        return iter([(part.index, None, report)])
    return iter([(part.index, value, None)])


def frame_function(
    parts: list[HeadPart], access: tuple, budget: int | None, threads: int, schema
):
    """The ``mapInArrow`` function of a result read by Spark (``SparkDataFrame.to_spark``).

    Its input is ``spark.range(n, numPartitions=n)``: Spark partition *i*
    holds the one id *i*, and yields head part *i*'s batches, with
    ``schema``'s names and types. Like :func:`_task_function`, it refers to
    nothing of distfusion until it runs, and carries the driver's Python UDFs.
    """
    shipped = udfs.specs()
    stores = object_store.specs()

    def run(batches):
        import distfusion.runtime.spark as spark_runtime  # on the executor

        if shipped:
            spark_runtime.udfs.install(shipped)
        if stores:
            spark_runtime.object_store.install(stores)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                try:
                    for b in spark_runtime.part_batches(parts[i], access, budget, threads):
                        yield spark_runtime.as_schema(b, schema)
                except spark_runtime.QueryCancelledError as exc:
                    msg = (
                        f"{exc}: the distfusion result this Spark DataFrame reads was released "
                        "(its DataFrame returned by to_spark() was garbage collected, "
                        "release() was called, or the session closed); keep a reference "
                        "to it until its last action"
                    )
                    raise spark_runtime.QueryCancelledError(msg) from exc

    return run


def as_schema(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s names, its columns cast where types differ."""
    columns = [
        c if c.type == f.type else c.cast(f.type)
        for c, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _maybe_inject_failure(stage_id: int, task_index: int, attempt: int | None = None) -> None:
    """Raise when :data:`FAIL_TASK_PROPERTY` names this task and attempt (tests only).

    ``attempt``: counted by the runtime (Flight data plane); None: Spark's.
    """
    from pyspark import TaskContext  # optional dependency

    ctx = TaskContext.get()
    spec = ctx.getLocalProperty(FAIL_TASK_PROPERTY) if ctx is not None else None
    if not spec and ctx is not None:  # Spark Connect: a job tag "FAIL_TASK_PROPERTY=spec"
        marker = f"{FAIL_TASK_PROPERTY}="
        tags = (ctx.getLocalProperty("spark.job.tags") or "").split(",")
        spec = next((t.split(marker, 1)[1] for t in tags if marker in t), None)
    if not spec:
        return
    s, t, attempts = spec.split(":")
    if int(s) != stage_id or int(t) != task_index:
        return
    attempt = ctx.attemptNumber() if attempt is None else attempt
    if attempts == "always" or attempt < int(attempts):
        msg = f"injected failure ({FAIL_TASK_PROPERTY}={spec}, attempt {attempt})"
        raise RuntimeError(msg)


def _report(err: TaskError) -> str:
    """``err`` as the JSON report of :data:`ERROR_MARKER`, with Spark's attempt count.

    The protocol's error codec (:func:`~distfusion.protocol.errors.error_to_dict`)
    plus ``"attempts"``.
    """
    from pyspark import TaskContext  # optional dependency

    ctx = TaskContext.get()
    attempts = ctx.attemptNumber() + 1 if ctx is not None else 1
    return json.dumps({**error_to_dict(err), "attempts": attempts})


def _import_probe():
    """The function of :meth:`SparkRuntime.check_executor_python`'s job: ``[]`` or the error.

    A closure (cloudpickle ships it by value) using the standard library
    only, so that an executor without distfusion unpickles and runs it.
    """

    def probe(_records):
        try:
            import datafusion  # noqa: F401
            import pyarrow  # noqa: F401

            import distfusion.runtime.spark  # noqa: F401
        except ImportError as exc:
            return [f"{type(exc).__name__}: {exc}"]
        return []

    return probe


def _same_interpreter(python: str, executable: str) -> bool:
    """Whether command ``python`` (a path, or a name on the ``PATH``) starts ``executable``."""
    found = shutil.which(python)  # not resolved further: a venv's python links to its base
    return found is not None and os.path.abspath(found) == os.path.abspath(executable)


EXECUTORS_SECTION = "Running on a Spark cluster: distfusion on the executors"
"""The section of ``docs/spark.md`` saying how to install distfusion where Spark runs its tasks."""


def _missing_module_message(python: str | None, error: str) -> str:
    """The one-paragraph error for executors whose Python ``python`` raised ``error`` importing."""
    which = f" ({python})" if python else ""
    return (
        f"the Spark executors' Python{which} cannot import distfusion's modules ({error}): "
        "they need distfusion, datafusion and pyarrow of the driver's versions (the same "
        "venv through PYSPARK_PYTHON or spark.pyspark.python, a packed venv in "
        f'spark.archives, or --py-files); see docs/spark.md, section "{EXECUTORS_SECTION}"'
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
        err = error_from_dict(r) if isinstance(r, dict) else None
        if not isinstance(err, TaskError):
            continue
        cause = err.cause
        if r.get("attempts", 1) > 1:
            cause += f" (Spark gave up after {r['attempts']} attempts)"
        tb = err.remote_traceback or text
        return TaskError(err.stage_id, err.task_index, err.worker, cause, tb)
    missing = _MISSING_MODULE.search(text)
    if missing:
        return TransportError(_missing_module_message(None, missing.group(0)))
    last = _last_python_line(text) or text.strip().splitlines()[0] if text.strip() else repr(exc)
    return TransportError(f"Spark job failed on {master}: {last}")


def _last_python_line(text: str) -> str:
    """The last line of the last Python traceback in ``text``, or ``""``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", lines[i]):
            return lines[i].strip()
    return ""
