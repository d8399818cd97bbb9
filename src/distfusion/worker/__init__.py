"""Executing tasks: the task descriptor, one task's execution, and the Worker that runs them."""
