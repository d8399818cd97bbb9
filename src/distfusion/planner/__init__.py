"""The distributed planner: a Substrait plan in, a StageGraph out.

One module per concern, named as a verb or a noun of docs/architecture.md
(its planner section lists them): ``inject_network_boundaries`` (stage
cutting: the walk and ``seal``, and the entry :func:`plan_stages`),
``distribute_joins``, ``inject_runtime_filters``, ``reuse_exchanges``,
``plan_subqueries``, ``decompose_aggregate``, the rewrites before planning
(``push_semi_joins``, ...), ``estimate`` (sizes and task counts), ``config``
(:class:`DistributedConfig` and the :class:`PlannerConfig` derived from it),
``fragment`` (what the walk builds), ``substrait`` and ``walk`` (helpers over
the protobuf tree, the one relation walker). It imports the data model and
:mod:`distfusion.protocol` (the shuffle hashing rule), never the workers or
the runtimes.
"""

from distfusion.planner.config import DistributedConfig, PlannerConfig
from distfusion.planner.estimate import DefaultTaskEstimator, TaskEstimator
from distfusion.planner.inject_network_boundaries import plan_stages

__all__ = [
    "DefaultTaskEstimator",
    "DistributedConfig",
    "PlannerConfig",
    "TaskEstimator",
    "plan_stages",
]
