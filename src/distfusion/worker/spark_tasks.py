"""What the Spark runtime runs on the executors, in their Python workers.

Every job of :mod:`distfusion.runtime.spark` runs a closure made by
:func:`~distfusion.worker.spark_entries.task_function` (it ships the driver's
object stores and reports an executor that cannot import distfusion), which
calls one of the registered entries (:data:`~distfusion.worker.spark_entries.ENTRIES`);
this module's are:

- :func:`run_shuffle_task`: a task of the shuffle data plane, its output as Spark
  records (:mod:`distfusion.worker.spark_records`);
- :func:`run_flight_task`, :func:`run_flight_table_task`: a task of the
  Flight data plane, run on this process's Flight worker
  (:func:`_executor_worker`), which keeps its output (:func:`flight_task`);
- :func:`run_head_part`, :func:`frame_function`: head parts read over Flight
  (:func:`part_batches`; ``write_parquet``, ``to_spark``).

Tasks are described by the one Spark task encoding
(:mod:`distfusion.worker.spark_codec`): a stage record per stage, a task
record ``(stage, task, attempt)`` per task, the plan built here.

Nothing here imports the runtime (the driver side): an executor imports this
module and the worker's. A failed task reports itself as one line,
``DISTFUSION_TASK_ERROR {json}`` (:data:`ERROR_MARKER`; the driver reads it:
:mod:`distfusion.runtime.spark.jobs`).

``pyspark`` is an optional dependency: it is imported inside the functions
that need it (each marked so).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from distfusion.errors import (
    QueryCancelledError,
    TaskError,
    TaskPanicked,
)
from distfusion.io import object_store
from distfusion.metrics.task import TaskMetrics
from distfusion.protocol.errors import (
    error_to_dict,
    is_task_failure,
    task_error,
)
from distfusion.transport.tls import TlsMaterial
from distfusion.worker.execute_task import run_task
from distfusion.worker.head_parts import HeadPart, run_part
from distfusion.worker.memory import TaskMemory
from distfusion.worker.spark_codec import StageRecord, head_part, stage_of, task_plan
from distfusion.worker.spark_partitions import offering
from distfusion.worker.spark_records import (
    decode_records,
    group_inputs,
    output_records,
    partition_stats,
)
from distfusion.worker.worker import pulled_feed_chunks

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

EXECUTOR_QUERY_TTL_S = 600.0
"""Seconds an executor's Flight worker keeps a query nobody asked about (driver gone)."""


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


