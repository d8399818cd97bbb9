"""The distributed planner: a Substrait plan in, a StageGraph out.

One module per pass or rule: ``inject_network_boundaries`` (the walk that cuts
stages), ``decompose_aggregate`` (partial/final aggregates), ``estimate`` (sizes
and task counts), ``substrait`` (helpers over the protobuf tree), and the
rewrites named after what they do (``push_semi_joins``, ...). It imports the
data model and :mod:`distfusion.protocol` (the shuffle hashing rule), never the
workers or the runtimes; see docs/architecture.md.
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
