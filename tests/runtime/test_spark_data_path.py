"""Stage outputs leave a Spark task as bounded chunks and arrive whole and in order.

A task's output partition becomes several records of at most ``chunk_bytes``
(:func:`~distfusion.worker.spark_records._output_records`); consumers order payloads
by producer task with a stable sort, so the rows of one producer come back in
the order it made them. Runs on the test session's ``local[2]`` SparkSession;
the measurements behind the defaults are in docs/spark-data-path.md.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pyarrow as pa
import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.worker.spark_records import (
    CHUNK_BYTES,
    decode_records,
    encode_records,
    group_inputs,
    output_records,
)
from tests.compare import assert_same_result, is_ordered, oracle_result

IPC_FRAMING_BYTES = 4096  # schema message + one header per batch, generous


def _table(task: int, rows: int) -> pa.Table:
    """Rows numbered in order, with strings as views (as DataFusion hands them out)."""
    ids = pa.array(range(task * 10**6, task * 10**6 + rows), pa.int64())
    text = pa.array([f"row {i:09d} of task {task}" for i in range(rows)]).cast(pa.string_view())
    return pa.table({"id": ids, "text": text})


def _parts(task: int) -> list[list[pa.RecordBatch]]:
    """Three output partitions: ~1.2 MiB in batches, empty, one ~0.6 MiB batch."""
    return [
        _table(task, 40_000).to_batches(max_chunksize=7_000),
        [],
        _table(task + 100, 20_000).combine_chunks().to_batches(),
    ]


def test_output_records_are_bounded_complete_and_ordered():
    chunk_bytes = 128 * 1024
    records = list(output_records(7, _parts(7), None, chunk_bytes))
    assert {p for p, _ in records} == {0, 2}  # an empty partition sends nothing
    assert all(task == 7 for _, (task, _) in records)
    assert all(len(ipc) <= chunk_bytes + IPC_FRAMING_BYTES for _, (_, ipc) in records)
    for p, expected in [(0, _table(7, 40_000)), (2, _table(107, 20_000))]:
        payloads = [v for q, v in records if q == p]
        assert len(payloads) > 4  # split, the one-batch partition too
        got = pa.Table.from_batches(decode_records(payloads))
        assert got.equals(expected.cast(got.schema))  # views became plain strings
        assert got.schema.field("text").type == pa.string()


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_payloads_pickle_and_decode(compression):
    records = list(output_records(0, _parts(0), compression, CHUNK_BYTES))
    assert len(records) == 2  # under the default chunk size: one record per partition
    back = pickle.loads(pickle.dumps(records, pickle.HIGHEST_PROTOCOL))  # as PySpark ships them
    got = pa.Table.from_batches(decode_records([v for p, v in back if p == 0]))
    assert got.column("id").to_pylist() == list(range(40_000))
    one = encode_records(_parts(0)[0], compression)
    assert pa.Table.from_batches(decode_records([(0, one)])).equals(got)


def test_chunks_cross_the_spark_shuffle_whole_and_in_order(spark_session):
    # Four producer tasks, three consumer partitions, 64 KiB chunks: every
    # non-empty partition of every task is many records through partitionBy.
    sc = spark_session.sparkContext
    chunk_bytes = 64 * 1024

    def produce(task, _):
        # Defined here, so cloudpickle ships it by value: executors import no tests package.
        import pyarrow as pa

        from distfusion.worker.spark_records import output_records

        def table(offset, rows):
            first = (task + offset) * 10**6
            text = pa.array([f"row {i:09d}" for i in range(rows)]).cast(pa.string_view())
            return pa.table({"id": pa.array(range(first, first + rows), pa.int64()), "text": text})

        parts = [
            table(0, 40_000).to_batches(max_chunksize=7_000),
            [],
            table(100, 20_000).combine_chunks().to_batches(),
        ]
        for p, (t, ipc) in output_records(task, parts, None, chunk_bytes):
            yield p, (0, t, ipc)  # tagged with the producer stage, as SparkShuffleQuery does

    def consume(index, records):
        from types import SimpleNamespace

        from distfusion.worker.spark_records import decode_records, group_inputs

        stage = SimpleNamespace(inputs=[SimpleNamespace(stage_id=0, boundary="shuffle")])
        (values,) = group_inputs(stage, list(records))
        batches = decode_records(values)
        ids = [i for b in batches for i in b.column("id").to_pylist()]
        yield index, len(values), ids

    identity = lambda p: p  # noqa: E731
    out = (
        sc.parallelize(range(4), 4)
        .mapPartitionsWithIndex(produce)
        .partitionBy(3, identity)
        .mapPartitionsWithIndex(consume)
        .collect()
    )
    got = {p: (n, ids) for p, n, ids in out}
    assert got[1] == (0, [])
    for p, rows, offset in [(0, 40_000, 0), (2, 20_000, 100)]:
        expected = [
            i for t in range(4) for i in range((t + offset) * 10**6, (t + offset) * 10**6 + rows)
        ]
        n, ids = got[p]
        assert n >= 4 * 5  # several chunks from every producer task
        assert ids == expected  # whole, by task, each task's rows in order


def test_group_inputs_keeps_chunk_order_within_a_task():
    stage = SimpleNamespace(inputs=[SimpleNamespace(stage_id=5, boundary="shuffle")])
    records = [(0, (5, 1, b"b0")), (0, (5, 0, b"a0")), (0, (5, 1, b"b1")), (0, (5, 0, b"a1"))]
    assert group_inputs(stage, records) == [[(0, b"a0"), (0, b"a1"), (1, b"b0"), (1, b"b1")]]


def test_query_with_outputs_larger_than_a_chunk_equals_datafusion(runtime_for, tpch_dir, oracle):
    # At SF0.1 each of the two lineitem tasks sorts ~50 MiB of rows: several
    # 16 MiB records per task, merged in order on the head stage.
    ctx = DistributedContext(
        runtime=runtime_for("spark", 2), config=DistributedConfig(tasks_per_stage=2)
    )
    tpch.register_tpch(ctx, tpch_dir)
    sql = (
        "SELECT l_orderkey, l_linenumber, l_comment, l_shipinstruct, l_extendedprice "
        "FROM lineitem ORDER BY l_orderkey, l_linenumber"
    )
    got = ctx.sql(sql).to_arrow_table()
    assert got.nbytes > 2 * CHUNK_BYTES
    assert_same_result(got, oracle_result(oracle, sql), is_ordered(sql))
