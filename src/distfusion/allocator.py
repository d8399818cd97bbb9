"""How long freed memory stays in the process: DataFusion's and pyarrow's allocator, mimalloc.

mimalloc hands memory a process freed back to the OS 10 ms later
(``MIMALLOC_PURGE_DELAY``, in milliseconds); the next query then takes it
from the OS again, a page fault per 4 KiB page. A distributed query frees
what single-node DataFusion would keep (its stages' outputs, the Arrow IPC
of every boundary), so each query faulted in ~150,000 pages (~600 MB) at
TPC-H SF10 Q8 on the local runtime, against ~20,000 for DataFusion. On a
virtual machine that hands the freed pages to its host after a few seconds
(a balloon's free-page reporting, as on this project's 2-core machine), each
of those faults costs more: SF10 Q8 took 2.4 s back to back and 3.6 s after
20 s idle on the local runtime, 2.9 and 5.5 s on Spark (docs/benchmarks.md).

distfusion keeps freed memory for :data:`PURGE_DELAY_MS` (10 minutes, as long
as the Spark runtime keeps its Python workers warm), where the user has not
set ``MIMALLOC_PURGE_DELAY``: importing this module (``distfusion`` does,
first) sets it in ``os.environ``, which mimalloc reads when the
library holding it loads (import ``distfusion`` before ``datafusion`` and
``pyarrow``, or set the variable yourself), and :class:`SparkRuntime` sets it
in the environment of its executors' Python workers. A process then holds
the memory of its largest query until it allocates again 10 minutes later;
``MIMALLOC_PURGE_DELAY=10`` (mimalloc's default) gives it back at once.
Source: mimalloc's options, https://microsoft.github.io/mimalloc/group__options.html
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["PURGE_DELAY_MS", "PURGE_DELAY_VAR", "keep_freed_memory"]

PURGE_DELAY_VAR = "MIMALLOC_PURGE_DELAY"
"""mimalloc's option: milliseconds before freed memory goes back to the OS."""

PURGE_DELAY_MS = 600_000
"""distfusion's default for :data:`PURGE_DELAY_VAR`: 10 minutes."""


def keep_freed_memory(env: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`PURGE_DELAY_VAR` to :data:`PURGE_DELAY_MS` in ``env`` unless it is set.

    Args:
        env: the environment to set it in (``os.environ`` when None; a
            SparkContext's ``environment`` for its Python workers).
    """
    (os.environ if env is None else env).setdefault(PURGE_DELAY_VAR, str(PURGE_DELAY_MS))


keep_freed_memory()
