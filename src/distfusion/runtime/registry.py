"""The runtime registry: a runtime by name, for the CLI, the benchmark and the tests.

```
runtime_from_name("local", workers=4)                  LocalRuntime(workers=4)
runtime_from_name("flight", workers=3)                 3 new local Flight worker processes
runtime_from_name("flight", urls=["grpc://h:50051"])   those workers
runtime_from_name("spark", workers=2)                  embedded Spark, master local[2]
runtime_from_name("spark", master="spark://h:7077")    a Spark cluster
runtime_from_name("spark", connect="sc://h:15002")     a Spark Connect server
```

Adding a runtime: one module implementing
:class:`~distfusion.coordinator.query_run.Runtime` and one line in :data:`RUNTIMES`;
the contract suite (``tests/contract/``) then runs on it. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distfusion.coordinator.query_run import Runtime
from distfusion.runtime.flight import FlightRuntime
from distfusion.runtime.local import LocalRuntime
from distfusion.runtime.spark import SparkConnectRuntime, SparkRuntime, connect_session

__all__ = ["RUNTIMES", "runtime_from_name", "runtime_options"]


def _local(workers: int | None, **options: Any) -> Runtime:
    return LocalRuntime(workers=workers, **options)


def _flight(workers: int | None, urls: list[str] | None = None, **options: Any) -> Runtime:
    if urls:
        return FlightRuntime(list(urls), **options)
    return FlightRuntime.with_local_workers(workers or 3, **options)


def _spark(
    workers: int | None, master: str | None = None, connect: str | None = None, **options: Any
) -> Runtime:
    # With a session given, Spark's own slots decide; ``workers`` only names the master.
    if connect is not None:
        return SparkConnectRuntime(spark=connect_session(connect), **options)
    if master is None:
        master = f"local[{workers}]" if workers else "local[*]"
    return SparkRuntime(master=master, **options)


RUNTIMES: dict[str, Callable[..., Runtime]] = {
    "local": _local,
    "flight": _flight,
    "spark": _spark,
}
"""Runtime name -> ``factory(workers, **options)``. The CLI's ``--runtime`` choices."""


def runtime_from_name(name: str, workers: int | None = None, **options: Any) -> Runtime:
    """A new runtime ``name`` with ``workers`` workers (None: the runtime's default).

    Args:
        name: a key of :data:`RUNTIMES`.
        workers: ``local``: in-process workers (default: the cores); ``flight``:
            local worker processes to start when no ``urls`` are given
            (default 3); ``spark``: the embedded master ``local[workers]``
            when no ``master`` is given (default ``local[*]``).
        **options: passed to the runtime's constructor, plus ``urls`` (Flight:
            the URLs of running workers), ``master`` (Spark) and ``connect``
            (Spark: the URL of a Spark Connect server, ``sc://host:port``, whose
            session runs the tasks: :mod:`distfusion.runtime.spark.connect`).

    Raises:
        ValueError: unknown runtime name, or bad ``workers``.
        ImportError: the runtime's optional dependency is missing (pyspark,
            pyarrow.flight); says what to install.
        RuntimeError: a local Flight worker did not start.
        TransportError: (``spark``) the ``master`` or the ``connect`` server
            does not answer (:mod:`distfusion.runtime.spark.reach`).
    """
    try:
        factory = RUNTIMES[name]
    except KeyError:
        msg = f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}"
        raise ValueError(msg) from None
    return factory(workers, **options)


def runtime_options(args) -> dict[str, Any]:
    """The :func:`runtime_from_name` options of ``distfusion query/bench`` flags.

    Args:
        args: parsed flags: ``runtime``, and optionally ``master`` (Spark),
            ``workers_url``, ``token``, ``tls_root_certs`` (a PEM file; Flight),
            ``udf`` (``module:name`` references the Flight workers it starts
            load), ``connect`` (Spark: a Spark Connect URL), ``command``.
            Spark's console progress bar stays off.

    Raises:
        ValueError: ``--workers-url`` lists no URL.
        OSError: the ``--tls-root-certs`` file cannot be read.
    """
    name = getattr(args, "runtime", None)
    if name == "spark":
        # Spark's console progress bar would draw over the result table: the
        # CLI shows its own status line instead (DistributedDataFrame progress).
        options: dict[str, Any] = {"progress": False}
        if getattr(args, "master", None):
            options["master"] = args.master
        if getattr(args, "connect", None):
            options["connect"] = args.connect
        if getattr(args, "data_plane", None):
            options["data_plane"] = args.data_plane
        return options
    if name != "flight":
        return {}
    options = {"token": getattr(args, "token", None)}
    roots_path = getattr(args, "tls_root_certs", None)
    if roots_path:
        with open(roots_path, "rb") as f:
            options["tls_root_certs"] = f.read()
    urls_arg = getattr(args, "workers_url", None)
    if urls_arg:
        urls = [u.strip() for u in urls_arg.split(",") if u.strip()]
        if not urls:
            msg = f"--workers-url lists no URL: {urls_arg!r}"
            raise ValueError(msg)
        options["urls"] = urls
    elif getattr(args, "udf", None):
        options["udfs"] = tuple(args.udf)
    return options
