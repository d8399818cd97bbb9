"""The documentation: the site builds without a warning, and the README's examples run.

Conventions of the examples (docs/testing.md, "The docs"):

- every ```python block of :data:`RUNNABLE_DOCS` runs on its own, in a temporary
  directory, with ``data/tpch-sf1`` replaced by the test data (TPC-H SF0.1,
  ``tpch_dir``), ``src/distfusion/`` by the package's directory and the output
  directory ``"out/"`` by one in the temporary directory (Spark's JVM does not
  share Python's working directory); the test session's SparkSession is active
  for blocks that use Spark;
- every line starting with ``distfusion `` of a ```bash block runs as a command
  there, with the same replacements;
- a block that opens a Spark Connect session (``.remote("sc://localhost:15002")``)
  runs in a Python process of its own (a Connect session switches the process's
  ``pyspark.sql`` to Connect) against the Connect service of the test session's
  Spark application;
- a block right after a ``<!-- no-run -->`` line (or ``<!-- no-run: why -->``,
  the form docs/ pages must use) needs a real cluster, store or catalog: a
  Python one is only compiled.

The blocks of docs/ pages run in tests/test_docs_blocks.py.
"""

from __future__ import annotations

import gc
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import distfusion
from tests.conftest import REPO

RUNNABLE_DOCS = ("README.md",)
NO_RUN = "<!-- no-run -->"
NO_RUN_LINE = re.compile(r"^<!-- no-run(?::\s*(?P<reason>.*?))?\s*-->$")
"""The marker of a block that does not run, with an optional reason after a colon."""
CONNECT_URL = "sc://localhost:15002"
PACKAGE = REPO / "src" / "distfusion"


@dataclass(frozen=True)
class Block:
    """A fenced code block of a Markdown file."""

    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    runs: bool  # False: marked no-run
    reason: str = ""  # why not, from ``<!-- no-run: why -->``

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def code_blocks(path: str) -> list[Block]:
    """The fenced blocks of ``path`` (relative to the repository), in order."""
    lines = (REPO / path).read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        marker = NO_RUN_LINE.match(lines[start - 1].strip()) if start > 0 else None
        code = "\n".join(body) + "\n"
        reason = (marker.group("reason") or "") if marker else ""
        blocks.append(Block(path, start + 1, fence.group(1), code, marker is None, reason))
        i += 1
    return blocks


def _blocks(lang: str) -> list[Block]:
    return [b for path in RUNNABLE_DOCS for b in code_blocks(path) if b.lang == lang]


def _localized(text: str, tpch_dir: Path, tmp_path: Path) -> str:
    text = text.replace("data/tpch-sf1", str(tpch_dir)).replace("src/distfusion/", f"{PACKAGE}/")
    return text.replace('"out/"', repr(f"{tmp_path}/out/"))


def release(namespace: dict, spark, views: list[str]) -> None:
    """What examples run in ``namespace`` left: contexts closed, Spark's temp ``views`` dropped."""
    for value in namespace.values():
        if isinstance(value, distfusion.DistributedContext):
            value.close()
    namespace.clear()
    gc.collect()  # a SparkDataFrame's held outputs are released when it is collected
    if spark is not None:
        for view in views:
            spark.catalog.dropTempView(view)


def _commands(block: Block) -> list[str]:
    """The ``distfusion`` command lines of a bash block (continued lines joined)."""
    joined = block.code.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("distfusion ")]


def test_the_readme_starts_with_the_two_commands_and_marks_its_blocks():
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "make run" in head and "make test" in head
    blocks = code_blocks("README.md")
    assert any(b.lang == "python" and b.runs for b in blocks)
    assert any(b.lang == "bash" and b.runs and _commands(b) for b in blocks)
    # The marker must sit right before a fence, or it would silently mark nothing.
    text = (REPO / "README.md").read_text().splitlines()
    for n, line in enumerate(text):
        if NO_RUN_LINE.match(line.strip()):
            assert text[n + 1].startswith("```"), f"README.md:{n + 1}: {NO_RUN} not before a fence"


# Pages the README links to that another branch writes (a link to a page that
# exists is checked like any other).
PENDING_PAGES = {"docs/dataframe.md"}


def test_the_readme_links_to_files_that_exist():
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to no page"
    missing = [t for t in local if not (REPO / t).exists() and t not in PENDING_PAGES]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_docs_site_builds_without_a_warning(tmp_path):
    """``mkdocs build --strict`` passes, and every export has an API reference entry.

    Broken links or anchors, pages missing from the navigation and docstrings
    griffe cannot read all fail the build.
    """
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "WARNING" not in output, output[-5000:]
    api = " ".join(p.read_text() for p in (site / "api").rglob("index.html"))
    missing = [
        name
        for name in distfusion.__all__
        if not re.search(rf'id="distfusion\.[\w.]*\b{name}"', api)
    ]
    assert not missing, f"exported but not in the API reference (docs/api/): {missing}"


@pytest.mark.parametrize("block", _blocks("python"), ids=lambda b: b.id)
def test_python_blocks_run(block, request, tpch_dir, tmp_path, monkeypatch, capsys):
    code = _localized(block.code, tpch_dir, tmp_path)
    compiled = compile(code, block.id, "exec")
    if not block.runs:
        return  # needs a cluster, a store or a catalog: valid Python is all we check
    if CONNECT_URL in code:
        _run_on_spark_connect(code, request, tmp_path)
        return
    spark = None
    if "sparksession" in code.lower():
        spark = request.getfixturevalue("spark_session")  # the active session getOrCreate returns
    # Views the example makes are dropped after it (listing the catalog would
    # create a spark-warehouse directory).
    views = re.findall(r"createOrReplaceTempView\(\s*[\"']([^\"']+)[\"']", code)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    try:
        exec(compiled, namespace)
    finally:
        release(namespace, spark, views)
    if "print(" in block.code:
        assert capsys.readouterr().out.strip(), "the example printed nothing"


def _run_on_spark_connect(code: str, request, tmp_path: Path) -> None:
    """Run ``code`` in a new interpreter against the test application's Connect service."""
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (the test extra)")
    from distfusion.runtime.spark.connect_server import start_connect_server

    url = start_connect_server(request.getfixturevalue("spark_session"))
    done = subprocess.run(
        [sys.executable, "-c", code.replace(CONNECT_URL, url)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if "print(" in code:
        assert done.stdout.strip(), "the example printed nothing"


@pytest.mark.parametrize(
    "block", [b for b in _blocks("bash") if b.runs and _commands(b)], ids=lambda b: b.id
)
def test_cli_examples_run(block, tpch_dir, tmp_path):
    executable = Path(sys.executable).with_name("distfusion")
    prefix = [str(executable)] if executable.exists() else [sys.executable, "-m", "distfusion"]
    for command in _commands(block):
        args = shlex.split(_localized(command, tpch_dir, tmp_path), comments=True)
        done = subprocess.run(
            prefix + args[1:], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        output = re.search(r"--output\s+(\S+)", command)
        if output and output.group(1).endswith("/"):
            written = list((tmp_path / output.group(1)).glob("*.parquet"))
            assert written and (tmp_path / output.group(1) / "_SUCCESS").exists()
        else:
            assert done.stdout.strip(), command
