"""Shuffles by keys of every type the hash handles, on every runtime.

A shuffled ``GROUP BY`` of a ``Time32``/``Time64`` column failed on the task
("Unsupported data type in hasher": Spark's ``xxhash64`` has no time kernel) and
one of a ``BinaryView`` column failed splitting the output (pyarrow has no
``take`` for binary views). Joins are forced to shuffle (no broadcast).

A shuffle straight out of Parquet scans panicked on a file whose statistics
make the key constant (one value, or only NULLs): DataFusion pushed the hash
into the scan, which gives such a column as a scalar (docs/datafusion-bugs.md).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext

from distfusion import DistributedConfig, DistributedContext
from tests.compare import assert_same_result

N = 60
T = pa.table(
    {
        "t32s": pa.array([i % 7 for i in range(N)], pa.time32("s")),
        "t32ms": pa.array([i % 5 * 1000 for i in range(N)], pa.time32("ms")),
        "t64us": pa.array([i % 6 * 10**6 for i in range(N)], pa.time64("us")),
        "t64ns": pa.array([None if i % 9 == 0 else i % 4 for i in range(N)], pa.time64("ns")),
        "bv": pa.array([bytes([i % 3, 0]) for i in range(N)], pa.binary_view()),
        "lb": pa.array([bytes([i % 4]) for i in range(N)], pa.large_binary()),
        "sv": pa.array([f"s{i % 5}" for i in range(N)], pa.string_view()),
        "v": list(range(N)),
    }
)
KEYS = ["t32s", "t32ms", "t64us", "t64ns", "bv", "lb", "sv"]


def _contexts(runtime, workers) -> tuple[DistributedContext, SessionContext]:
    oracle = SessionContext()
    oracle.register_record_batches("t", [T.to_batches()])
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    ctx.register_table("t", T, max_rows_per_unit=7)
    return ctx, oracle


@pytest.mark.parametrize("key", KEYS)
def test_group_by_and_join_on_key_type(runtime, workers, key):
    ctx, oracle = _contexts(runtime, workers)
    for sql in (
        f"SELECT {key}, sum(v) AS s, count(DISTINCT v) AS d FROM t GROUP BY {key}",
        f"SELECT a.{key}, count(*) AS c FROM t a JOIN t b ON a.{key} = b.{key} "
        f"WHERE a.v < 20 GROUP BY a.{key}",
    ):
        expected = oracle.sql(sql).to_arrow_table()
        assert_same_result(ctx.sql(sql).to_arrow_table(), expected, ordered=False)


def test_shuffles_of_parquet_files_whose_key_is_constant_in_a_file(runtime, workers, tmp_path):
    files = {
        "f": [[1, 2, 3], [4, 4, 4], [None, None], [5, 6, None]],
        "d": [[4, 4], [None, None, None], [1, 5, 7]],
    }
    oracle = SessionContext()
    config = DistributedConfig(tasks_per_stage=workers, broadcast_threshold_bytes=0)
    ctx = DistributedContext(runtime=runtime, config=config)
    for name, parts in files.items():
        (tmp_path / name).mkdir()
        for i, keys in enumerate(parts):
            table = pa.table({"k": pa.array(keys, pa.int64()), "s": [f"{name}{i}"] * len(keys)})
            pq.write_table(table, tmp_path / name / f"part-{i}.parquet")
        oracle.register_parquet(name, str(tmp_path / name))
        ctx.register_parquet(name, str(tmp_path / name))
    for sql in (
        "SELECT f.k, f.s, d.s AS t FROM f FULL JOIN d ON f.k = d.k",
        "SELECT f.k, f.s, d.s AS t FROM f JOIN d ON f.k = d.k AND f.s < d.s",
    ):
        expected = oracle.sql(sql).to_arrow_table()
        assert_same_result(ctx.sql(sql).to_arrow_table(), expected, ordered=False)
