"""Runtimes: what executes a StageGraph (local threads, Spark, Flight workers)."""
