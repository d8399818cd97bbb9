"""Small tables in a single-node DataFusion context, and their Substrait plans."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext


@pytest.fixture(scope="package")
def ctx(tmp_path_factory) -> SessionContext:
    """t(k, v, s): 4 rows with a NULL key; u(k, w): 3 rows; p: t as a Parquet file.

    A Parquet scan takes filters pushed down (``ReadRel.filter``); a memory table does not.
    """
    ctx = SessionContext()
    t = pa.record_batch(
        {
            "k": pa.array([1, 2, 3, None], pa.int64()),
            "v": [1.5, 2.5, 3.5, 4.5],
            "s": ["a", "b", "c", "d"],
        }
    )
    u = pa.record_batch({"k": pa.array([1, 3, 5], pa.int64()), "w": ["x", "y", "z"]})
    ctx.register_record_batches("t", [[t]])
    ctx.register_record_batches("u", [[u]])
    path = tmp_path_factory.mktemp("p") / "p.parquet"
    pq.write_table(pa.Table.from_batches([t]), path)
    ctx.register_parquet("p", str(path))
    return ctx
