"""The Runtime and QueryRun protocols, under their old import path.

They live in :mod:`distfusion.coordinator.query_run` (the coordinator defines
what it drives; runtimes implement it). Kept for the modules and user code that
import them from here; new code imports from the coordinator.
"""

from distfusion.coordinator.query_run import (
    FAILURE_POLL_S,
    QueryRun,
    Routing,
    Runtime,
    StageStats,
    WorkerQueryRun,
    default_target_partitions,
    execute_graph,
    round_robin,
    task_threads,
)

__all__ = [
    "FAILURE_POLL_S",
    "QueryRun",
    "Routing",
    "Runtime",
    "StageStats",
    "WorkerQueryRun",
    "default_target_partitions",
    "execute_graph",
    "round_robin",
    "task_threads",
]
