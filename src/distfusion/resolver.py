"""Worker resolvers: where the workers are.

A resolver is asked twice per query: during planning (how many workers exist;
that number caps the tasks of every stage) and right before execution (each
task is assigned a URL). Note how :meth:`WorkerResolver.get_urls` is not async
and must return at once: any slow discovery (a DNS lookup, a Kubernetes API
call) must happen on a background thread, as in datafusion-distributed's
``WorkerResolver``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["WorkerResolver", "StaticWorkerResolver", "SparkWorkerResolver"]


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
        ids = self.sc._jsc.sc().getExecutorIds()
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
        import time

        from distfusion.errors import PlanningError

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
