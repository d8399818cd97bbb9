"""Every ```python block of every docs/ page runs as written (issue 41, item 15).

The blocks of one page run in order in one namespace, as a reader pasting
them one after the other would, in a temporary directory, with the
replacements of tests/test_docs.py (``data/tpch-sf1`` and ``data/tpch-sf0.1``
-> the test data, TPC-H SF0.1; ``"out/"`` -> a directory of the test) and:

- the test S3 server (tests/s3_server.py) for a block that reads ``s3://lake``
  without starting a server of its own: a bucket ``lake`` holding
  ``tpch/lineitem/`` and a Delta table ``events`` (versions 0 to 3), the
  store's ``region="eu-west-1"`` replaced by the server's endpoint, and
  ``AWS_ENDPOINT_URL`` set to it for what makes its store from the
  environment (delta-rs, a URL without a registered store);
- the test session's SparkSession, active, for a page that uses Spark
  (``SparkSession.builder.getOrCreate()`` returns it; ``DistributedContext()``
  runs on it); the temp views a page makes are dropped after it;
- a pyiceberg catalog ``prod`` (a SQL catalog in the test's directory, holding
  ``db.trips`` with a snapshot of January 2026) for ``load_catalog("prod")``.

A block that cannot run here (a remote cluster, a template, a block that
shows a DataFusion panic) follows a ``<!-- no-run: why -->`` line: it is only
compiled, and the test fails when the reason is missing.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_docs import Block, _localized, code_blocks, release

PAGES = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "docs").glob("*.md")
    if any(b.lang == "python" for b in code_blocks(str(p.relative_to(REPO))))
)
LAKE = "lake"
OWN_SERVER = ("ThreadedMotoServer", "S3Server(")
DOC_REGION = 'region="eu-west-1"'
JANUARY = datetime(2026, 1, 15, tzinfo=UTC)


def _python_blocks(page: str) -> list[Block]:
    return [b for b in code_blocks(page) if b.lang == "python"]


def test_every_block_that_does_not_run_says_why():
    skipped = [b for page in PAGES for b in _python_blocks(page) if not b.runs]
    unexplained = [b.id for b in skipped if not b.reason.strip()]
    assert not unexplained, f"<!-- no-run: why --> needs its reason: {unexplained}"
    # Rare by design: a page's examples are what a reader copies first.
    assert len(skipped) <= 5, [b.id for b in skipped]


def _needs_lake(code: str) -> bool:
    return f"s3://{LAKE}" in code and not any(s in code for s in OWN_SERVER)


@pytest.fixture(scope="module")
def lake(s3_server, tpch_dir) -> str:
    """The test S3 server with bucket ``lake``: TPC-H lineitem and a Delta table of 4 versions."""
    import pyarrow as pa
    from deltalake import write_deltalake

    s3_server.create_bucket(LAKE)
    s3_server.upload_dir(tpch_dir / "lineitem", LAKE, "tpch/lineitem")
    options = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true"}
    rows = pa.table({"id": list(range(10)), "region": ["EU", "US"] * 5})
    for version in range(4):
        mode = "overwrite" if version == 0 else "append"
        write_deltalake(f"s3://{LAKE}/events", rows, mode=mode, storage_options=options)
    return s3_server.endpoint


def _iceberg_prod(tmp_path: Path, monkeypatch) -> None:
    """``load_catalog("prod")``: a SQL catalog in ``tmp_path`` with ``db.trips``.

    Two snapshots: one of :data:`JANUARY`, one of now.
    """
    import pyarrow as pa
    import pyiceberg.catalog
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.utils.config import Config

    where = tmp_path / "prod"
    where.mkdir()
    settings = {"type": "sql", "uri": f"sqlite:///{where}/c.db", "warehouse": f"file://{where}"}
    for key, value in settings.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__PROD__{key.upper()}", value)
    # pyiceberg reads its environment once, when imported
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
    catalog = SqlCatalog("prod", **settings)
    catalog.create_namespace("db")
    trips = pa.table({"city": ["Oslo", "Rome", "Oslo"], "distance_km": [3.5, 7.25, 12.0]})
    table = catalog.create_table("db.trips", schema=trips.schema)
    with monkeypatch.context() as then:  # a snapshot of January, for as_of=datetime(2026, 2, 1)
        then.setattr(time, "time", lambda: JANUARY.timestamp())
        table.append(trips)
    table.append(trips)


@pytest.mark.parametrize("page", PAGES)
def test_the_blocks_of_a_page_run(page, request, tpch_dir, tmp_path, monkeypatch, capsys):
    blocks = _python_blocks(page)
    text = "".join(b.code for b in blocks if b.runs)
    if any(_needs_lake(b.code) for b in blocks if b.runs):
        endpoint = request.getfixturevalue("lake")
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    spark = None
    if re.search(r"SparkSession|DistributedContext\(\)", text):
        spark = request.getfixturevalue("spark_session")
    if 'load_catalog("prod")' in text:
        _iceberg_prod(tmp_path, monkeypatch)
    views = re.findall(r"createOrReplaceTempView\(\s*[\"']([^\"']+)[\"']", text)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    try:
        for block in blocks:
            code = _localized(block.code, tpch_dir, tmp_path)
            code = code.replace('"data/tpch-sf0.1"', repr(str(tpch_dir)))
            if block.runs and _needs_lake(block.code):
                endpoint = request.getfixturevalue("lake")
                code = code.replace(DOC_REGION, f"endpoint={endpoint!r}, allow_http=True")
            compiled = compile(code, block.id, "exec")
            if block.runs:
                exec(compiled, namespace)
    finally:
        release(namespace, spark, views)
    if "print(" in text:
        assert capsys.readouterr().out.strip(), "the page's examples printed nothing"
