"""Worker resolvers: where the workers are.

A resolver is asked twice per query: during planning (how many workers exist;
that number caps the tasks of every stage) and right before execution (each
task is assigned a URL). Note how :meth:`WorkerResolver.get_urls` is not async
and must return at once: any slow discovery (a DNS lookup, a Kubernetes API
call) must happen on a background thread, as in datafusion-distributed's
``WorkerResolver``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from distfusion.errors import PlanningError

__all__ = ["WorkerResolver", "StaticWorkerResolver", "DynamicWorkerResolver", "SparkWorkerResolver"]

log = logging.getLogger("distfusion.resolver")


@runtime_checkable
class WorkerResolver(Protocol):
    """Tells the coordinator the URLs of the workers it may use."""

    def get_urls(self) -> list[str]:
        """The current worker URLs; synchronous, returns at once. May be empty."""
        ...


class StaticWorkerResolver:
    """A fixed list of worker URLs.

    Args:
        urls: the workers, e.g. ``["grpc://10.0.0.5:50051", ...]``.

    Raises:
        ValueError: ``urls`` is empty or names a worker twice.
    """

    def __init__(self, urls: list[str]) -> None:
        urls = list(urls)
        if not urls:
            msg = "StaticWorkerResolver needs at least one worker URL"
            raise ValueError(msg)
        if len(set(urls)) != len(urls):
            msg = f"worker URLs must be distinct, got {urls}"
            raise ValueError(msg)
        self._urls = urls

    def get_urls(self) -> list[str]:
        """The URLs given at construction."""
        return list(self._urls)

    def __repr__(self) -> str:
        return f"StaticWorkerResolver({self._urls!r})"


class DynamicWorkerResolver:
    """Worker URLs refreshed in a background thread from a user callable.

    ``fetch()`` may be slow (a DNS lookup, a file on a shared volume, a
    Kubernetes API call): it runs every ``interval_s`` seconds on a daemon
    thread, and :meth:`get_urls` returns the last successful result at once.
    A failing ``fetch`` keeps the previous list (the error is logged and kept in
    :attr:`last_error`). A worker added to what ``fetch`` returns is used by the
    next query planned after the refresh; a removed one by no later query.

    Kubernetes: run the workers as a Deployment behind a *headless* Service
    (``clusterIP: None``), so the Service name resolves to every ready pod's IP,
    and resolve it here::

        import socket
        from distfusion.runtime.resolver import DynamicWorkerResolver

        def k8s_workers() -> list[str]:
            infos = socket.getaddrinfo("distfusion-workers.default.svc.cluster.local",
                                       50051, proto=socket.IPPROTO_TCP)
            return sorted({f"grpc://{info[4][0]}:50051" for info in infos})

        resolver = DynamicWorkerResolver(k8s_workers, interval_s=5.0)

    (Or list the Service's EndpointSlices with the ``kubernetes`` client.)
    Start the workers with ``--host 0.0.0.0`` (pods are reached by pod IP),
    the same ``DISTFUSION_TOKEN`` everywhere, and make sure workers can reach
    each other: consumer tasks read their inputs directly from producer workers.

    Args:
        fetch: returns the current worker URLs; called on the refresh thread only.
        interval_s: seconds between refreshes.
        initial_timeout_s: the constructor waits this long for the first
            ``fetch`` to finish (so the first query sees workers); 0 does not wait.

    Example:
        >>> r = DynamicWorkerResolver(lambda: ["grpc://127.0.0.1:50051"], interval_s=60)
        >>> r.get_urls()
        ['grpc://127.0.0.1:50051']
        >>> r.close()
    """

    def __init__(
        self,
        fetch: Callable[[], list[str]],
        interval_s: float = 5.0,
        initial_timeout_s: float = 10.0,
    ) -> None:
        if interval_s <= 0:
            msg = f"interval_s must be positive, got {interval_s}"
            raise ValueError(msg)
        self._fetch = fetch
        self.interval_s = interval_s
        self._urls: list[str] = []
        self.last_error: BaseException | None = None
        self._first = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distfusion-resolver", daemon=True)
        self._thread.start()
        self._first.wait(initial_timeout_s)

    def get_urls(self) -> list[str]:
        """The URLs of the last successful refresh (empty before the first); never blocks."""
        return list(self._urls)

    def refresh(self, timeout_s: float = 10.0) -> list[str]:
        """Ask for a refresh now and wait (at most ``timeout_s`` seconds) for it."""
        self._first.clear()
        self._wake.set()
        self._first.wait(timeout_s)
        return self.get_urls()

    def close(self) -> None:
        """Stop the refresh thread."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=max(5.0, self.interval_s))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                urls = list(dict.fromkeys(str(u) for u in self._fetch()))
                self._urls = urls  # one reference swap: readers never see a partial list
                self.last_error = None
            except Exception as exc:  # keep the last good list
                self.last_error = exc
                log.warning(
                    "worker resolver refresh failed, keeping %d URLs: %s", len(self._urls), exc
                )
            self._first.set()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def __repr__(self) -> str:
        fetch = getattr(self._fetch, "__name__", self._fetch)
        return f"DynamicWorkerResolver({fetch!r}, urls={self._urls!r})"


class SparkWorkerResolver:
    """The task slots of a Spark application, as worker URLs.

    Spark places the tasks itself, so the URLs only count and name the slots
    the planner may fill: in local mode one per core (``spark-local://0``,
    ...); on a cluster one per executor core
    (``spark-executor://ID#slot``), ``sc.defaultParallelism`` in all
    (Spark's total executor cores unless ``spark.default.parallelism`` says
    otherwise). Each call asks the driver's JVM (a local py4j call, no network),
    so it returns at once and follows executors that come and go.

    Args:
        spark_context: the application's ``SparkContext``.
    """

    def __init__(self, spark_context) -> None:
        self.sc = spark_context

    def executors(self) -> list[str]:
        """The ids of the registered executors (the driver excluded; empty in local mode)."""
        # pyspark lists no executors: the JVM SparkContext does
        ids = self.sc._jsc.sc().getExecutorIds()  # noqa: SLF001
        return sorted((str(ids.apply(i)) for i in range(ids.size())), key=lambda x: (len(x), x))

    def get_urls(self) -> list[str]:
        """One URL per task slot; empty when a cluster has no executor yet."""
        slots = int(self.sc.defaultParallelism)
        if self.sc.master.startswith("local"):
            return [f"spark-local://{i}" for i in range(slots)]
        executors = self.executors()
        if not executors:
            return []
        n = len(executors)
        return [f"spark-executor://{executors[i % n]}#{i // n}" for i in range(slots)]

    def wait_for_executors(self, count: int, timeout_s: float) -> None:
        """Block until ``count`` executors registered (a cluster starts them after the driver).

        Raises:
            PlanningError: fewer than ``count`` executors after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while len(self.executors()) < count:
            if time.monotonic() > deadline:
                msg = (
                    f"Spark master {self.sc.master} gave this application "
                    f"{len(self.executors())} executors after {timeout_s:g} s, expected {count}"
                )
                raise PlanningError(msg)
            time.sleep(0.2)

    def __repr__(self) -> str:
        return f"SparkWorkerResolver(master={self.sc.master!r})"
