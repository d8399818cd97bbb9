"""Python UDFs in distributed queries (scalar, aggregate, window): one registry per context.

A UDF registered on a :class:`~distfusion.context.DistributedContext`
(``ctx.register_udf(u)``, ``register_udaf``, ``register_udwf``) belongs to
that context, as a UDF registered on a DataFusion ``SessionContext`` belongs
to it (:class:`Functions`): two contexts of one process may each have their
own ``f``. It is known to the context's planning and travels with each of
its queries' stages, only to the stages whose fragment calls it
(:mod:`distfusion.session`); every task registers its stage's UDFs in its
own DataFusion session, however the task is run:

- **local** runtime: the tasks run in this process and register the same
  DataFusion UDF objects in their session.
- **spark**: a UDF made with :func:`udf`, :func:`udaf` or :func:`udwf` (the
  arguments of DataFusion's functions of the same names) remembers its Python
  function (or accumulator / evaluator factory) and types (its
  ``distfusion_spec`` attribute: a :class:`UdfSpec`, :class:`UdafSpec` or
  :class:`UdwfSpec`); they travel with
  the stage or task plan in each Spark job, pickled by cloudpickle as
  PySpark's own UDFs are, and the executor builds the UDF again. A function
  in a module the executors cannot import must be shipped as PySpark's are
  (``--py-files``, ``spark.archives``) or defined in ``__main__``. A UDF made
  by DataFusion's own ``udf()`` cannot travel.
- **flight**: task plans never carry code. A worker loads its UDFs by
  reference at start, ``distfusion worker --udf package.module:name`` (a
  ``ScalarUDF``, ``AggregateUDF`` or ``WindowUDF``, or a list of them), as
  the system this project implements lets a worker build its session; every
  task session of that worker gets them. The head stage, on the coordinator,
  uses the context's.

A query naming a UDF a worker lacks fails with DataFusion's error naming the
function ("Unsupported function name", "Aggregate function ... is not
supported") and a hint saying how to provide it (``worker.execute_task``).
Names are one namespace per kind (scalar, aggregate, window) per context:
registering a UDF of the same kind and name again replaces it.

Aggregate UDFs and the planner
------------------------------

An aggregate UDF is planned as a non-decomposable aggregate: the raw rows are
shuffled by the GROUP BY keys (without keys: all rows go to one task) and the
whole aggregate runs once per group, in the consumer stage. One made by
:func:`udaf` with ``mergeable=True`` declares that its accumulator's ``merge``
combines the ``state`` of other accumulators (DataFusion's contract, which its
own partial/final aggregation relies on); it is then split like ``sum``
(:mod:`~distfusion.planner.decompose_aggregate`) with two companion UDAFs
registered next to it (:meth:`Functions.register`)::

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
    "Functions",
    "UdafSpec",
    "UdfSpec",
    "UdwfSpec",
    "load",
    "udaf",
    "udf",
    "udwf",
]

Function = ScalarUDF | AggregateUDF | WindowUDF

PARTIAL_SUFFIX = "__partial"
"""Name suffix of a mergeable UDAF's partial companion (evaluates to its state)."""
FINAL_SUFFIX = "__final"
"""Name suffix of a mergeable UDAF's final companion (merges states, evaluates)."""


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
        made.distfusion_spec = self  # type: ignore[attr-defined]  # ours, on datafusion's object
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
        made.distfusion_spec = self  # type: ignore[attr-defined]  # ours, on datafusion's object
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
        made.distfusion_spec = self  # type: ignore[attr-defined]  # ours, on datafusion's object
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


