"""UDFs and object stores belong to a DistributedContext, as to a DataFusion SessionContext.

Two contexts of one process register a UDF ``f`` each (``x + 1`` on ``a``,
``x + 100`` on ``b``), or a store for the same bucket each (two buckets behind
``s3://lake``): each context's queries answer with its own, on every runtime,
however the tasks run (in process, on Flight workers, on Spark executors).
Issue 40 item 3: ``a.sql("SELECT f(x) FROM t")`` with 2 tasks answered ``x + 100``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import distfusion
from distfusion import DistributedConfig, DistributedContext
from distfusion.session import called_functions

RUNTIMES = ["local", "flight", "spark"]
CONFIG = DistributedConfig(tasks_per_stage=2, in_place_bytes=0)  # always on the runtime
ROWS = list(range(1, 9))


def _plus_one(x: pa.Array) -> pa.Array:
    return pc.add(x, 1)


def _plus_hundred(x: pa.Array) -> pa.Array:
    return pc.add(x, 100)


def _context(runtime, f) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=CONFIG)
    ctx.register_record_batches(
        "t", [[pa.record_batch({"x": ROWS[:4]})], [pa.record_batch({"x": ROWS[4:]})]]
    )
    ctx.register_udf(distfusion.udf(f, [pa.int64()], pa.int64(), "immutable", name="f"))
    return ctx


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_contexts_keep_their_own_udf_of_one_name(runtime_for, runtime):
    a = _context(runtime_for(runtime, 2), _plus_one)
    b = _context(runtime_for(runtime, 2), _plus_hundred)
    # f in the head stage (on the coordinator), over the tasks' partial sums.
    for ctx, add in ((a, 1), (b, 100), (a, 1)):
        got = ctx.sql("SELECT f(sum(x)) AS y FROM t").to_pylist()
        assert got == [{"y": sum(ROWS) + add}]
    if runtime == "flight":
        return  # the workers' UDFs are their own (--udf): these have no f
    # f in the leaf tasks, two of them.
    for ctx, add in ((a, 1), (b, 100), (a, 1)):
        df = ctx.sql("SELECT f(x) AS y FROM t ORDER BY y")
        assert df.stage_graph().stages[0].num_tasks == 2
        assert df.to_pydict() == {"y": [x + add for x in ROWS]}


def test_a_stage_carries_only_the_udfs_its_fragment_calls(runtime_for):
    ctx = _context(runtime_for("local", 2), _plus_one)
    ctx.register_udf(distfusion.udf(_plus_hundred, [pa.int64()], pa.int64(), "immutable", name="g"))
    graph = ctx.sql("SELECT f(x) AS y FROM t").stage_graph()
    leaf = graph.stages[0]
    assert "f" in called_functions(leaf.fragment)
    assert leaf.session is not None
    assert leaf.session.functions.names() == {"f"}


def test_a_udf_registered_later_on_another_context_changes_no_plan(runtime_for):
    a = _context(runtime_for("local", 2), _plus_one)
    df = a.sql("SELECT f(x) AS y FROM t ORDER BY y")
    _context(runtime_for("local", 2), _plus_hundred)  # registers its f after a's query exists
    assert df.to_pydict() == {"y": [x + 1 for x in ROWS]}


@pytest.fixture(scope="module")
def two_buckets(s3_server, tmp_path_factory):
    """Buckets ``lake-a`` (x = 1..8) and ``lake-b`` (x = 101..108), two files each."""
    for bucket, offset in (("lake-a", 0), ("lake-b", 100)):
        local = tmp_path_factory.mktemp(bucket)
        for i, part in enumerate((ROWS[:4], ROWS[4:])):
            pq.write_table(pa.table({"x": [x + offset for x in part]}), local / f"part-{i}.parquet")
        s3_server.create_bucket(bucket)
        s3_server.upload_dir(local, bucket, "t")
    return "s3://lake/t/"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_contexts_keep_their_own_store_of_one_bucket(
    runtime_for, runtime, two_buckets, s3_store
):
    contexts = []
    for bucket in ("lake-a", "lake-b"):
        ctx = DistributedContext(runtime=runtime_for(runtime, 2), config=CONFIG)
        ctx.register_object_store("s3://", s3_store(bucket), "lake")
        ctx.register_parquet("t", two_buckets)
        contexts.append(ctx)
    a, b = contexts
    for ctx, offset in ((a, 0), (b, 100), (a, 0)):
        df = ctx.sql("SELECT sum(x) AS s, count(*) AS n FROM t")
        assert df.stage_graph().stages[0].num_tasks == 2
        assert df.to_pylist() == [{"s": sum(ROWS) + 8 * offset, "n": 8}]


def test_settings_travel_as_specs_and_are_built_again():
    import pickle

    from distfusion.io.object_store import AmazonS3, Stores
    from distfusion.protocol.messages import decode_stores, encode_stores
    from distfusion.session import SessionSettings
    from distfusion.udfs import Functions

    functions, stores = Functions(), Stores()
    functions.register(distfusion.udf(_plus_one, [pa.int64()], pa.int64(), "immutable", name="f"))
    stores.register("s3://", AmazonS3(bucket_name="lake-a", region="us-east-1"), "lake")
    again = pickle.loads(pickle.dumps(SessionSettings(functions, stores)))
    assert again.functions.names() == {"f"}
    assert again.store_specs() == stores.specs()
    assert decode_stores(encode_stores("q1", stores.specs())) == ("q1", stores.specs())
    with pytest.raises(ValueError, match="object store specs"):
        decode_stores(b'{"stores": []}')
