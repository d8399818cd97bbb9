"""distfusion keeps freed memory in the process for 10 minutes (distfusion.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

from distfusion.allocator import PURGE_DELAY_MS, PURGE_DELAY_VAR


def _delay_after_import(env: dict[str, str]) -> str:
    code = f"import distfusion, os; print(os.environ[{PURGE_DELAY_VAR!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_distfusion_sets_mimallocs_purge_delay_unless_the_user_did():
    env = {k: v for k, v in os.environ.items() if k != PURGE_DELAY_VAR}
    assert _delay_after_import(env) == str(PURGE_DELAY_MS)
    assert _delay_after_import({**env, PURGE_DELAY_VAR: "10"}) == "10"