class Functions:
    """The Python UDFs of one :class:`~distfusion.context.DistributedContext` (or one worker).

    As a DataFusion ``SessionContext`` holds its UDFs, each context holds its
    own: two contexts of one process that register a UDF of the same name
    each keep theirs. Names are one namespace per kind (scalar, aggregate,
    window): registering a UDF of the same kind and name again replaces it.
    A mergeable UDAF (:func:`udaf` with ``mergeable=True``) brings its partial
    and final companions (module docs).

    Safe to read from task threads while another thread registers: every
    method works on a snapshot of the registry.
    """

    def __init__(self) -> None:
        # (kind, name) -> the UDF; kind is "scalar", "aggregate" or "window".
        self._udfs: dict[tuple[str, str], Function] = {}
        self._specs: dict[tuple[str, str], Any] = {}
        # mergeable UDAF name -> (partial companion name, final companion name)
        self._merges: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_specs(cls, shipped: tuple[Any, ...]) -> Functions:
        """The UDFs of ``shipped`` specs (:meth:`specs`), built again in this process.

        Raises:
            TypeError, ValueError: DataFusion rejects a spec's arguments.
        """
        made = cls()
        for spec in shipped:
            made.register(spec.build())
        return made

    def register(self, u: Function) -> None:
        """Add ``u`` (and a mergeable UDAF's companions), replacing one of its kind and name.

        Raises:
            TypeError: ``u`` is not a DataFusion ScalarUDF, AggregateUDF or WindowUDF.
        """
        kind = _kind(u)
        key = (kind, u.name)
        spec = getattr(u, "distfusion_spec", None)
        udfs, specs, merges = dict(self._udfs), dict(self._specs), dict(self._merges)
        udfs[key] = u
        if kind == "aggregate":
            for name in merges.pop(u.name, ()):  # the companions of the UDAF it replaces
                udfs.pop(("aggregate", name), None)
            if spec is not None and spec.mergeable:
                partial, final = spec.companions()
                udfs[("aggregate", partial.name)] = partial
                udfs[("aggregate", final.name)] = final
                merges[u.name] = (partial.name, final.name)
        if spec is None:
            specs.pop(key, None)
        else:
            specs[key] = spec
        # One assignment each: a reader sees the old or the new registry, never a mix
        # that lacks a function.
        self._udfs, self._specs, self._merges = udfs, specs, merges

    def names(self) -> frozenset[str]:
        """Names of the UDFs registered here (companions included), lower-cased."""
        return frozenset(name.lower() for _, name in self._udfs)

    def return_types(self) -> dict[str, pa.DataType | None]:
        """:meth:`names`, each with its Arrow return type where known (scalar UDFs with a spec)."""
        specs = self._specs
        return {
            name.lower(): specs[kind, name].return_type
            if kind == "scalar" and (kind, name) in specs
            else None
            for kind, name in self._udfs
        }

    def merge_functions(self, name: str) -> tuple[str, str] | None:
        """``(partial, final)`` companion names of the mergeable UDAF ``name``; None otherwise.

        The planner (:mod:`~distfusion.planner.decompose_aggregate`) asks, on the
        coordinator, while it splits aggregates.
        """
        return self._merges.get(name)

    def specs(self) -> tuple[Any, ...]:
        """The shippable UDFs (made by :func:`udf`, :func:`udaf` or :func:`udwf`)."""
        return tuple(self._specs.values())

    def only(self, names: frozenset[str]) -> Functions:
        """A registry of the UDFs named ``names`` (with a mergeable UDAF's companions)."""
        made = Functions()
        wanted = set(names)
        for name, pair in self._merges.items():
            if name in wanted or wanted & set(pair):
                wanted |= {name, *pair}
        made._udfs = {k: u for k, u in self._udfs.items() if k[1] in wanted}
        made._specs = {k: s for k, s in self._specs.items() if k[1] in wanted}
        made._merges = {n: p for n, p in self._merges.items() if n in wanted}
        return made

    def add_to(self, ctx: SessionContext) -> None:
        """Register every UDF here in ``ctx`` (a task's or the planner's session)."""
        for u in self._udfs.values():  # keyed by kind: ("scalar" | "aggregate" | "window", name)
            if isinstance(u, ScalarUDF):
                ctx.register_udf(u)
            elif isinstance(u, AggregateUDF):
                ctx.register_udaf(u)
            else:
                ctx.register_udwf(u)

    def __len__(self) -> int:
        return len(self._udfs)

    def __repr__(self) -> str:
        return f"Functions({', '.join(sorted(n for _, n in self._udfs))})"


def load(reference: str) -> list[Function]:
    """Import ``package.module:name``: the UDF(s) it names (Flight workers, the CLI).

    ``name`` may be a DataFusion ``ScalarUDF``, ``AggregateUDF`` or
    ``WindowUDF``, or a list or tuple of them.

    Returns:
        The UDFs, to register on a :class:`Functions` or a context.

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
    return found
