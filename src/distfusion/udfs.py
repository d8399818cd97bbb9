"""Python UDFs in distributed queries (scalar, aggregate, window): one registry per process.

A UDF registered on a :class:`~distfusion.context.DistributedContext`
(``ctx.register_udf(u)``, ``register_udaf``, ``register_udwf``) is known to
the coordinator's planning and to every task, however the task is run:

- **local** runtime: the tasks run in this process and register the same
  DataFusion UDF objects in their session.
- **spark**: a UDF made with :func:`udf`, :func:`udaf` or :func:`udwf` (the
  arguments of DataFusion's functions of the same names) remembers its Python
  function (or accumulator / evaluator factory) and types; they travel with
  each Spark job's closure, pickled by Spark's cloudpickle as PySpark's own
  UDFs are, and the executor builds the UDF again (:func:`install`). A function
  in a module the executors cannot import must be shipped as PySpark's are
  (``--py-files``, ``spark.archives``) or defined in ``__main__``.
- **flight**: task plans never carry code. A worker loads UDFs by reference at
  start, ``distfusion worker --udf package.module:name`` (a ``ScalarUDF``,
  ``AggregateUDF`` or ``WindowUDF``, or a list of them), as the system this
  project implements lets a worker build its session.

Task plans carry no UDF: every task session gets every UDF of its process
registry (:func:`add_to`), and a query naming a UDF a worker lacks fails with
DataFusion's error naming the function ("Unsupported function name",
"Aggregate function ... is not supported") and a hint saying how to provide it
(``worker.execute_task``). Names are one namespace per kind (scalar, aggregate,
window) per process: registering a UDF of the same kind and name again replaces
it.

Aggregate UDFs and the planner
------------------------------

An aggregate UDF is planned as a non-decomposable aggregate: the raw rows are
shuffled by the GROUP BY keys (without keys: all rows go to one task) and the
whole aggregate runs once per group, in the consumer stage. One made by
:func:`udaf` with ``mergeable=True`` declares that its accumulator's ``merge``
combines the ``state`` of other accumulators (DataFusion's contract, which its
own partial/final aggregation relies on); it is then split like ``sum``
(:mod:`~distfusion.planner.decompose_aggregate`) with two companion UDAFs
registered next to it in every process::

    name__partial(args)   update and merge as ``name``; evaluates to the
                          accumulator's state as one struct<s0, s1, ...>
                          (the state columns, typed as ``state_type``)
    name__final(struct)   merges those states (``update`` calls ``merge``
                          with the struct's fields); evaluates as ``name``

The partial aggregate runs in the producing stage, its struct column crosses
the shuffle (or coalesce), and the final aggregate merges the states per group.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from datafusion import AggregateUDF, ScalarUDF, SessionContext, WindowUDF
from datafusion import udf as datafusion_udf
from datafusion.user_defined import Accumulator, WindowEvaluator

__all__ = [
    "UdafSpec",
    "UdfSpec",
    "UdwfSpec",
    "add_to",
    "install",
    "load",
    "merge_functions",
    "register",
    "specs",
    "udaf",
    "udf",
    "udwf",
]

Function = ScalarUDF | AggregateUDF | WindowUDF

PARTIAL_SUFFIX = "__partial"
"""Name suffix of a mergeable UDAF's partial companion (evaluates to its state)."""
FINAL_SUFFIX = "__final"
"""Name suffix of a mergeable UDAF's final companion (merges states, evaluates)."""

# (kind, name) -> the UDF; kind is "scalar", "aggregate" or "window".
_UDFS: dict[tuple[str, str], Function] = {}
_SPECS: dict[tuple[str, str], Any] = {}
# mergeable UDAF name -> (partial companion name, final companion name)
_MERGES: dict[str, tuple[str, str]] = {}


def _kind(u: Function) -> str:
    if isinstance(u, ScalarUDF):
        return "scalar"
    if isinstance(u, AggregateUDF):
        return "aggregate"
    if isinstance(u, WindowUDF):
        return "window"
    msg = f"not a datafusion ScalarUDF, AggregateUDF or WindowUDF: {u!r}"
    raise TypeError(msg)


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
    kind = "scalar"

    def build(self) -> ScalarUDF:
        """The DataFusion UDF."""
        made = datafusion_udf(
            self.func, list(self.input_types), self.return_type, self.volatility, self.name
        )
        made._distfusion_spec = self
        return made


