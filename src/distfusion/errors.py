"""Errors raised by distfusion.

One root, :class:`DistfusionError`, with a branch per phase of a query:

```
DistfusionError
 ├── PlanningError (ValueError)     bad SQL, unknown table, plan the planner rejects
 │    ├── NotDistributableError     DataFusion accepts it, the distributed planner
 │    │                             cannot cut it (the query runs on the coordinator)
 │    └── SparkSemanticsError       Spark SQL distfusion cannot run with Spark's
 │                                  semantics (the drop-in hands it to Spark SQL)
 ├── TaskError                      a task failed on a worker (names stage, task, worker)
 │    └── TaskPanicked              its native code panicked (not retried)
 ├── TransportError                 a worker (a Spark master, a Connect server) could
 │    │                             not be reached or answered badly
 │    ├── WorkerUnavailableError (TransientError)
 │    └── AuthenticationError       a worker rejected the shared secret token
 ├── FeedError                      a work unit feed's provider failed (names feed, partition)
 ├── QueryCancelledError            the result stream was closed before it ended
 ├── ContextClosedError (RuntimeError)
 │                                  a context used after its close()
 └── TransientError                 retry-safe: running the same query again may succeed
```

Errors keep their kind and fields across processes: each class names the
fields its constructor takes (``error_fields``); pickling (``__reduce__``) and
the wire codec of :mod:`distfusion.protocol.errors` (Flight workers, Spark
tasks) both rebuild an error from them.

DataFusion reports every failure as a bare ``Exception("DataFusion error: ...")``;
it is wrapped once, where it crosses into distfusion (the planner or the worker),
keeping DataFusion's message verbatim.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "ContextClosedError",
    "DistfusionError",
    "FeedError",
    "NotDistributableError",
    "PlanningError",
    "QueryCancelled",
    "QueryCancelledError",
    "SparkSemanticsError",
    "TaskError",
    "TaskPanicked",
    "TransientError",
    "TransportError",
    "WorkerUnavailableError",
]


class DistfusionError(Exception):
    """Root of every error distfusion raises.

    Attributes:
        error_fields: the attributes a subclass's constructor takes, in order;
            empty when it takes only the message.
    """

    error_fields: ClassVar[tuple[str, ...]] = ()

    def __reduce__(self):  # keeps the fields when the error crosses a process boundary
        if not self.error_fields:
            return super().__reduce__()
        return (type(self), tuple(getattr(self, f) for f in self.error_fields))


class TransientError(DistfusionError):
    """A failure that may not happen again: retrying the query is safe."""


class PlanningError(DistfusionError, ValueError):
    """The query could not be planned: invalid SQL, an unknown table or column.

    Raised on the coordinator before any task starts. The message keeps
    DataFusion's own wording.
    """


class NotDistributableError(PlanningError):
    """DataFusion plans the query, but the distributed planner cannot cut it into stages.

    Raised by the planner (:func:`~distfusion.planner.plan.plan_stages`)
    when a fragment does not survive Substrait (DataFusion's consumer rejects
    what its producer wrote), or the plan reads a table distfusion has no
    source for (a table function such as ``generate_series``, an
    ``information_schema`` table). :class:`~distfusion.context.DistributedDataFrame`
    catches it and runs the query whole on the coordinator with single-node
    DataFusion instead (``coordinator_only()`` gives the message as the reason).
    """


class SparkSemanticsError(PlanningError):
    """Spark SQL that distfusion cannot run with Spark's semantics (never with others).

    Raised by :func:`distfusion.spark_sql.translate` for a construct, function
    or type it has no Spark-equal translation of; the message names it.
    ``distfusion.spark.sql`` catches it and runs the query as ``spark.sql``
    itself (its ``fallback`` attribute says why), unless asked to raise.
    """


class TaskError(DistfusionError):
    """A task failed while executing its fragment.

    Attributes:
        stage_id: the stage of the failed task.
        task_index: the task's index within its stage (0-based).
        worker: the URL of the worker that ran it (``local://N`` in process).
        cause: the remote error's kind and message, e.g. ``"Exception: DataFusion error: ..."``.
        remote_traceback: the formatted traceback from the worker, or ``""``.
    """

    error_fields = ("stage_id", "task_index", "worker", "cause", "remote_traceback")

    def __init__(
        self,
        stage_id: int,
        task_index: int,
        worker: str,
        cause: str,
        remote_traceback: str = "",
    ) -> None:
        self.stage_id = stage_id
        self.task_index = task_index
        self.worker = worker
        self.cause = cause
        self.remote_traceback = remote_traceback
        msg = f"stage {stage_id} task {task_index} failed on worker {worker}: {cause}"
        super().__init__(msg)


class TaskPanicked(TaskError):
    """A task's native code panicked: DataFusion's or arrow's Rust code hit a bug.

    Also what a UDF returning another type or length than it declared leads
    to (DataFusion takes the declared type on trust). A panic reaches Python
    as pyo3's ``PanicException`` (a ``BaseException``); the task fails with
    this error instead, and its query with it at once: the Spark runtime does
    not run it again (the same input panics again), the other tasks are
    cancelled. The cause starts with ``"DataFusion panicked: "``.
    """


class TransportError(DistfusionError):
    """A worker could not be reached, or answered something the coordinator cannot read.

    Also a Spark master or Spark Connect server that does not answer, found
    in seconds before Spark is asked (:mod:`distfusion.runtime.spark.reach`).
    """


class _WorkerCallError(TransportError):
    """A transport error about one worker: keeps its URL and detail across processes.

    Attributes:
        url: the worker's URL.
        detail: what went wrong.
    """

    what = "failed"
    error_fields = ("url", "detail")

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"worker {url} {self.what}: {detail}")


class WorkerUnavailableError(_WorkerCallError, TransientError):
    """A worker is unreachable or died; retrying on other workers may succeed."""

    what = "is unavailable"


class AuthenticationError(_WorkerCallError):
    """A worker rejected the call: its shared secret token is missing or wrong.

    Not transient: the same call with the same token is rejected again.
    """

    what = "rejected the call"


class QueryCancelledError(DistfusionError):
    """The query was cancelled (its result stream was closed) before it finished."""


class ContextClosedError(DistfusionError, RuntimeError):
    """A :class:`~distfusion.context.DistributedContext` was used after its ``close()``.

    Raised when a query of the context (or of a DataFrame made from it) is
    run, or its runtime is asked for, after
    :meth:`~distfusion.context.DistributedContext.close` released the runtime
    (stopped its workers or its Spark session): without this check the query
    would reach the stopped workers and fail as cancelled or unreachable. Not
    transient: make a new context. A ``RuntimeError`` too, as Python's own
    "used after shutdown" errors are (``concurrent.futures``, ``asyncio``).
    """


QueryCancelled = QueryCancelledError
"""Deprecated alias of :class:`QueryCancelledError` (the name before the ``Error`` suffix)."""


class FeedError(DistfusionError):
    """A work unit feed failed: its provider raised, or a task could not read it.

    Raised on the coordinator when a :class:`~distfusion.work_unit_feed.WorkUnitFeedProvider`
    raises while the query runs (the query fails and every task is torn down),
    and inside a leaf task that cannot reach the feed it reads.

    Attributes:
        feed: the table name the feed backs.
        feed_id: the feed's UUID.
        partition: the feed partition (the leaf task index) that failed.
        cause: the provider's error kind and message (``"ValueError: page 3 is gone"``).
    """

    error_fields = ("feed", "feed_id", "partition", "cause")

    def __init__(self, feed: str, feed_id: str, partition: int, cause: str) -> None:
        self.feed = feed
        self.feed_id = feed_id
        self.partition = partition
        self.cause = cause
        msg = f"work unit feed {feed!r} ({feed_id[:8]}) partition {partition} failed: {cause}"
        super().__init__(msg)
