"""Spark jobs seen from the driver: their group and names, their progress, their failures.

Errors raised inside a Spark task reach the driver as a Java exception
holding the Python traceback as text. The task therefore reports a failure as
one line, ``DISTFUSION_TASK_ERROR {json}``
(:data:`~distfusion.worker.spark_tasks.ERROR_MARKER`: the protocol's error
codec, :mod:`distfusion.protocol.errors`, plus Spark's attempt count), which
:func:`translate_error` turns back into a :class:`~distfusion.errors.TaskError`
naming the stage and the task.
"""

from __future__ import annotations

import json
import re

from distfusion.errors import (
    TaskError,
    TransportError,
)
from distfusion.protocol.errors import (
    error_from_dict,
)
from distfusion.worker.spark_tasks import ERROR_MARKER, EXECUTORS_SECTION

_MISSING_MODULE = re.compile(r"No module named '(distfusion|datafusion|pyarrow)[^']*'")
# The embedded session's Python daemon (distfusion_spark_daemon) did not start:
# Spark reports only that it read no port from it (the ImportError is in its log).
_MISSING_DAEMON = "port number from distfusion_spark_daemon's stdout"


def by_value(value) -> bytes:
    """``value`` pickled for Spark's executors, as PySpark pickles its own UDFs (cloudpickle).

    A function of ``__main__`` (a notebook's UDF) travels by value, where
    plain pickle would name it by reference and fail on the executor.
    """
    from pyspark import cloudpickle  # optional dependency

    return cloudpickle.dumps(value)


def missing_module(text: str) -> str | None:
    """The import error of executors lacking distfusion that Spark's error ``text`` shows."""
    found = _MISSING_MODULE.search(text)
    if found:
        return found.group(0)
    return "No module named 'distfusion_spark_daemon'" if _MISSING_DAEMON in text else None


def job_group(query_id: str) -> str:
    """The Spark job group of query ``query_id`` (every Spark job of the query runs in it)."""
    return f"distfusion-{query_id}"


class CallSite:
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
        # PySpark's own call-site depth and JVM context: no public API sets the call site.
        if SCCallSiteSync._spark_stack_depth == 0:  # noqa: SLF001
            self.sc._jsc.setCallSite(self.description)  # noqa: SLF001
        SCCallSiteSync._spark_stack_depth += 1  # noqa: SLF001
        return self

    def __exit__(self, *exc) -> None:
        from pyspark.traceback_utils import SCCallSiteSync  # optional dependency

        SCCallSiteSync._spark_stack_depth -= 1  # noqa: SLF001
        if SCCallSiteSync._spark_stack_depth == 0:  # noqa: SLF001
            self.sc._jsc.setCallSite(None)  # noqa: SLF001
        self.sc.setLocalProperty("callSite.long", None)


def spark_progress(sc, group: str) -> tuple[int, int]:
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


def spark_call(action, check_open, master: str):
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
        err = translate_error(exc, master)
        if missing_module(str(exc)):  # Spark's Java trace adds nothing to it
            raise err from None
        raise err from exc
    check_open()
    return result


def missing_module_message(python: str | None, error: str) -> str:
    """The one-paragraph error for executors whose Python ``python`` raised ``error`` importing."""
    which = f" ({python})" if python else ""
    return (
        f"the Spark executors' Python{which} cannot import distfusion's modules ({error}): "
        "they need distfusion, datafusion and pyarrow of the driver's versions (the same "
        "venv through PYSPARK_PYTHON or spark.pyspark.python, a packed venv in "
        f'spark.archives, or --py-files); see docs/spark.md, section "{EXECUTORS_SECTION}"'
    )


# ---------------------------------------------------------------------- driver side errors
def translate_error(exc: Exception, master: str) -> Exception:
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
    missing = missing_module(text)
    if missing:
        return TransportError(missing_module_message(None, missing))
    last = _last_python_line(text) or text.strip().splitlines()[0] if text.strip() else repr(exc)
    return TransportError(f"Spark job failed on {master}: {last}")


def _last_python_line(text: str) -> str:
    """The last line of the last Python traceback in ``text``, or ``""``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", lines[i]):
            return lines[i].strip()
    return ""
