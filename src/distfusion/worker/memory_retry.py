"""A task over its memory budget: run again in ways that spill, else fail naming the operator.

An operator that cannot spill and needs more than the task's pool (a hash
join's build side, a top-k, the merge of a sort's spill files) fails with
DataFusion's "Resources exhausted";
:func:`~distfusion.worker.execute_task.run_task_into` then runs the task again
as :func:`memory_attempts` lists, each time logged by :func:`warn_run_again`:

```
run 1   within the budget, as planned (sorts, aggregates spill)
run 2   within the budget, sort-merge joins instead of hash joins (they spill)
run 3   only with DistributedConfig.unbounded_memory_retry: no bound at all
then    TaskError: "MemoryBudgetExceeded: over its memory budget of 256.0 MiB
        ...: the hash join build side (DataFusion's HashJoinInput[0]) asked for ..."
```

The unbounded run is off by default: a budget is what a Spark executor or a
container is sized for, and a task past it was killed there with the whole
executor (issue 41, item 5). :func:`over_budget_cause` says which operator
asked for how much, from DataFusion's message.
"""

from __future__ import annotations

import logging
import re
from typing import NamedTuple

from distfusion.protocol.task_plan import TaskPlan, task_name
from distfusion.worker.memory import TaskMemory

__all__ = [
    "SORT_MERGE",
    "SORT_MERGE_JOINS",
    "UNBOUNDED",
    "Attempt",
    "MemoryBudgetExceeded",
    "is_exhausted",
    "memory_attempts",
    "over_budget",
    "over_budget_cause",
    "warn_run_again",
]

log = logging.getLogger("distfusion.worker")

SORT_MERGE = {"datafusion.optimizer.prefer_hash_join": "false"}
"""DataFusion settings of the second run: sort-merge joins, which spill."""

SORT_MERGE_JOINS = "sort-merge joins"
"""The name of the second run (``TaskMetrics.memory_retries``, logs)."""

UNBOUNDED = "unbounded"
"""The name of the unbounded run (``DistributedConfig.unbounded_memory_retry``)."""


class Attempt(NamedTuple):
    """One run of a task within (or without) its memory budget.

    Its first two fields are ``build_dataframe``'s ``memory`` and ``settings``.

    Attributes:
        memory: the pool and spill directory (``pool_bytes`` None: unbounded).
        settings: DataFusion settings on top of the task's; None: none.
        name: how it runs (``"as planned"``, :data:`SORT_MERGE_JOINS`,
            :data:`UNBOUNDED`).
    """

    memory: TaskMemory | None
    settings: dict[str, str] | None
    name: str


_ASKED = re.compile(
    r"Failed to allocate additional (?P<wanted>\S+ \S+) for (?P<consumer>.+?) "
    r"with (?P<held>\S+ \S+) already allocated"
)
# DataFusion's memory consumers (MemoryConsumer names) -> the operator a user sees.
_OPERATORS = {
    "HashJoinInput": "hash join build side",
    "ExternalSorter": "sort",
    "ExternalSorterMerge": "sort, merging its spill files,",
    "GroupedHashAggregateStream": "aggregate",
    "AggregateStream": "aggregate without grouping keys",
    "SMJStream": "sort-merge join",
    "NestedLoopJoinLoad": "nested loop join",
    "CrossJoinExec": "cross join",
    "RepartitionExec": "repartition",
    "TopK": "top-k (ORDER BY ... LIMIT)",
    "WindowAggStream": "window",
    "BoundedWindowAggStream": "window",
}


class MemoryBudgetExceeded(Exception):  # noqa: N818 (the cause's kind, read by users)
    """A task stayed over its memory budget after every run :func:`memory_attempts` allows.

    Raised inside the task (its message: :func:`over_budget_cause`, DataFusion's
    "Resources exhausted" chained as ``__cause__``); the worker boundary wraps
    it as a :class:`~distfusion.errors.TaskError` naming the stage, task and
    worker, whose cause starts with ``"MemoryBudgetExceeded: "``.
    """


def over_budget(memory: TaskMemory | None, runs: int, exc: BaseException) -> MemoryBudgetExceeded:
    """The error to raise ``from exc`` when run ``runs`` (1-based) of a task failed with ``exc``."""
    return MemoryBudgetExceeded(over_budget_cause(exc, memory.pool_bytes if memory else None, runs))


def is_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is DataFusion's "Resources exhausted" (the memory pool said no)."""
    return "Resources exhausted" in str(exc)


def memory_attempts(memory: TaskMemory | None, unbounded: bool = False) -> list[Attempt]:
    """How a task runs, in turn, while DataFusion says "Resources exhausted".

    Within ``memory``: as planned, then with sort-merge joins instead of hash
    joins (they spill); then, only with
    ``unbounded`` (``TaskPlan.unbounded_memory_retry``), with no bound on its
    pool. Without a bounded pool: one run only.

    Returns:
        The runs, in order.
    """
    attempts = [Attempt(memory, None, "as planned")]
    if memory is not None and memory.pool_bytes is not None:
        attempts.append(Attempt(memory, SORT_MERGE, SORT_MERGE_JOINS))
        if unbounded:
            attempts.append(Attempt(TaskMemory(None, memory.spill_dir), None, UNBOUNDED))
    return attempts


def warn_run_again(
    plan: TaskPlan, memory: TaskMemory | None, then: Attempt, exc: Exception
) -> None:
    """Log that the task of ``plan`` failed with ``exc`` and runs again as ``then`` says."""
    log.warning(
        "%s: over its memory budget of %s bytes (%s); running it again: %s",
        task_name(plan.key),
        memory.pool_bytes if memory else None,
        str(exc).splitlines()[0][:200],
        "with sort-merge joins" if then.name == SORT_MERGE_JOINS else then.name,
    )


def over_budget_cause(exc: BaseException, budget_bytes: int | None, runs: int) -> str:
    """The cause of a task that stayed over its budget: the operator, what it asked, what to do.

    ``exc`` is DataFusion's "Resources exhausted" of the last run, whose
    message names the memory consumer (``HashJoinInput[0]``) and the bytes it
    asked for; ``runs``: how many runs the task had (see
    :func:`memory_attempts`). DataFusion's message follows verbatim.

    Example::

        over its memory budget of 8.0 MiB (DistributedConfig.memory_per_task_bytes)
        after 2 runs (as planned, sort-merge joins): the hash join
        build side (DataFusion's HashJoinInput[0]) asked for 3.4 MB more, holding
        3.1 MB. Raise memory_per_task_bytes, or set ... Exception: DataFusion error: ...
    """
    text = str(exc)
    budget = "?" if budget_bytes is None else f"{budget_bytes / 2**20:.1f} MiB"
    names = ("as planned", SORT_MERGE_JOINS, UNBOUNDED)[:runs]
    found = _ASKED.search(text)
    if found is None:
        what = "an operator asked for more"
    else:
        consumer = found.group("consumer")
        operator = _OPERATORS.get(re.split(r"[\[(]", consumer, maxsplit=1)[0].strip())
        named = f"the {operator} (DataFusion's {consumer})" if operator else consumer
        what = f"{named} asked for {found.group('wanted')} more, holding {found.group('held')}"
    return (
        f"over its memory budget of {budget} (DistributedConfig.memory_per_task_bytes) "
        f"after {runs} run{'s' if runs > 1 else ''} ({', '.join(names)}): {what}. "
        "Raise memory_per_task_bytes, or set DistributedConfig(unbounded_memory_retry=True) "
        f"to run such a task once more without a bound. {type(exc).__name__}: {text}"
    )
