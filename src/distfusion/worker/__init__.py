"""Executing tasks: one task's execution, the Worker that runs them, its Flight server.

Tasks arrive as :class:`~distfusion.protocol.task_plan.TaskPlan` (the contract
is in :mod:`distfusion.protocol`). See docs/architecture.md.
"""
