"""DataFusion bugs distfusion works around, reproduced on DataFusion alone (docs/datafusion-bugs.md).

Each test shows the bug as it is in the DataFusion this runs on; when one
fails, DataFusion fixed it and the workaround it names can go.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext, col, lit
from datafusion import functions as f
from datafusion.functions import spark

from distfusion.errors import TaskPanicked
from distfusion.protocol.errors import is_native_panic, is_task_failure, task_error


def _case_of_literals():
    return f.case(col("x") > lit(0)).when(lit(True), lit("big")).otherwise(lit("small"))


def test_xxhash64_panics_over_a_batch_where_its_argument_is_a_scalar():
    # Workaround: the shuffle hashes materialized key columns (execute_task._partition_into).
    df = SessionContext().from_arrow(pa.table({"x": [1, 2, 3]}))
    with pytest.raises(BaseException, match="index 1 from a StringViewArray of length 1") as info:
        df.select(spark.xxhash64(_case_of_literals())).collect()
    panic = info.value
    assert not isinstance(panic, Exception), "a panic is a BaseException (pyo3's PanicException)"
    assert is_native_panic(panic) and is_task_failure(panic)
    err = task_error(2, 1, "local://0", panic)
    assert isinstance(err, TaskPanicked)
    assert err.cause.startswith("DataFusion panicked: Trying to access an element at index 1")


def test_xxhash64_answers_when_its_argument_is_a_column():
    df = SessionContext().from_arrow(pa.table({"x": [1, 2, 3]}))
    keyed = df.select(_case_of_literals().alias("k"))
    twice = keyed.select(col("k"), spark.xxhash64(col("k")).alias("h"))
    hashes = twice.to_arrow_table().column("h").to_pylist()
    assert len(hashes) == 3 and len(set(hashes)) == 1


def test_only_panics_are_task_failures_among_base_exceptions():
    assert is_task_failure(ValueError("x"))
    for exc in (KeyboardInterrupt(), SystemExit(0), GeneratorExit()):
        assert not is_task_failure(exc) and not is_native_panic(exc)


@pytest.mark.parametrize(
    "keys",
    [
        pa.array([5, 5, 5], pa.int64()),  # one value: min == max in the statistics
        pa.array([None, None, None], pa.int64()),  # only NULLs
        pa.array(["x", "x", "x"]),
    ],
    ids=["constant", "null", "constant string"],
)
def test_xxhash64_pushed_into_a_parquet_scan_panics_on_a_column_its_statistics_make_constant(
    tmp_path, keys
):
    # Workaround: a shuffle over scans hashes above a filter (execute_task._partition_into).
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"k": keys, "v": pa.array([1, 2, 3])}), path)
    ctx = SessionContext()
    hashed = ctx.read_parquet(str(path)).select(spark.xxhash64(col("k")).alias("h"))
    assert "xxhash64" in hashed.execution_plan().display_indent().split("DataSourceExec")[1]
    with pytest.raises(BaseException) as info:  # noqa: PT011 (the panic's text varies by type)
        hashed.collect()
    assert is_native_panic(info.value)
    above = ctx.read_parquet(str(path)).filter(f.random() >= lit(0.0))
    hashes = above.select(spark.xxhash64(col("k")).alias("h")).to_arrow_table()
    assert len(set(hashes.column("h").to_pylist())) == 1
