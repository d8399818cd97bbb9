"""Memory budgets of tasks and the disk they spill to.

Every task runs DataFusion with a bounded memory pool (a fair spill pool of
``memory_per_task_bytes`` when set, else a greedy pool of the worker's default:
:func:`~distfusion.worker.execute_task.task_context`) and a disk manager
writing under a directory of its query, so sorts, aggregates and joins spill
to disk instead of growing without limit::

    spill root (a worker's own directory, made on first use)
      └── <query id>/                 made when a task of the query starts;
            ├── datafusion-XXXX/      DataFusion's spill files (its disk manager)
            └── s1-t0-p3.arrow        task outputs a worker spilled (Arrow IPC files)

The query's directory is deleted when the query ends, fails or is cancelled
(``Worker.cancel_query``, which every runtime calls at the end of a query, and
the Flight worker's time-to-live), and the whole root when the worker closes.

Where a default budget comes from (``DistributedConfig.memory_per_task_bytes``
None):

- local and Flight workers: :func:`default_memory_per_task_bytes` -- half of
  the machine's memory (the cgroup limit when lower), shared by the task slots
  of every worker of the process; a Flight worker's ``--memory`` sets the
  total instead.
- Spark: :func:`spark_memory_per_task_bytes` -- ``spark.executor.pyspark.memory``
  (the Python workers' own limit) when set, else ``spark.executor.memory`` on a
  cluster and, in local mode, half of the machine as for local workers (the
  Python workers are not in the JVM's heap), divided by one executor's slots.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass

__all__ = [
    "MIN_TASK_MEMORY_BYTES",
    "SpillDirs",
    "TaskMemory",
    "default_memory_per_task_bytes",
    "is_running",
    "machine_memory_bytes",
    "parse_bytes",
    "remove_stale_roots",
    "root_owner",
    "spark_memory_per_task_bytes",
]

GIB = 1024**3
MIB = 1024**2

MIN_TASK_MEMORY_BYTES = 16 * MIB
"""Smallest default budget of a task (a budget given explicitly may be smaller).

DataFusion reserves ``sort_spill_reservation_bytes`` (10 MiB) per sort for
merging its spill files; a smaller pool fails sorts instead of spilling them.
"""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
    "t": 1024 * GIB,
    "tb": 1024 * GIB,
    "tib": 1024 * GIB,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, default_unit: str = "") -> int:
    """A size as bytes: ``"256MiB"``, ``"4g"`` (Spark's JVM form), ``"1.5GB"``, ``1024``.

    Units are powers of 1024 (``k``, ``m``, ``g``, ``t``, with or without
    ``b``/``ib``); case is ignored.

    Args:
        text: the size.
        default_unit: the unit of a bare number (Spark's ``spark.executor.memory``
            takes MiB: ``"m"``); bytes by default.

    Raises:
        ValueError: ``text`` is not a size, or is not positive.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), default_unit
    else:
        m = _SIZE.match(str(text))
        if m is None or m.group(2).lower() not in _UNITS:
            msg = f"not a size in bytes: {text!r} (examples: 268435456, 256MiB, 4g)"
            raise ValueError(msg)
        value, unit = float(m.group(1)), m.group(2) or default_unit
    n = int(value * _UNITS[unit.lower()])
    if n <= 0:
        msg = f"a size must be positive, got {text!r}"
        raise ValueError(msg)
    return n


def machine_memory_bytes() -> int:
    """Physical memory of this machine, or the cgroup's limit when lower, in bytes.

    Falls back to 8 GiB when the platform does not say.
    """
    total = 8 * GIB
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and 0 < int(raw) < total:
            total = int(raw)
    return total


