"""distfusion keeps freed memory in the process for 10 minutes, but not whole arena blocks (distfusion.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

from distfusion.allocator import (
    ARENA_PURGE_MULT,
    ARENA_PURGE_MULT_VAR,
    PURGE_DELAY_MS,
    PURGE_DELAY_VAR,
)


def _after_import(env: dict[str, str], var: str = PURGE_DELAY_VAR) -> str:
    code = f"import distfusion, os; print(os.environ[{var!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_distfusion_sets_mimallocs_options_unless_the_user_did():
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY_VAR, ARENA_PURGE_MULT_VAR)}
    assert _after_import(env) == str(PURGE_DELAY_MS)
    assert _after_import({**env, PURGE_DELAY_VAR: "10"}) == "10"
    assert _after_import(env, ARENA_PURGE_MULT_VAR) == str(ARENA_PURGE_MULT)
    assert _after_import({**env, ARENA_PURGE_MULT_VAR: "10"}, ARENA_PURGE_MULT_VAR) == "10"


_FAULTS = """
import resource
import distfusion  # noqa: F401  (first, as a user's program would)
from datafusion import SessionContext

ctx = SessionContext()
sql = (
    "SELECT count(*) FROM (SELECT value % 3000000 AS k, sum(value) AS s "
    "FROM range(12000000) GROUP BY 1)"
)
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctx.sql(sql).collect()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults_per_run(env: dict[str, str]) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True
    )
    return [int(line) for line in out.stdout.split()]


def test_datafusion_reuses_what_the_last_query_freed_instead_of_faulting_it_in_again():
    # A hash aggregate of 3 M groups allocates and frees ~100 MB a run. With
    # the delay distfusion sets, DataFusion's mimalloc keeps it: the second and
    # third runs fault in almost nothing. With mimalloc purging at once, each
    # run faults it in again (thousands of faults a run here).
    # Arena blocks go back at once (ARENA_PURGE_MULT): this holds with them.
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY_VAR, ARENA_PURGE_MULT_VAR)}
    kept = _page_faults_per_run(env)
    purged = _page_faults_per_run({**env, PURGE_DELAY_VAR: "0"})
    assert max(kept[1:]) * 10 < min(purged[1:]), (kept, purged)