@dataclass(frozen=True)
class UdafSpec:
    """What rebuilds an aggregate UDF in another process (pickled with a Spark job).

    Attributes:
        name: the SQL function name.
        accumulator: a callable returning a fresh
            :class:`datafusion.Accumulator` (usually the class itself).
        input_types: the Arrow type of each argument.
        return_type: the Arrow type of the result.
        state_types: the Arrow type of each value ``Accumulator.state()`` returns.
        volatility: ``"immutable"``, ``"stable"`` or ``"volatile"``.
        mergeable: the accumulator's ``merge`` combines partial states, so the
            planner may aggregate partially before the shuffle (module docs).
    """

    name: str
    accumulator: Any
    input_types: tuple[pa.DataType, ...]
    return_type: pa.DataType
    state_types: tuple[pa.DataType, ...]
    volatility: str
    mergeable: bool
    kind = "aggregate"

    @property
    def state_struct(self) -> pa.StructType:
        """The partial companion's result type: ``struct<s0, s1, ...>`` of the state types."""
        return pa.struct([(f"s{i}", t) for i, t in enumerate(self.state_types)])

    def build(self) -> AggregateUDF:
        """The DataFusion UDAF."""
        made = self._make(self.name, self.accumulator, self.input_types, self.return_type)
        made._distfusion_spec = self
        return made

    def companions(self) -> tuple[AggregateUDF, AggregateUDF]:
        """The partial and final UDAFs of a mergeable UDAF (module docs)."""
        struct = self.state_struct
        partial = self._make(
            self.name + PARTIAL_SUFFIX,
            _Factory(_PartialState, self.accumulator, struct),
            self.input_types,
            struct,
        )
        final = self._make(
            self.name + FINAL_SUFFIX,
            _Factory(_MergeStates, self.accumulator, struct),
            (struct,),
            self.return_type,
        )
        return partial, final

    def _make(self, name, accumulator, input_types, return_type) -> AggregateUDF:
        return AggregateUDF(
            name,
            accumulator,
            list(input_types),
            return_type,
            list(self.state_types),
            self.volatility,
        )


@dataclass(frozen=True)
class UdwfSpec:
    """What rebuilds a window UDF in another process (pickled with a Spark job).

    Attributes:
        name: the SQL function name.
        evaluator: a callable returning a fresh :class:`datafusion.user_defined.WindowEvaluator`.
        input_types: the Arrow type of each argument.
        return_type: the Arrow type of the result.
        volatility: ``"immutable"``, ``"stable"`` or ``"volatile"``.
    """

    name: str
    evaluator: Any
    input_types: tuple[pa.DataType, ...]
    return_type: pa.DataType
    volatility: str
    kind = "window"

    def build(self) -> WindowUDF:
        """The DataFusion UDWF."""
        made = WindowUDF(
            self.name, self.evaluator, list(self.input_types), self.return_type, self.volatility
        )
        made._distfusion_spec = self
        return made


@dataclass(frozen=True)
class _Factory:
    """``make(accumulator(), struct)`` on each call: a companion's accumulator factory."""

    make: Any
    accumulator: Any
    struct: pa.StructType

    def __call__(self) -> Accumulator:
        return self.make(self.accumulator(), self.struct)


class _PartialState(Accumulator):
    """Accumulates as the UDAF's accumulator; evaluates to its state as one struct."""

    def __init__(self, inner: Accumulator, struct: pa.StructType) -> None:
        self.inner = inner
        self.struct = struct

    def update(self, *values: pa.Array) -> None:
        self.inner.update(*values)

    def merge(self, states: list[pa.Array]) -> None:
        self.inner.merge(states)

    def state(self) -> list[pa.Scalar]:
        return self.inner.state()

    def evaluate(self) -> pa.Scalar:
        arrays = []
        for value, field in zip(self.inner.state(), self.struct, strict=True):
            if isinstance(value, pa.Scalar) and value.type != field.type:
                value = value.cast(field.type)
            arrays.append(pa.array([value], type=field.type))
        return pa.StructArray.from_arrays(arrays, fields=list(self.struct))[0]


