"""The runnable example of docs/object-stores.md runs as written (against the test data)."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_the_local_s3_example_runs(tpch_dir, monkeypatch, capsys):
    text = (REPO / "docs" / "object-stores.md").read_text()
    section = text.split("## Runnable example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    code = code.replace('"data/tpch-sf0.1"', repr(str(tpch_dir)))
    monkeypatch.chdir(REPO)
    exec(compile(code, "docs/object-stores.md", "exec"), {})
    out = capsys.readouterr().out
    assert "l_returnflag" in out and "sum_qty" in out
