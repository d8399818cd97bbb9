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

__all__ = ["WorkerResolver", "StaticWorkerResolver"]


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
