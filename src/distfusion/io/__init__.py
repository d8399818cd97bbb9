"""Tables and formats: where a query's data comes from and where its results go.

One layer of the import contracts (``pyproject.toml``), below the stage graph and
the session settings, above the work unit feeds: the planner, the workers, the
coordinator and the runtimes all read tables through it. See
docs/architecture.md.

- :mod:`distfusion.io.sources`: registered tables as work units (Parquet, CSV,
  memory batches, Spark DataFrames), read by a task with ``register_scan``.
- :mod:`distfusion.io.object_store`: DataFusion's store classes that remember
  their arguments, so every worker builds the same store again; listing and
  footers through obstore.
- :mod:`distfusion.io.delta`: a Delta table's log of one version through
  delta-rs, as a Parquet source with a unit per active file.
- :mod:`distfusion.io.iceberg`: Iceberg tables as feed-backed tables (pyiceberg
  plans the files on the coordinator, tasks read them natively).
- :mod:`distfusion.io.write`: a query's result written as files where the
  head stage's parts run, with a safe job commit.
"""
