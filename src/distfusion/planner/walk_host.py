"""What the mixins of the planner's walk read of it (for type checking).

The walk (``inject_network_boundaries._Planner``) is built from
``SubqueryPlanning``, ``JoinDistribution`` (with ``RuntimeFilters`` and
``StoragePartitionedJoins``) and ``ExchangeReuse``; each reads the walk's
state and calls the walk's own methods. They derive from :class:`WalkHost`:
class-level annotations of that state (no value, so nothing at run time) and,
under ``TYPE_CHECKING`` only, the signatures of the walk's methods. At run
time it is an empty class; ``_Planner.__init__`` sets the attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrait.proto import Expression, Rel

from distfusion.io.sources import TableSource, WorkUnit
from distfusion.planner.config import PlannerConfig
from distfusion.planner.fragment import Fragment, MaterializedStage
from distfusion.stages import Stage, StageInput
from distfusion.substrait_plan.build import FunctionRegistry
from distfusion.substrait_plan.rewrite import SchemaOracle

if TYPE_CHECKING:
    from distfusion.planner.estimate import Estimate

__all__ = ["WalkHost"]


class WalkHost:
    """The state and methods of the planner's walk its mixins use (see the module)."""

    sources: dict[str, TableSource]  # table -> its source (and the pruned reads' tables)
    config: PlannerConfig
    registry: FunctionRegistry  # the plan's function extensions
    oracle: SchemaOracle  # output schemas of relations
    stages: list[Stage]  # sealed so far, in order
    computed: dict[tuple, int]  # what a stage computes -> its index in ``stages``
    reuses: int  # exchanges reused
    materialized: dict[str, MaterializedStage]  # stages that ran, by computation digest
    ran: dict[int, Stage]  # the same by stage id
    tables: set[str]  # the tables the stages read
    aligned_units: dict[str, tuple[tuple[WorkUnit, ...], ...]]  # source -> each task's units

    if TYPE_CHECKING:

        def visit(self, rel: Rel) -> Fragment: ...

        def seal(
            self,
            frag: Fragment,
            kind: str,
            partitions: int = 1,
            keys: list[Expression] | None = None,
            readers: int = 1,
        ) -> tuple[Rel, StageInput]: ...

        def exchange(
            self, frag: Fragment, n: int, keys: list[Expression] | None
        ) -> tuple[Rel, StageInput]: ...

        def gather(self, frag: Fragment) -> Fragment: ...

        def apart(self, frag: Fragment) -> Fragment: ...

        def shuffle_tasks(self, est: Estimate) -> int: ...

        def spark_tables(self, frag: Fragment) -> set[str]: ...

        def _include(self, stage: Stage) -> None: ...
