"""Errors that name their cause and say what to do (issue 41, items 8 to 12).

Each test provokes the failure with real parts (a real child process, real
files, a real SparkSession, Flight workers on 127.0.0.1) and checks the
message names what went wrong, in time.
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from distfusion.testing.s3_server import S3Server

# A sitecustomize for a child Python: moto cannot be imported there, as when
# the test extra is not installed.
_WITHOUT_MOTO = textwrap.dedent(
    """
    import sys

    class _NoMoto:
        def find_spec(self, name, path=None, target=None):
            if name == "moto" or name.startswith("moto."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoMoto())
    """
)


# ------------------------------------------------------------- item 11: S3Server without moto
def test_the_s3_test_server_without_moto_says_so_and_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(_WITHOUT_MOTO)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    start = time.monotonic()
    with pytest.raises(ImportError) as caught:
        S3Server(timeout_s=60)
    assert time.monotonic() - start < 30
    message = str(caught.value)
    assert "No module named 'moto'" in message
    assert "pip install 'distfusion[test]'" in message
