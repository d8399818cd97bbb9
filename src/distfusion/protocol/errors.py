"""The error codec: a distfusion error to and from a JSON-ready dict.

One encoding for every way a task's error reaches the coordinator: a Flight
worker puts it in the Flight error's ``extra_info``
(:func:`distfusion.transport.flight.encode_error`), a Spark task in the one
line it raises (:mod:`distfusion.runtime.spark`). The dict::

    {"distfusion-error": "TaskError",            the class name (the kind)
     "message": "stage 1 task 0 failed ...",     str(error)
     "stage_id": 1, "task_index": 0,             the class's error_fields
     "worker": "grpc://...", "cause": "...",
     "remote_traceback": "Traceback ..."}

An error that is not a distfusion error (a bug in a handler, a ``TimeoutError``)
travels as its kind, message and formatted traceback; :func:`error_from_dict`
returns None for it and the receiver decides what it means there.
"""

from __future__ import annotations

import json
import traceback

from distfusion import errors
from distfusion.errors import DistfusionError, TaskError, TaskPanicked
from distfusion.io import object_store

__all__ = [
    "KIND",
    "error_from_dict",
    "error_to_dict",
    "task_error_from_json",
    "is_native_panic",
    "is_task_failure",
    "task_error",
]

KIND = "distfusion-error"
"""The key holding the error's kind; marks a dict as an encoded error."""

_KINDS: dict[str, type[DistfusionError]] = {
    name: getattr(errors, name)
    for name in errors.__all__
    if issubclass(getattr(errors, name), DistfusionError)
}


def error_to_dict(exc: BaseException) -> dict:
    """``exc`` as a dict of JSON values (see the module docstring).

    A distfusion error carries its ``error_fields``; any other error its
    formatted traceback as ``remote_traceback``.
    """
    d: dict = {KIND: type(exc).__name__, "message": str(exc)}
    fields = getattr(exc, "error_fields", ()) if isinstance(exc, DistfusionError) else ()
    d.update((f, getattr(exc, f)) for f in fields)
    if not isinstance(exc, DistfusionError):
        d["remote_traceback"] = "".join(traceback.format_exception(exc))
    return d


def error_from_dict(d: dict) -> DistfusionError | None:
    """The distfusion error :func:`error_to_dict` encoded as ``d``: same kind and fields.

    Returns:
        The error, or None when ``d`` is not an encoded distfusion error (no
        :data:`KIND`, a foreign kind such as ``TimeoutError``, or fields missing).
    """
    cls = _KINDS.get(d.get(KIND, ""))
    if cls is None:
        return None
    try:
        if cls.error_fields:
            return cls(*(d[f] for f in cls.error_fields))
        return cls(d.get("message", ""))
    except (KeyError, TypeError):
        return None


def task_error_from_json(report: str) -> TaskError:
    """The TaskError a task's JSON failure ``report`` holds (:func:`error_to_dict`'s encoding).

    Raises:
        TypeError: the report holds no TaskError (a task reports TaskErrors only).
    """
    err = error_from_dict(json.loads(report))
    if not isinstance(err, TaskError):
        raise TypeError(f"a task reported no TaskError: {report[:500]}")
    return err


def is_native_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a panic in Rust code (DataFusion's, arrow's) surfacing in Python.

    pyo3 turns a panic that unwinds to the Python boundary into
    ``pyo3_runtime.PanicException``, a ``BaseException`` (so that ``except
    Exception`` does not swallow it). Told by its class (pyo3 creates it at
    run time: there is nothing to import), not by its message.
    """
    return any(
        c.__name__ == "PanicException" and c.__module__ == "pyo3_runtime" for c in type(exc).__mro__
    )


def is_task_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised while a task runs, fails the task (rather than the process).

    Every ``Exception``, and a panic in native code (:func:`is_native_panic`);
    not ``KeyboardInterrupt``, ``SystemExit`` or ``GeneratorExit``, which end
    more than the task.
    """
    return isinstance(exc, Exception) or is_native_panic(exc)


def task_error(stage_id: int, task_index: int, worker: str, exc: BaseException) -> TaskError:
    """``exc``, raised by task ``task_index`` of stage ``stage_id`` on ``worker``, as a TaskError.

    The cause is ``"Kind: message"`` (an object store's refusal with a hint
    about the worker's credentials, :func:`distfusion.io.object_store.hint`); the
    traceback is kept as ``remote_traceback``. Explicitly given credentials of
    the process's object stores are blanked out of both
    (:func:`distfusion.io.object_store.redact`). A panic in native code
    (:func:`is_native_panic`) is a :class:`~distfusion.errors.TaskPanicked`
    whose cause is ``"DataFusion panicked: message"`` (DataFusion's bug, or a
    UDF's that returned what it did not declare).
    """
    tb = object_store.redact("".join(traceback.format_exception(exc)))
    if is_native_panic(exc):
        cause = object_store.redact(
            f"DataFusion panicked: {exc} (a bug in native code, or a UDF that returned "
            "another type or length than it declared)"
        )
        return TaskPanicked(stage_id, task_index, worker, cause, tb)
    cause = object_store.redact(f"{type(exc).__name__}: {exc}")
    cause += object_store.hint(cause)
    return TaskError(stage_id, task_index, worker, cause, tb)
