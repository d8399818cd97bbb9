"""The coordinator: what runs a query between the public API and the runtimes.

``query_run.py`` holds the Runtime and QueryRun protocols and the loop worker
runtimes share (``WorkerQueryRun``, ``execute_graph``); ``adaptive.py`` plans
the rest of a query again as stages finish; ``feeds.py`` holds a query's work
unit feed sessions.

The coordinator sits below ``runtime/``: it defines the protocols it drives,
runtimes implement them (and subclass ``WorkerQueryRun``), and ``context.py``
hands a runtime to the coordinator. See docs/architecture.md.
"""
