"""The coordinator: what runs a query between the public API and the runtimes.

A query's way through it, module by module:

- ``statements.py``: SQL text split into statements, planned in order, DDL and
  DML routed (a mixin of ``DistributedContext``); ``catalog.py``: the tables
  registered here, DataFusion's context and the sources kept in step;
- ``checks.py``: before planning, what the Substrait plan lost and who can
  read the tables it reads;
- ``execution.py``: a DataFrame's run (a mixin of ``DistributedDataFrame``):
  in place (``in_place.py``), on the coordinator only, or as stages on a
  runtime, statically or adaptively (``adaptive.py``);
- ``query_run.py``: the Runtime and QueryRun protocols, and the loop worker
  runtimes share (``WorkerQueryRun``, ``execute_graph``); ``feeds.py``: a
  query's work unit feed sessions;
- ``results.py``: the ResultStream, columns named as the query's;
  ``explain.py``: the plan rendered as text, DOT, HTML, EXPLAIN rows.

The coordinator sits below ``runtime/``: it defines the protocols it drives,
runtimes implement them (and subclass ``WorkerQueryRun``), and ``context.py``
hands a runtime to the coordinator. See docs/architecture.md.
"""