class _MergeStates(Accumulator):
    """Merges the states of :class:`_PartialState` (struct rows); evaluates as the UDAF."""

    def __init__(self, inner: Accumulator, struct: pa.StructType) -> None:
        self.inner = inner
        self.struct = struct

    def update(self, *values: pa.Array) -> None:
        (states,) = values
        self.inner.merge(states.flatten())  # flatten: the fields, with the array's offset

    def merge(self, states: list[pa.Array]) -> None:
        self.inner.merge(states)

    def state(self) -> list[pa.Scalar]:
        return self.inner.state()

    def evaluate(self) -> pa.Scalar:
        return self.inner.evaluate()


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


def udaf(
    accum,
    input_types: pa.DataType | list[pa.DataType],
    return_type: pa.DataType,
    state_type: list[pa.DataType],
    volatility: str,
    name: str | None = None,
    *,
    mergeable: bool = False,
) -> AggregateUDF:
    """A DataFusion aggregate UDF that can also run on Spark executors.

    Arguments as DataFusion's ``udaf(accum, input_types, return_type,
    state_type, volatility, name)``: ``accum()`` returns a fresh
    :class:`datafusion.Accumulator` (``update``, ``merge``, ``state``,
    ``evaluate``); ``name`` defaults to the accumulator's class name in lower case.

    ``mergeable=True`` declares that ``merge`` combines the ``state()`` of
    other accumulators into this one, whatever rows each saw. The planner then
    aggregates partially in the producing stage and ships only the states
    (one struct column of ``state_type`` per group) through the shuffle;
    otherwise the raw rows are shuffled by the GROUP BY keys (module docs).

    Raises:
        TypeError: ``accum`` is not callable or does not return an ``Accumulator``.
        ValueError: ``mergeable`` with no ``state_type``, or DataFusion rejects
            the types or volatility.
    """
    if not callable(accum):
        msg = f"udaf takes a callable returning a datafusion Accumulator, got {accum!r}"
        raise TypeError(msg)
    sample = accum()
    if not isinstance(sample, Accumulator):
        msg = f"udaf: {accum!r}() returned {sample!r}, not a datafusion Accumulator"
        raise TypeError(msg)
    if mergeable and not state_type:
        msg = "udaf: a mergeable aggregate UDF needs its state types (state_type) to ship states"
        raise ValueError(msg)
    if isinstance(input_types, pa.DataType):
        input_types = [input_types]
    spec = UdafSpec(
        name or type(sample).__qualname__.lower(),
        accum,
        tuple(input_types),
        return_type,
        tuple(state_type),
        str(volatility).lower(),
        bool(mergeable),
    )
    return spec.build()


def udwf(
    func,
    input_types: pa.DataType | list[pa.DataType],
    return_type: pa.DataType,
    volatility: str,
    name: str | None = None,
) -> WindowUDF:
    """A DataFusion window UDF that can also run on Spark executors.

    Arguments as DataFusion's ``udwf(func, input_types, return_type,
    volatility, name)``: ``func()`` returns a fresh
    :class:`datafusion.user_defined.WindowEvaluator`; ``name`` defaults to
    ``func``'s qualified name in lower case. A window function runs where the
    planner puts the window: its rows shuffled by the PARTITION BY keys
    (without keys: all rows in one task).

    Raises:
        TypeError: ``func`` is not callable or does not return a ``WindowEvaluator``.
        ValueError: DataFusion rejects the types or volatility.
    """
    if not callable(func) or not isinstance(func(), WindowEvaluator):
        msg = f"udwf takes a callable returning a datafusion WindowEvaluator, got {func!r}"
        raise TypeError(msg)
    if isinstance(input_types, pa.DataType):
        input_types = [input_types]
    spec = UdwfSpec(
        name or getattr(func, "__qualname__", type(func).__name__).lower(),
        func,
        tuple(input_types),
        return_type,
        str(volatility).lower(),
    )
    return spec.build()


