"""Small tables for the contract suite: a Parquet directory, tables with a bad row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from distfusion import DistributedConfig, DistributedContext

FILES = 4
ROWS_PER_FILE = 5000
TASKS = 2
"""Tasks per stage of :func:`context` (every runtime has at least two workers here)."""


def write_parquet_dir(path) -> list[str]:
    """FILES Parquet files of ROWS_PER_FILE rows each under ``path``; their paths."""
    path.mkdir()
    files = []
    for i in range(FILES):
        start = i * ROWS_PER_FILE
        table = pa.table(
            {
                "k": pa.array([x % 97 for x in range(start, start + ROWS_PER_FILE)], pa.int64()),
                "v": pa.array([float(x) for x in range(start, start + ROWS_PER_FILE)]),
                "s": pa.array([f"row-{x}" for x in range(start, start + ROWS_PER_FILE)]),
            }
        )
        f = str(path / f"part-{i}.parquet")
        pq.write_table(table, f, row_group_size=1000)
        files.append(f)
    return files


def context(runtime) -> DistributedContext:
    """A context on ``runtime`` with TASKS tasks per stage and table ``t`` (one row per unit)."""
    c = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=TASKS))
    c.register_table(
        "t", pa.table({"k": [1, 2, 3, 4], "v": [1.0, 2.0, 3.0, 4.0]}), max_rows_per_unit=1
    )
    return c


def parquet_context(runtime, path) -> tuple[DistributedContext, list[str]]:
    """Table ``p`` (:func:`write_parquet_dir` under ``path``) on ``runtime``; the files too."""
    files = write_parquet_dir(path)
    c = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=TASKS))
    c.register_parquet("p", path)
    return c, files
