"""How long freed memory stays in the process: DataFusion's and pyarrow's allocator, mimalloc.

mimalloc hands freed memory back to the OS 10 ms after it is freed
(``MIMALLOC_PURGE_DELAY``, in milliseconds), and the next query faults it in
again, a page at a time. A distributed query allocates and frees far more
than single-node DataFusion (stage outputs, the Arrow IPC of every boundary):
about 150,000 page faults a run of TPC-H SF10 Q8 on the local runtime, and on
a virtual machine whose host takes freed pages back, those made the query
1.5-2x slower after 20 s idle (docs/memory.md, "Memory the allocators keep
between queries").

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