def _spark_batches(records, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow IPC record batch messages (``toArrowBatchRdd``'s records) as batches of ``schema``."""
    for payload in records:
        yield pa.ipc.read_record_batch(pa.py_buffer(payload), schema)


def drain(records) -> None:
    """Read what is left of a task's input: PySpark reuses a Python worker only then."""
    for _ in records:
        pass


# ---------------------------------------------------------------------- executor side
def run_shuffle_task(
    task_index,
    records,
    query_id,
    stage: StageRecord,
    shuffled,
    broadcast,
    compression,
    stats=None,
    metrics=None,
    memory_per_task_bytes=None,
    spark=None,
):
    """Run task ``task_index`` of ``stage`` (its record) inside a Spark task (shuffle data plane).

    DataFusion runs within ``memory_per_task_bytes`` (None: unbounded),
    spilling to a temporary directory deleted when the task ends.

    ``spark``: for a stage reading a Spark DataFrame, ``(table, read schema,
    offset, empty)``: the task is ``offset + task_index`` and ``records`` are
    its partition's Arrow messages
    (:func:`~distfusion.runtime.spark.dataframes.spark_input`), offered to the task
    as ``table``'s rows; ``empty``: the task has no partition (Spark made
    fewer), ``records`` are ignored.

    Yields records ``(consumer partition, (task_index, ipc bytes))``
    (:func:`output_records`); adds each output partition's rows and Arrow
    bytes to the ``stats`` accumulator, and the task's metrics
    (``TaskMetrics.to_dict``) to the ``metrics`` accumulator under
    ``(stage, task)``: both reach the driver with the task's result.

    Raises:
        RuntimeError: the task failed; its message is ``DISTFUSION_TASK_ERROR``
            followed by a JSON report (stage, task, worker, cause, traceback).
    """
    record, built = stage, stage_of(stage)
    worker = f"spark-executor://{socket.gethostname()}/pid{os.getpid()}"
    table, batches = None, iter(())
    if spark is not None:
        table, read_schema, offset, empty = spark
        task_index += offset
        if not empty:
            batches = _spark_batches(records, read_schema)
    try:
        plan = task_plan(query_id, record, task_index)
        _maybe_inject_failure(built.stage_id, task_index)
        # Drain the input even when the stage reads none (a leaf reads its task
        # index): PySpark reuses a Python worker only after its task read the
        # whole input, and a fresh worker costs ~1 s of imports and zip scans.
        # A Spark table's partition is read by the task, then drained.
        records = list(records) if table is None else records
        inputs = group_inputs(built, records if shuffled else ())
        for i, bc in broadcast.items():
            inputs[i] = sorted(bc.value, key=lambda v: v[0])
        measured: list[TaskMetrics] = []
        with (
            tempfile.TemporaryDirectory(prefix="distfusion-spill-") as spill_dir,
            offering(plan.key, table, batches),
        ):
            parts = run_task(
                plan,
                lambda i: decode_records(inputs[i]),
                worker=worker,
                feed_chunks=lambda share: pulled_feed_chunks(plan.key, share),
                memory=TaskMemory(memory_per_task_bytes, spill_dir),
                on_metrics=measured.append,
            )
        if table is not None:
            drain(records)
        out = list(output_records(task_index, parts, compression))
        if stats is not None:
            stats.add(partition_stats(built.stage_id, task_index, parts))
        if metrics is not None:
            metrics.add({(built.stage_id, task_index): measured[0].to_dict()})
    except TaskError as err:
        raise RuntimeError(ERROR_MARKER + _report(err)) from None
    except BaseException as exc:  # a native panic too (is_task_failure)
        if not is_task_failure(exc):
            raise
        failure = task_error(built.stage_id, task_index, worker, exc)
        raise RuntimeError(ERROR_MARKER + _report(failure)) from None
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


def run_flight_task(index, records, query_id, stages, *worker_args):
    """Run the task of this Spark partition on this process's Flight worker (classic Flight plane).

    The partition's one record is a task record ``(stage id, task index,
    attempt)``; ``stages`` maps a stage id to its stage record
    (:mod:`~distfusion.worker.spark_codec`: the stage, its UDFs and object
    stores with it, pickled once per job). A task of a stage reading a Spark
    table runs here only past the DataFrame's partitions (Spark made fewer
    partitions than the stage has tasks): it reads an empty one.
    ``worker_args``: :meth:`SparkRuntime.executor_worker_args`.

    Returns one record ``(stage id, task index, worker URL, metrics, error)``:
    the output stays on the worker; the task's metrics travel
    (``TaskMetrics.to_dict``: rows and Arrow bytes per output partition among
    them), or, when the task failed, ``error`` (the error codec's JSON, with
    ``"attempts"``) instead. Never raises for a failed task: PySpark would end
    this process and every output it holds.
    """
    sid, t, attempt = list(records)[0]  # drained: PySpark reuses this process
    stage = stages[sid]
    result = flight_task(task_plan(query_id, stage, t), attempt, stage[4], iter(()), worker_args)
    return iter([result])


def run_flight_table_task(index, records, query_id, attempts, stage, read_schema, *worker_args):
    """Run the task of Spark table partition ``index`` on this process's Flight worker.

    ``records`` are the partition's Arrow messages
    (:func:`~distfusion.runtime.spark.dataframes.spark_input`), read with
    ``read_schema``; the task is ``index`` of ``stage`` (its stage record, whose
    table this is); ``attempts`` maps the tasks to run to their attempt. The
    partition's batches are offered to the task, which reads them as it runs;
    what it left is drained. Returns what :func:`run_flight_task` does (no
    record for a partition whose task is not to run).
    """
    if index not in attempts:
        drain(records)
        return iter(())
    plan = task_plan(query_id, stage, index)
    try:
        batches = _spark_batches(records, read_schema)
        result = flight_task(plan, attempts[index], stage[4], batches, worker_args)
    finally:
        drain(records)
    return iter([result])


def flight_task(plan, attempt, table, batches, worker_args):
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
            and executor_transport(access).worker_started(
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
            executor_transport(access).task_failed(
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


def executor_transport(access: DataPlaneAccess | tuple):
    """This executor process's Flight transport for ``access`` (made once per token)."""
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
    transport = executor_transport(access)
    # named like a worker's spill root: deleted by the next one made should this
    # process be killed mid-part (worker.memory.remove_stale_roots)
    prefix = f"distfusion-spill-{os.getpid()}-part-"
    with tempfile.TemporaryDirectory(prefix=prefix) as spill:
        first = True
        memory = TaskMemory(budget, spill)
        batches = run_part(  # the stages ran in an earlier Spark job: producers are done
            part,
            transport,
            memory,
            target_partitions=threads,
            on_metrics=on_metrics,
            producers_done=True,
        )
        for b in batches:
            yield b
            if first:
                first = False
                _maybe_inject_failure(part.plan.key.stage_id, part.index, attempt)


def run_head_part(index, records, access, budget, threads, fn):
    """A Spark task of ``SparkFlightQuery.map_head_parts``: ``fn`` over one head part.

    The record is ``(attempt, part pickled by value)``
    (:func:`~distfusion.worker.spark_codec.head_part`). Returns one record ``(part index,
    fn's result, error)``: ``error`` is the error codec's JSON (with
    ``"attempts"``) when it failed. Never raises (see :func:`run_flight_task`).
    """
    attempt, data = list(records)[0]
    part = head_part(data)
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


def frame_function(parts: list[HeadPart], access: tuple, budget: int | None, threads: int, schema):
    """The ``mapInArrow`` function of a result read by Spark (``SparkDataFrame.to_spark``).

    Its input is ``spark.range(n, numPartitions=n)``: Spark partition *i*
    holds the one id *i*, and yields head part *i*'s batches, with
    ``schema``'s names and types. Like
    :func:`~distfusion.worker.spark_entries.task_function`, it refers to
    nothing of distfusion until it runs; the parts' plans carry the query's
    UDFs and stores (``TaskPlan.session``).
    """
    stores = object_store.specs()

    def run(batches):
        import distfusion.worker.spark_tasks as spark_tasks  # on the executor

        if stores:
            spark_tasks.object_store.install(stores)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                try:
                    for b in spark_tasks.part_batches(parts[i], access, budget, threads):
                        yield spark_tasks.as_schema(b, schema)
                except spark_tasks.QueryCancelledError as exc:
                    msg = (
                        f"{exc}: the distfusion result this Spark DataFrame reads was released "
                        "(its DataFrame returned by to_spark() was garbage collected, "
                        "release() was called, or the session closed); keep a reference "
                        "to it until its last action"
                    )
                    raise spark_tasks.QueryCancelledError(msg) from exc

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
    if not spec or ctx is None:  # no spec without a TaskContext
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


def import_probe():
    """The function of :meth:`SparkRuntime.check_executor_python`'s job: ``[]`` or the error.

    A closure (cloudpickle ships it by value) using the standard library
    only, so that an executor without distfusion unpickles and runs it.
    """

    def probe(_records):
        try:
            import datafusion  # noqa: F401
            import pyarrow  # noqa: F401

            import distfusion.worker.spark_tasks  # noqa: F401
        except ImportError as exc:
            return [f"{type(exc).__name__}: {exc}"]
        return []

    return probe


EXECUTORS_SECTION = "Running on a Spark cluster: distfusion on the executors"
"""The section of ``docs/spark.md`` saying how to install distfusion where Spark runs its tasks."""
