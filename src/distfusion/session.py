"""What a query's task sessions get besides their tables: its context's UDFs and object stores.

As a DataFusion ``SessionContext`` holds its UDFs and object stores, a
:class:`~distfusion.context.DistributedContext` holds its own
(:class:`~distfusion.udfs.Functions`, :class:`~distfusion.io.object_store.Stores`),
and they travel with each query's stages, not through a registry of the
process: two contexts of one process that register a UDF ``f`` each (or a
store for the same bucket) never see each other's.

```
 DistributedContext ──settings()──> SessionSettings ──planner──> Stage.settings
   (its UDFs, stores)                (a snapshot)      (the UDFs its fragment
                                                        calls, every store)
 Stage.settings ──> TaskPlan.settings ──> task_context(): registered in the
                                          task's own SessionContext
```

How the settings reach a task, by runtime:

- **local**: the task plan object itself (nothing is serialised).
- **spark**: pickled with the stage or task plan in the job's closure, by
  value as PySpark ships its UDFs (:func:`distfusion.runtime.spark.jobs.by_value`);
  the executor builds the UDFs and stores again from their specs
  (:meth:`SessionSettings.__getstate__`). A UDF made by
  DataFusion's own ``udf()`` (no spec) cannot travel and is left out.
- **flight**: task plans carry no code and no credentials. A worker's UDFs
  are its own (``distfusion worker --udf``); the stores travel in a
  ``set_object_stores`` call for the query, before its first task plan
  (:data:`~distfusion.protocol.messages.ACTION_SET_OBJECT_STORES`), and the
  worker keeps them for that query only.
"""

from __future__ import annotations

from typing import Any

from datafusion import SessionContext
from substrait.proto import Plan

from distfusion.io import object_store
from distfusion.io.object_store import Stores, StoreSpec
from distfusion.udfs import Functions

__all__ = ["SessionSettings", "called_functions"]


class SessionSettings:
    """The UDFs and object stores a query's task sessions register (a snapshot).

    Picklable: only the specs travel (:meth:`__getstate__`), and the UDFs and
    stores are built again where the pickle is loaded.

    Attributes:
        functions: the UDFs.
        stores: the object stores by ``scheme://host``.
    """

    def __init__(self, functions: Functions | None = None, stores: Stores | None = None) -> None:
        self.functions = functions if functions is not None else Functions()
        self.stores = stores if stores is not None else Stores()

    @classmethod
    def snapshot(cls, functions: Functions, stores: Stores) -> SessionSettings:
        """Copies of a context's ``functions`` and ``stores``, which later registrations leave.

        The stores are ``stores`` over the process's (:data:`~distfusion.io.object_store.PROCESS`):
        a bucket the context has no store for is read as the coordinator reads it
        (a store made from the environment, or by a table's own catalog: Iceberg's).
        """
        return cls(functions.only(functions.names()), object_store.PROCESS.overlaid(stores))

    def for_fragment(self, fragment: bytes) -> SessionSettings:
        """The settings with only the UDFs Substrait plan ``fragment`` calls (every store)."""
        return SessionSettings(self.functions.only(called_functions(fragment)), self.stores)

    def with_stores(self, stores: Stores) -> SessionSettings:
        """These UDFs with ``stores`` instead (a Flight worker's stores of one query)."""
        return SessionSettings(self.functions, stores)

    def add_to(self, ctx: SessionContext) -> None:
        """Register the UDFs and stores in ``ctx``, before any plan is decoded in it."""
        self.functions.add_to(ctx)
        self.stores.add_to(ctx)

    def __getstate__(self) -> dict[str, Any]:
        return {"udfs": self.functions.specs(), "stores": self.stores.specs()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.functions = Functions.from_specs(state["udfs"])
        self.stores = Stores.from_specs(state["stores"])

    def store_specs(self) -> tuple[tuple[str, StoreSpec], ...]:
        """``(scheme://host, spec)`` of every store (a Flight worker's ``set_object_stores``)."""
        return self.stores.specs()

    def __repr__(self) -> str:
        return f"SessionSettings({self.functions!r}, {self.stores!r})"


def called_functions(fragment: bytes) -> frozenset[str]:
    """The names of the functions Substrait plan ``fragment`` declares (``f`` of ``f:i64``).

    Raises:
        google.protobuf.message.DecodeError: ``fragment`` is not a Substrait plan.
    """
    plan = Plan()
    plan.ParseFromString(fragment)
    return frozenset(
        e.extension_function.name.split(":", 1)[0]
        for e in plan.extensions
        if e.HasField("extension_function")
    )
