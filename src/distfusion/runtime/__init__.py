"""Runtimes: what executes a StageGraph (local threads, Arrow Flight workers, Spark).

Each implements the Runtime protocol of :mod:`distfusion.coordinator.query_run`
(``base.py`` re-exports it under its old path); ``registry.py`` picks a runtime
by name. See docs/architecture.md.
"""