def register(u: Function) -> None:
    """Make ``u`` known to this process's tasks (and, made by distfusion, to Spark's).

    A mergeable UDAF (:func:`udaf` with ``mergeable=True``) brings its partial
    and final companions (module docs).

    Raises:
        TypeError: ``u`` is not a DataFusion ScalarUDF, AggregateUDF or WindowUDF.
    """
    kind = _kind(u)
    key = (kind, u.name)
    spec = getattr(u, "_distfusion_spec", None)
    # Tasks of another thread may read the registry meanwhile (add_to): add the new
    # functions first, then drop what they replace, so none is ever missing.
    added = {key: u}
    merge = None
    if kind == "aggregate" and spec is not None and spec.mergeable:
        partial, final = spec.companions()
        added[("aggregate", partial.name)] = partial
        added[("aggregate", final.name)] = final
        merge = (partial.name, final.name)
    _UDFS.update(added)
    if kind == "aggregate":
        stale = set(_MERGES.get(u.name, ())) - set(merge or ())
        if merge is None:
            _MERGES.pop(u.name, None)
        else:
            _MERGES[u.name] = merge
        for name in stale:  # the companions of a mergeable UDAF this one replaces
            _UDFS.pop(("aggregate", name), None)
    if spec is None:
        _SPECS.pop(key, None)
    else:
        _SPECS[key] = spec


def registered_names() -> frozenset[str]:
    """Names of the UDFs this process knows (:func:`register`), lower-cased."""
    return frozenset(name.lower() for _, name in _UDFS)


def merge_functions(name: str) -> tuple[str, str] | None:
    """``(partial, final)`` companion names of the mergeable UDAF ``name``; None otherwise.

    The planner (:mod:`~distfusion.planner.decompose_aggregate`) asks, on the
    coordinator, while it splits aggregates.
    """
    return _MERGES.get(name)


def specs() -> tuple[Any, ...]:
    """The shippable UDFs of this process (made by :func:`udf`, :func:`udaf` or :func:`udwf`)."""
    return tuple(_SPECS.values())


def missing_specs() -> list[str]:
    """Names of registered UDFs that cannot be shipped (made by DataFusion's own functions)."""
    companions = {n for pair in _MERGES.values() for n in pair}
    return sorted(n for k, n in _UDFS if (k, n) not in _SPECS and n not in companions)


def install(shipped: tuple[Any, ...]) -> None:
    """On an executor: register the UDFs a Spark job brought (rebuilt once per process).

    A spec equal to the one registered (same function objects and types: a
    module's function unpickles as the same object) is not built again.
    """
    for spec in shipped:
        if _SPECS.get((spec.kind, spec.name)) != spec:
            register(spec.build())


def load(reference: str) -> list[str]:
    """Import ``package.module:name`` and register the UDF(s) it names (Flight workers).

    ``name`` may be a DataFusion ``ScalarUDF``, ``AggregateUDF`` or
    ``WindowUDF``, or a list or tuple of them.

    Returns:
        The names registered.

    Raises:
        ValueError: ``reference`` is not ``module:name``, or names no UDF.
        ImportError: the module cannot be imported.
        AttributeError: the module has no such name.
    """
    module, sep, attr = reference.partition(":")
    if not sep or not module or not attr:
        msg = f"--udf takes package.module:name, got {reference!r}"
        raise ValueError(msg)
    value = getattr(importlib.import_module(module), attr)
    found = list(value) if isinstance(value, list | tuple) else [value]
    if not found or not all(isinstance(u, Function) for u in found):
        msg = (
            f"{reference} is not a datafusion ScalarUDF, AggregateUDF or WindowUDF "
            f"(or a list of them): {value!r}"
        )
        raise ValueError(msg)
    for u in found:
        register(u)
    return [u.name for u in found]


def add_to(ctx: SessionContext) -> None:
    """Register every UDF of this process in ``ctx`` (a task's or the planner's session)."""
    for (kind, _), u in tuple(_UDFS.items()):  # a snapshot: register may run meanwhile
        if kind == "scalar":
            ctx.register_udf(u)
        elif kind == "aggregate":
            ctx.register_udaf(u)
        else:
            ctx.register_udwf(u)
