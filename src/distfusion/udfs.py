"""Python scalar UDFs in distributed queries: one registry per process.

A UDF registered on a :class:`~distfusion.context.DistributedContext`
(``ctx.register_udf(u)``) is known to the coordinator's planning and to every
task, however the task is run:

- **local** runtime: the tasks run in this process and register the same
  :class:`datafusion.ScalarUDF` objects in their session.
- **spark**: a UDF made with :func:`udf` (same arguments as DataFusion's
  ``udf``) remembers its Python function and types; they travel with each Spark
  job's closure, pickled by Spark's cloudpickle as PySpark's own UDFs are, and
  the executor builds the UDF again (:func:`install`). A function in a module
  the executors cannot import must be shipped as PySpark's are (``--py-files``,
  ``spark.archives``) or defined in ``__main__``.
- **flight**: task plans never carry code. A worker loads UDFs by reference at
  start, ``distfusion worker --udf package.module:name`` (a ``ScalarUDF``, or
  a list of them), as the system this project implements lets a worker build
  its session.

Task plans carry no UDF: every task session gets every UDF of its process
registry (:func:`add_to`), and a query naming a UDF a worker lacks fails with
DataFusion's "Unsupported function name" and a hint saying how to provide it.
Names are one namespace per process: registering a UDF of the same name again
replaces it. Only scalar UDFs are distributed (``register_udf``); aggregate and
window UDFs are not yet.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from datafusion import ScalarUDF, SessionContext
from datafusion import udf as datafusion_udf

__all__ = ["UdfSpec", "add_to", "install", "load", "register", "specs", "udf"]

_UDFS: dict[str, ScalarUDF] = {}
_SPECS: dict[str, UdfSpec] = {}


@dataclass(frozen=True)
class UdfSpec:
    """What rebuilds a scalar UDF in another process (pickled with a Spark job).

    Attributes:
        name: the SQL function name.
        func: the Python function: Arrow arrays in, an Arrow array out (as
            DataFusion's ``udf``).
        input_types: the Arrow type of each argument.
        return_type: the Arrow type of the result.
        volatility: ``"immutable"``, ``"stable"`` or ``"volatile"``.
    """

    name: str
    func: Any
    input_types: tuple[pa.DataType, ...]
    return_type: pa.DataType
    volatility: str

    def build(self) -> ScalarUDF:
        """The DataFusion UDF."""
        made = datafusion_udf(
            self.func, list(self.input_types), self.return_type, self.volatility, self.name
        )
        made._distfusion_spec = self
        return made


def udf(
    func,
    input_types: list[pa.DataType],
    return_type: pa.DataType,
    volatility: str,
    name: str | None = None,
) -> ScalarUDF:
    """A DataFusion scalar UDF that can also run on Spark executors.

    Arguments as DataFusion's ``udf(func, input_types, return_type, volatility,
    name)``; ``name`` defaults to ``func.__name__``.

    Raises:
        TypeError, ValueError: DataFusion rejects the arguments.
    """
    spec = UdfSpec(
        name or func.__name__,
        func,
        tuple(input_types),
        return_type,
        str(volatility).lower(),
    )
    return spec.build()


def register(u: ScalarUDF) -> None:
    """Make ``u`` known to this process's tasks (and, made by :func:`udf`, to Spark's)."""
    _UDFS[u.name] = u
    spec = getattr(u, "_distfusion_spec", None)
    if spec is not None:
        _SPECS[u.name] = spec
    else:
        _SPECS.pop(u.name, None)


def specs() -> tuple[UdfSpec, ...]:
    """The shippable UDFs of this process (those made by :func:`udf`)."""
    return tuple(_SPECS.values())


def missing_specs() -> list[str]:
    """Names of registered UDFs that cannot be shipped (made by DataFusion's ``udf``)."""
    return sorted(n for n in _UDFS if n not in _SPECS)


def install(shipped: tuple[UdfSpec, ...]) -> None:
    """On an executor: register the UDFs a Spark job brought (rebuilt once per process)."""
    for spec in shipped:
        if _SPECS.get(spec.name) is not spec:
            register(spec.build())


def load(reference: str) -> list[str]:
    """Import ``package.module:name`` and register the UDF(s) it names (Flight workers).

    ``name`` may be a ``ScalarUDF`` or a list or tuple of them.

    Returns:
        The names registered.

    Raises:
        ValueError: ``reference`` is not ``module:name``, or names no ScalarUDF.
        ImportError: the module cannot be imported.
        AttributeError: the module has no such name.
    """
    module, sep, attr = reference.partition(":")
    if not sep or not module or not attr:
        msg = f"--udf takes package.module:name, got {reference!r}"
        raise ValueError(msg)
    value = getattr(importlib.import_module(module), attr)
    found = list(value) if isinstance(value, list | tuple) else [value]
    if not found or not all(isinstance(u, ScalarUDF) for u in found):
        msg = f"{reference} is not a datafusion ScalarUDF (or a list of them): {value!r}"
        raise ValueError(msg)
    for u in found:
        register(u)
    return [u.name for u in found]


def add_to(ctx: SessionContext) -> None:
    """Register every UDF of this process in ``ctx`` (a task's or the planner's session)."""
    for u in _UDFS.values():
        ctx.register_udf(u)
