"""The distributed planner: a Substrait plan in, a StageGraph out.

``plan`` is the entry: :func:`prepare_substrait` and :func:`plan_stages` run
every pass, in the order that module lists. One module per pass or concern,
named as a verb or a noun of docs/architecture.md (its planner section lists
them): ``inject_network_boundaries`` (stage cutting: the walk and ``seal``),
``distribute_joins``, ``inject_runtime_filters``, ``reuse_exchanges``,
``plan_subqueries``, ``decompose_aggregate``, the rewrites before planning
(``push_semi_joins``, ...), ``estimate`` (sizes and task counts), ``config``
(:class:`DistributedConfig` and the :class:`PlannerConfig` derived from it),
``fragment`` (what the walk builds). Helpers over the Substrait protobuf tree
are :mod:`distfusion.substrait_plan`'s (shared with the workers). It imports
the data model and :mod:`distfusion.protocol` (the shuffle hashing rule), never
the workers or the runtimes.
"""

from distfusion.planner.config import DistributedConfig, PlannerConfig
from distfusion.planner.estimate import DefaultTaskEstimator, TaskEstimator
from distfusion.planner.plan import plan_stages, prepare_substrait

__all__ = [
    "DefaultTaskEstimator",
    "DistributedConfig",
    "PlannerConfig",
    "TaskEstimator",
    "plan_stages",
    "prepare_substrait",
]
