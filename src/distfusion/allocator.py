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

Whole blocks of mimalloc's arenas that a query frees go back at once
(``MIMALLOC_ARENA_PURGE_MULT=0``; mimalloc's default keeps them 10 purge delays):
a hash table that grows by doubling frees blocks it never reuses, and kept,
they took a 256 MiB-per-task budget to 2.6 GiB of resident memory, not 1.5
(TPC-H SF10 Q18, docs/memory.md). :func:`keep_freed_memory` sets both.
Source: mimalloc's options, https://microsoft.github.io/mimalloc/group__options.html
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = [
    "ARENA_PURGE_MULT",
    "ARENA_PURGE_MULT_VAR",
    "PURGE_DELAY_MS",
    "PURGE_DELAY_VAR",
    "keep_freed_memory",
]

PURGE_DELAY_VAR = "MIMALLOC_PURGE_DELAY"
"""mimalloc's option: milliseconds before freed memory goes back to the OS."""

PURGE_DELAY_MS = 600_000
"""distfusion's default for :data:`PURGE_DELAY_VAR`: 10 minutes."""

ARENA_PURGE_MULT_VAR = "MIMALLOC_ARENA_PURGE_MULT"
"""mimalloc's option: how many purge delays a freed arena block waits before it goes back."""

ARENA_PURGE_MULT = 0
"""distfusion's default for :data:`ARENA_PURGE_MULT_VAR`: at once."""


def keep_freed_memory(env: MutableMapping[str, str] | None = None) -> None:
    """Set distfusion's mimalloc options in ``env``, each unless it is set already.

    :data:`PURGE_DELAY_VAR` to :data:`PURGE_DELAY_MS`, :data:`ARENA_PURGE_MULT_VAR`
    to :data:`ARENA_PURGE_MULT`.

    Args:
        env: the environment to set it in (``os.environ`` when None; a
            SparkContext's ``environment`` for its Python workers).
    """
    env = os.environ if env is None else env
    env.setdefault(PURGE_DELAY_VAR, str(PURGE_DELAY_MS))
    env.setdefault(ARENA_PURGE_MULT_VAR, str(ARENA_PURGE_MULT))


keep_freed_memory()