def default_memory_per_task_bytes(concurrent_tasks: int, total_bytes: int | None = None) -> int:
    """Default budget of one task when ``concurrent_tasks`` run at once, in bytes.

    ``total_bytes`` (default: half of :func:`machine_memory_bytes`, leaving the
    rest to the coordinator, the outputs held and the page cache) shared
    equally, at least :data:`MIN_TASK_MEMORY_BYTES`.
    """
    total = machine_memory_bytes() // 2 if total_bytes is None else total_bytes
    return max(MIN_TASK_MEMORY_BYTES, total // max(1, concurrent_tasks))


def spark_memory_per_task_bytes(conf: dict[str, str], slots_per_executor: int) -> int:
    """Default budget of one Spark task from the application's settings, in bytes.

    ``spark.executor.pyspark.memory`` (the Python workers' own limit) when set.
    Else, on a cluster, ``spark.executor.memory``; in local mode (``spark.master``
    ``local...``) half of the machine as :func:`default_memory_per_task_bytes`
    gives local workers: the Python workers are processes of their own, not in
    the JVM heap that ``spark.driver.memory`` sizes (deriving it from the
    embedded session's 4g made large queries spill: docs/benchmarks.md, "Spark
    stage outputs"). Divided by ``slots_per_executor`` (``spark.executor.cores``,
    or the local mode's threads); at least :data:`MIN_TASK_MEMORY_BYTES`. Bare
    numbers are MiB, as in Spark.

    Raises:
        ValueError: a memory setting is not a size.
    """
    local = conf.get("spark.master", "local").startswith("local")
    raw = conf.get("spark.executor.pyspark.memory")
    if raw is None and local:
        return default_memory_per_task_bytes(slots_per_executor)
    total = parse_bytes(raw or conf.get("spark.executor.memory", "1g"), default_unit="m")
    return max(MIN_TASK_MEMORY_BYTES, total // max(1, slots_per_executor))


@dataclass(frozen=True)
class TaskMemory:
    """How one task may use memory and disk.

    Attributes:
        pool_bytes: DataFusion's memory pool, bytes (fair or greedy:
            :func:`~distfusion.worker.execute_task.task_context`); None: unbounded.
        spill_dir: where DataFusion writes spill files (a directory of the
            query, see :class:`SpillDirs`); None: the system's temp directory.
    """

    pool_bytes: int | None = None
    spill_dir: str | None = None


class SpillDirs:
    """A worker's spill directories: one root, one subdirectory per query.

    The root is named after the process (``distfusion-spill-<pid>-XXXX``). A
    process that was killed (a Flight worker stopped with SIGKILL, a Spark
    Python worker, which exits without running finalizers) cannot delete its
    own: making a root deletes the roots in the same parent whose process no
    longer runs, as Spark's executors clean their old local directories.

    Args:
        parent: where the root is made (``tempfile.mkdtemp(dir=parent)``);
            None: the system's temp directory (``$TMPDIR``).
    """

    def __init__(self, parent: str | None = None) -> None:
        self.parent = parent
        self._root: str | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def root(self) -> str:
        """This worker's own directory (made on first use).

        Raises:
            OSError: :meth:`close` was called (a task ending after its worker
                closed makes no directory that nothing would delete).
        """
        with self._lock:
            if self._closed:
                msg = "the worker's spill directories were closed"
                raise OSError(msg)
            if self._root is None:
                if self.parent:
                    os.makedirs(self.parent, exist_ok=True)
                prefix = f"{_ROOT_PREFIX}{os.getpid()}-"
                self._root = tempfile.mkdtemp(prefix=prefix, dir=self.parent)
                remove_stale_roots(os.path.dirname(self._root))
                # Also deleted at interpreter exit (a Spark Python worker is never closed).
                self._finalizer = weakref.finalize(self, shutil.rmtree, self._root, True)
            return self._root

    def query_dir(self, query_id: str) -> str:
        """The directory of ``query_id`` (made now when missing).

        Raises:
            OSError: it cannot be made (disk full, no permission).
        """
        path = os.path.join(self.root, _safe(query_id))
        os.makedirs(path, exist_ok=True)
        return path

    def remove_query(self, query_id: str) -> None:
        """Delete the directory of ``query_id`` and every file in it. Idempotent."""
        with self._lock:
            root = self._root
        if root is not None:
            shutil.rmtree(os.path.join(root, _safe(query_id)), ignore_errors=True)

    def files(self) -> list[str]:
        """Every file under the root now (paths), for tests and stats."""
        with self._lock:
            root = self._root
        if root is None:
            return []
        return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]

    def close(self) -> None:
        """Delete the root and everything under it; make no more. Idempotent."""
        with self._lock:
            root, self._root = self._root, None
            self._closed = True
        if root is not None:
            self._finalizer.detach()
            shutil.rmtree(root, ignore_errors=True)


_ROOT_PREFIX = "distfusion-spill-"
_ROOT = re.compile(rf"^{_ROOT_PREFIX}(\d+)-")


def is_running(pid: int) -> bool:
    """Whether process ``pid`` runs (or exists as another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # no permission: it runs, as another user
        return True
    return True


def root_owner(name: str) -> int | None:
    """The pid in a spill root's name (``distfusion-spill-<pid>-...``); None: not a root."""
    m = _ROOT.match(name)
    return int(m.group(1)) if m else None


def remove_stale_roots(parent: str) -> list[str]:
    """Delete the spill roots in ``parent`` whose process no longer runs.

    Only roots named ``distfusion-spill-<pid>-...`` (:class:`SpillDirs`) are
    considered; one whose process runs (or whose pid was reused) is kept.

    Returns:
        The directories deleted.
    """
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        owner = root_owner(name)
        if owner is not None and not is_running(owner):
            path = os.path.join(parent, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _safe(query_id: str) -> str:
    """``query_id`` usable as one path component (UUIDs pass unchanged)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", query_id) or "_"
