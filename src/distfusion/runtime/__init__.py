"""Runtimes: what executes a StageGraph (local threads, Arrow Flight workers, Spark).

``base.py`` holds the Runtime and QueryRun protocols, ``registry.py`` picks a
runtime by name, ``adaptive.py`` runs a query stage by stage over QueryRun.
See docs/architecture.md.
"""
