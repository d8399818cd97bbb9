"""A task over its memory budget runs again: with sort-merge joins, then unbounded.

An operator that cannot spill and needs more than the task's pool (a hash
join's build side) fails with DataFusion's "Resources exhausted";
:func:`~distfusion.worker.execute_task.run_task_into` then runs the task again
as :func:`memory_attempts` lists (correct first), each time logged by
:func:`warn_run_again`.
"""

from __future__ import annotations

import logging

from distfusion.protocol.task_plan import TaskPlan, task_name
from distfusion.worker.memory import TaskMemory

log = logging.getLogger("distfusion.worker")


SORT_MERGE = {"datafusion.optimizer.prefer_hash_join": "false"}


def is_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is DataFusion's "Resources exhausted" (the memory pool said no)."""
    return "Resources exhausted" in str(exc)


def memory_attempts(
    memory: TaskMemory | None,
) -> list[tuple[TaskMemory | None, dict[str, str] | None]]:
    """How a task runs, in turn, while DataFusion says "Resources exhausted".

    Within ``memory``; then with sort-merge joins instead of hash joins (they
    spill); then with an unbounded pool. Without a bounded pool: one run only.
    """
    attempts: list[tuple[TaskMemory | None, dict[str, str] | None]] = [(memory, None)]
    if memory is not None and memory.pool_bytes is not None:
        attempts.append((memory, SORT_MERGE))
        attempts.append((TaskMemory(None, memory.spill_dir), None))
    return attempts


def warn_run_again(plan: TaskPlan, memory: TaskMemory | None, n: int, exc: Exception) -> None:
    """Log that the task of ``plan`` runs again after attempt ``n`` failed with ``exc``."""
    log.warning(
        "%s: over its memory budget of %s bytes (%s); running it again %s",
        task_name(plan.key),
        memory.pool_bytes if memory else None,
        str(exc).splitlines()[0][:200],
        "with sort-merge joins" if n == 0 else "with an unbounded pool",
    )
