"""Writes into Delta tables (issue 39): ``DistributedDataFrame.write_delta`` on local disk and S3.

Every write is read back through deltalake itself and compared with the rows
written; every write is exactly one new version. A task that fails leaves the
table at its version with no new file below its directory.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

import distfusion
from distfusion import DistributedConfig, DistributedContext, TaskError
from distfusion.table_write import TableWriteError

RUNTIMES = {"local": 3, "flight": 3, "spark": 2}
# Flight workers run only the UDFs they were started with (tests.udf_funcs): the
# failing UDF of these tests is the local and Spark runtimes' (a context's UDFs travel).
UDF_RUNTIMES = ["local", "spark"]
ROWS = 600


def _source() -> pa.Table:
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([f"k {i % 3}" for i in ids]),
            "x": pa.array([i * 0.5 if i % 7 else None for i in ids]),
        }
    )


def _fail_at(values: pa.Array) -> pa.Array:
    if pc.any(pc.equal(values, ROWS - 1)).as_py():
        raise RuntimeError("boom in one task")
    return values


FAIL = distfusion.udf(_fail_at, [pa.int64()], pa.int64(), "immutable", name="fail_at_last")


def _context(runtime) -> DistributedContext:
    ctx = DistributedContext(runtime=runtime, config=DistributedConfig(tasks_per_stage=3))
    ctx.register_table("src", _source(), max_rows_per_unit=100)
    ctx.register_udf(FAIL)
    return ctx


@pytest.fixture(params=list(RUNTIMES))
def ctx(request, runtime_for) -> DistributedContext:
    return _context(runtime_for(request.param, RUNTIMES[request.param]))


@pytest.fixture(params=UDF_RUNTIMES)
def udf_ctx(request, runtime_for) -> DistributedContext:
    return _context(runtime_for(request.param, RUNTIMES[request.param]))


@pytest.fixture
def local_ctx() -> DistributedContext:
    from distfusion import LocalRuntime

    ctx = _context(LocalRuntime(workers=3))
    yield ctx
    ctx.close()


def _read(table, storage_options=None) -> pa.Table:
    dt = (
        table
        if isinstance(table, DeltaTable)
        else DeltaTable(table, storage_options=storage_options)
    )
    t = pa.table(dt.to_pyarrow_table()).select(["id", "p", "x"])
    return t.sort_by("id")


def _expected(where: str = "true") -> pa.Table:
    from datafusion import SessionContext

    c = SessionContext()
    c.from_arrow(_source(), "src")
    return c.sql(f"SELECT id, p, x FROM src WHERE {where} ORDER BY id").to_arrow_table()


def _files(root) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return sorted(out)


def _same(got: pa.Table, expected: pa.Table) -> None:
    assert got.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize("partition_by", [None, ["p"]], ids=["unpartitioned", "partitioned"])
def test_create_append_overwrite_each_one_version(ctx, tmp_path, partition_by):
    path = str(tmp_path / "t")
    c0 = ctx.sql("SELECT id, p, x FROM src WHERE id < 300").write_delta(
        path, partition_by=partition_by
    )
    assert c0.version == 0 and c0.rows == 300 and len(c0.files_added) >= 1
    _same(_read(path), _expected("id < 300"))
    assert DeltaTable(path).metadata().partition_columns == (partition_by or [])
    c1 = ctx.sql("SELECT id, p, x FROM src WHERE id >= 300").write_delta(path)
    assert c1.version == 1 and DeltaTable(path).version() == 1
    _same(_read(path), _expected())
    c2 = ctx.sql("SELECT id, p, x FROM src WHERE id % 2 = 0").write_delta(path, mode="overwrite")
    assert c2.version == 2 and DeltaTable(path).version() == 2
    assert sorted(c2.files_removed) == sorted(c0.files_added + c1.files_added)
    _same(_read(path), _expected("id % 2 = 0"))
    history = DeltaTable(path).history()
    assert [h["version"] for h in history] == [2, 1, 0]
    # Old versions stay readable: time travel sees each write whole.
    _same(_read(DeltaTable(path, version=0)), _expected("id < 300"))


def test_statistics_of_every_file_are_in_the_log(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src").write_delta(path, partition_by="p")
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    data = _source().to_pylist()
    assert sum(a["num_records"] for a in actions) == ROWS
    for a in actions:
        rows = [r for r in data if r["p"] == a["partition.p"]]
        assert a["path"].startswith("p=k%2520")  # the directory "p=k%20<n>", encoded once more
        # each file holds some of the partition's rows: its bounds lie within the partition's
        assert (
            min(r["id"] for r in rows) <= a["min.id"] <= a["max.id"] <= max(r["id"] for r in rows)
        )
        assert a["null_count.x"] <= sum(r["x"] is None for r in rows)
    assert sum(a["null_count.x"] for a in actions) == sum(r["x"] is None for r in data)


def test_predicate_and_dynamic_partition_overwrite(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src").write_delta(path, partition_by=["p"])
    c = local_ctx.sql(
        "SELECT id + 1000 AS id, p, x FROM src WHERE p = 'k 1' AND id < 30"
    ).write_delta(path, mode="overwrite", predicate="p = 'k 1'")
    assert c.version == 1 and c.files_removed
    expected = _expected("p <> 'k 1'").to_pylist() + [
        {**r, "id": r["id"] + 1000} for r in _expected("p = 'k 1' AND id < 30").to_pylist()
    ]
    _same(_read(path), pa.Table.from_pylist(expected).sort_by("id"))
    # Dynamic: only the partitions the query writes ('k 2') are replaced.
    local_ctx.sql("SELECT id, p, x FROM src WHERE p = 'k 2' AND id < 10").write_delta(
        path, mode="overwrite", partition_overwrite_mode="dynamic"
    )
    expected = [r for r in expected if r["p"] != "k 2"] + _expected(
        "p = 'k 2' AND id < 10"
    ).to_pylist()
    _same(_read(path), pa.Table.from_pylist(expected).sort_by("id"))
    assert DeltaTable(path).version() == 2
    # Rows outside the predicate: refused before the commit, nothing written.
    before = _files(path)
    with pytest.raises(ValueError, match="do not match the overwrite predicate"):
        local_ctx.sql("SELECT id, p, x FROM src").write_delta(
            path, mode="overwrite", predicate="p = 'k 0'"
        )
    assert _files(path) == before and DeltaTable(path).version() == 2
    with pytest.raises(ValueError, match="do not match the overwrite predicate"):
        local_ctx.sql("SELECT id, p, x FROM src").write_delta(
            path, mode="overwrite", predicate="id > 3"
        )
    assert _files(path) == before and DeltaTable(path).version() == 2
    with pytest.raises(ValueError, match="not SQL over its columns"):
        local_ctx.sql("SELECT id, p, x FROM src WHERE id > 3").write_delta(
            path, mode="overwrite", predicate="nope > 3"
        )
    assert _files(path) == before and DeltaTable(path).version() == 2


@pytest.mark.parametrize("runtime_name", ["local", "flight"])
@pytest.mark.parametrize("partition_by", [None, ["p"]])
@pytest.mark.parametrize(
    "predicate",
    ["id >= 200 AND id < 400", "p = 'k 1' AND (x > 10 OR id < 5)", "x > 100", "id >= 350"],
)
def test_predicate_over_data_columns_replaces_the_rows_as_deltalake(
    runtime_name, partition_by, predicate, runtime_for, tmp_path
):
    ctx = _context(runtime_for(runtime_name, RUNTIMES[runtime_name]))
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for path in (ours, theirs):
        write_deltalake(path, _source().slice(0, 300), partition_by=partition_by)
        write_deltalake(path, _source().slice(300), mode="append")
    new = f"SELECT id, p, x * 2 AS x FROM src WHERE {predicate}"  # matches the predicate too
    replaced = _expected(predicate)
    replaced = replaced.set_column(2, "x", pc.multiply(replaced["x"], 2))
    write_deltalake(theirs, replaced, mode="overwrite", predicate=predicate)
    commit = ctx.sql(new).write_delta(ours, mode="overwrite", predicate=predicate)
    assert DeltaTable(ours).version() == 2 == commit.version
    assert commit.files_removed and commit.rows >= replaced.num_rows
    expected = pa.concat_tables([_expected(f"NOT coalesce(({predicate}), false)"), replaced])
    _same(_read(ours), expected.sort_by("id"))
    _same(_read(ours), _read(theirs))
    if predicate == "id >= 350":  # min/max: only the files of the second write (ids 300-599)
        assert len(commit.files_removed) == (3 if partition_by else 1), commit.files_removed
    if partition_by and predicate.startswith("p = "):  # only the files of partition 'k 1'
        assert all(f.startswith("p=k%201/") for f in commit.files_removed), commit.files_removed


def test_appends_to_a_table_deltalake_made(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _source().slice(0, 100), partition_by=["p"])
    local_ctx.sql("SELECT id, p, x FROM src WHERE id >= 100").write_delta(DeltaTable(path))
    _same(_read(path), _expected())
    assert DeltaTable(path).version() == 1


def test_a_schema_that_does_not_fit_is_refused_before_any_task(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src").write_delta(path)
    before = _files(path)
    with pytest.raises(ValueError, match="'id' is string in the result but long"):
        local_ctx.sql("SELECT CAST(id AS VARCHAR) AS id, p, x FROM src").write_delta(path)
    with pytest.raises(ValueError, match=r"\['y'\] of the result are not in the Delta table"):
        local_ctx.sql("SELECT id, p, x, 1 AS y FROM src").write_delta(path)
    with pytest.raises(ValueError, match=r"\['x'\] of the Delta table .* are missing"):
        local_ctx.sql("SELECT id, p FROM src").write_delta(path)
    with pytest.raises(ValueError, match="partitioned by"):
        local_ctx.sql("SELECT id, p, x FROM src").write_delta(path, partition_by=["p"])
    assert _files(path) == before and DeltaTable(path).version() == 0
    # Evolution only when asked: merge adds the column, old rows read it as NULL.
    local_ctx.sql("SELECT id, p, x, id * 2 AS y FROM src WHERE id < 5").write_delta(
        path, schema_mode="merge"
    )
    t = pa.table(DeltaTable(path).to_pyarrow_table())
    assert "y" in t.column_names and t.num_rows == ROWS + 5
    assert pc.sum(t["y"].is_null()).as_py() == ROWS


def test_a_failing_task_leaves_the_table_and_its_directory_untouched(udf_ctx, tmp_path):
    ctx = udf_ctx
    path = str(tmp_path / "t")
    ctx.sql("SELECT id, p, x FROM src WHERE id < 100").write_delta(path, partition_by=["p"])
    before = _files(path)
    bad = "SELECT fail_at_last(id) AS id, p, x FROM src"
    for mode in ("append", "overwrite"):
        with pytest.raises(TaskError, match="boom in one task"):
            ctx.sql(bad).write_delta(path, mode=mode)
        assert _files(path) == before
        assert DeltaTable(path).version() == 0
    _same(_read(path), _expected("id < 100"))
    # A new table that fails: no table, no directory.
    with pytest.raises(TaskError, match="boom in one task"):
        ctx.sql(bad).write_delta(str(tmp_path / "new"))
    assert not os.path.exists(tmp_path / "new")


def test_a_blind_append_racing_another_append_lands(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src WHERE id < 10").write_delta(path)
    stale = DeltaTable(path)  # the write reads version 0 ...
    write_deltalake(path, _source().slice(10, 5), mode="append")  # ... another append wins v1
    c = local_ctx.sql("SELECT id, p, x FROM src WHERE id >= 15").write_delta(stale)
    assert c.version == 2 and DeltaTable(path).version() == 2
    _same(_read(path), _expected())


def test_a_refused_commit_deletes_the_files(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src WHERE id < 10").write_delta(path)
    dt = DeltaTable(path)
    before = _files(path)
    # The table is read as version 0; a concurrent overwrite commits version 1 first.
    write_deltalake(path, _source().slice(0, 1), mode="overwrite")
    after_other = _files(path)
    frame = local_ctx.sql("SELECT id, p, x FROM src")
    with pytest.raises(TableWriteError, match="version 0"):
        frame.write_delta(dt, mode="overwrite", predicate=None, partition_overwrite_mode="dynamic")
    assert _files(path) == after_other and len(after_other) > len(before)
    assert DeltaTable(path).version() == 1


def test_write_to_s3(local_ctx, s3_server, s3_store):
    from distfusion.io import object_store

    s3_server.create_bucket("delta-out")
    local_ctx.register_object_store("s3://", s3_store("delta-out"), "delta-out")
    options = {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_REGION": "us-east-1",
    }
    url = "s3://delta-out/t"
    try:
        c = local_ctx.sql("SELECT id, p, x FROM src").write_delta(url, partition_by=["p"])
        assert c.version == 0
        _same(_read(url, options), _expected())
        local_ctx.sql("SELECT id, p, x FROM src WHERE id < 50").write_delta(url, mode="overwrite")
        _same(_read(url, options), _expected("id < 50"))
        keys = s3_server.keys("delta-out", "t/")
        before = len(keys)
        with pytest.raises(TaskError, match="boom in one task"):
            local_ctx.sql("SELECT fail_at_last(id) AS id, p, x FROM src").write_delta(url)
        assert len(s3_server.keys("delta-out", "t/")) == before
        assert not [k for k in keys if "_temporary" in k]
        assert DeltaTable(url, storage_options=options).version() == 1
        # The table reads back through distfusion's own reader too.
        local_ctx.register_delta("back", url)
        assert local_ctx.sql("SELECT count(*) AS n FROM back").to_pylist() == [{"n": 50}]
    finally:
        object_store.deregister("s3://", "delta-out")


def test_sql_insert_into_and_overwrite_a_registered_table(ctx, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _source().slice(0, 10), partition_by=["p"])
    ctx.register_delta("t", path)
    # by position, cast to the table's types; the result is DataFusion's INSERT count
    got = ctx.sql("INSERT INTO t SELECT CAST(id AS INT), p, x FROM src WHERE id >= 10").to_pylist()
    assert got == [{"count": ROWS - 10}] and DeltaTable(path).version() == 1
    _same(_read(path), _expected())
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": ROWS}]  # registered anew
    ctx.sql("INSERT OVERWRITE t SELECT id, p, x FROM src WHERE id < 3")
    _same(_read(path), _expected("id < 3"))
    ctx.sql("INSERT INTO t (p, id) VALUES ('k 9', 1000)")
    assert ctx.sql("SELECT id, p, x FROM t WHERE id = 1000").to_pylist() == [
        {"id": 1000, "p": "k 9", "x": None}
    ]
    assert DeltaTable(path).version() == 3
    with pytest.raises(distfusion.PlanningError, match="the query gives 2 column"):
        ctx.sql("INSERT INTO t SELECT id, p FROM src")


@pytest.mark.parametrize("column", ["d", "ts", "b"])
def test_dynamic_overwrite_of_date_timestamp_and_boolean_partitions(local_ctx, tmp_path, column):
    import datetime

    local_ctx.register_table(
        "typed",
        pa.table(
            {
                "id": pa.array(range(4), pa.int64()),
                "d": [datetime.date(2024, 1, 1 + i % 2) for i in range(4)],
                "ts": pa.array(
                    [datetime.datetime(2024, 1, 1, 10, i % 2) for i in range(4)],
                    pa.timestamp("us", "UTC"),
                ),
                "b": [True, False, True, None],
            }
        ),
    )
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, d, ts, b FROM typed").write_delta(path, partition_by=[column])
    local_ctx.sql("SELECT id + 10 AS id, d, ts, b FROM typed WHERE id = 0").write_delta(
        path, mode="overwrite", partition_overwrite_mode="dynamic"
    )
    # rows 0 and 2 share row 0's partition: replaced; 1 and 3 stay
    ids = sorted(pa.table(DeltaTable(path).to_pyarrow_table())["id"].to_pylist())
    assert ids == [1, 3, 10] and DeltaTable(path).version() == 1


def test_a_column_mapped_table_is_refused_before_any_task(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    schema = _source().schema
    DeltaTable.create(path, schema, configuration={"delta.columnMapping.mode": "name"})
    before = _files(path)
    with pytest.raises(ValueError, match="maps columns"):
        local_ctx.sql("SELECT id, p, x FROM src").write_delta(path)
    assert _files(path) == before


def _slow(values: pa.Array) -> pa.Array:
    import time

    time.sleep(0.3)
    return values


def test_ctrl_c_during_a_write_leaves_the_table_and_its_directory_untouched(local_ctx, tmp_path):
    import signal
    import threading
    import time

    local_ctx.register_udf(
        distfusion.udf(_slow, [pa.int64()], pa.int64(), "immutable", name="slow_id")
    )
    path = str(tmp_path / "t")
    local_ctx.sql("SELECT id, p, x FROM src WHERE id < 5").write_delta(path)
    before = _files(path)
    # 6 units of 100 rows, 0.3 s each, 3 workers: the write takes about a second
    with pytest.raises(KeyboardInterrupt):
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        local_ctx.sql("SELECT slow_id(id) AS id, p, x FROM src").write_delta(path)
        time.sleep(5)  # (a write done before the signal: it lands here; the check below fails)
    time.sleep(1)  # a task still unwinding would write now
    assert _files(path) == before and DeltaTable(path).version() == 0


MERGE_SOURCE = pa.table(
    {
        "id": pa.array([2, 3, 4, 5, 700, 701, 702], pa.int64()),
        "p": ["k 2", "k 0", "k 1", "k 2", "k 1", "k 2", "k 0"],
        "x": pa.array([200.0, 300.0, None, 500.0, 7000.0, 7010.0, 7020.0]),
        "op": ["u", "d", "u", "d", "i", "skip", "i"],
    }
)


def _merged_by_deltalake(path: str) -> list[dict]:
    dt = DeltaTable(path)
    (
        dt.merge(MERGE_SOURCE, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete("s.op = 'd'")
        .when_matched_update({"x": "s.x + 1", "p": "s.p"})
        .when_not_matched_insert({"id": "s.id", "p": "s.p", "x": "s.x"}, "s.op = 'i'")
        .execute()
    )
    return _read(path).to_pylist()


@pytest.mark.parametrize("partition_by", [None, ["p"]], ids=["unpartitioned", "partitioned"])
def test_merge_into_equals_deltalakes_merge(ctx, tmp_path, partition_by):
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for path in (ours, theirs):
        write_deltalake(path, _source().slice(0, 50), partition_by=partition_by)
    expected = _merged_by_deltalake(theirs)
    ctx.register_table("changes", MERGE_SOURCE)
    ctx.register_delta("t", ours)
    ctx.sql(
        """MERGE INTO t AS tgt USING changes AS s ON tgt.id = s.id
        WHEN MATCHED AND s.op = 'd' THEN DELETE
        WHEN MATCHED THEN UPDATE SET x = s.x + 1, p = s.p
        WHEN NOT MATCHED AND s.op = 'i' THEN INSERT (id, p, x) VALUES (s.id, s.p, s.x)"""
    )
    assert _read(ours).to_pylist() == expected
    assert DeltaTable(ours).version() == 1  # one commit
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": len(expected)}]


@pytest.mark.parametrize("partition_by", [None, ["p"]], ids=["unpartitioned", "partitioned"])
def test_merge_rewrites_only_the_files_the_source_keys_can_match(local_ctx, tmp_path, partition_by):
    # six files (one per append) of even ids, 100 apart; the source's ids 210..231
    # overlap the third file's range only (per partition: its three files)
    even = _source().filter(pc.equal(pc.bit_wise_and(_source()["id"], 1), 0))
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for path in (ours, theirs):
        for k in range(6):
            part = even.filter(pc.equal(pc.divide(even["id"], 100), k))
            write_deltalake(path, part, partition_by=partition_by, mode="append")
    changes = pa.table(
        {
            "id": pa.array([210, 220, 231], pa.int64()),
            "p": ["k 1", "k 2", "k 0"],
            "x": [-1.0, -2.0, -3.0],
            "op": ["u", "d", "i"],
        }
    )
    DeltaTable(theirs).merge(
        changes, "t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_delete("s.op = 'd'").when_matched_update({"x": "s.x"}).when_not_matched_insert(
        {"id": "s.id", "p": "s.p", "x": "s.x"}
    ).execute()
    before = {a["path"] for a in pa.table(DeltaTable(ours).get_add_actions()).to_pylist()}
    local_ctx.register_table("changes", changes)
    local_ctx.register_delta("t", ours)
    count = local_ctx.sql(
        """MERGE INTO t USING changes AS s ON t.id = s.id
        WHEN MATCHED AND s.op = 'd' THEN DELETE
        WHEN MATCHED THEN UPDATE SET x = s.x
        WHEN NOT MATCHED THEN INSERT *"""
    ).to_pylist()
    assert _read(ours).to_pylist() == _read(theirs).to_pylist()
    assert count == [{"count": _read(theirs).num_rows}]
    dt = DeltaTable(ours)
    assert dt.version() == 6  # one commit
    after = {a["path"] for a in pa.table(dt.get_add_actions()).to_pylist()}
    kept = before & after
    assert len(before - kept) == (1 if partition_by is None else 3)  # the third write's only
    # a merge refused after pruning leaves the whole table registered, not the files it read
    local_ctx.register_table("twice", pa.table({"id": pa.array([410, 410], pa.int64())}))
    with pytest.raises(distfusion.PlanningError, match="matched by more than one source row"):
        local_ctx.sql("MERGE INTO t USING twice ON t.id = twice.id WHEN MATCHED THEN DELETE")
    n = _read(ours).num_rows
    assert local_ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": n}]


def test_merge_star_clauses_and_a_source_query(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _source().slice(0, 10))
    local_ctx.register_delta("t", path)
    local_ctx.sql(
        """MERGE INTO t USING (SELECT id, p, x FROM src WHERE id BETWEEN 8 AND 11) AS s
        ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED THEN INSERT *"""
    )
    _same(_read(path), _expected("id < 12"))


def test_merge_refuses_a_target_row_matched_twice_before_writing(local_ctx, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _source().slice(0, 10))
    local_ctx.register_delta("t", path)
    local_ctx.register_table("twice", pa.table({"id": pa.array([5, 5], pa.int64())}))
    before = _files(path)
    with pytest.raises(distfusion.PlanningError, match="matched by more than one source row"):
        local_ctx.sql(
            "MERGE INTO t USING twice ON t.id = twice.id WHEN MATCHED THEN UPDATE SET x = 0"
        )
    assert _files(path) == before and DeltaTable(path).version() == 0
    with pytest.raises(
        distfusion.PlanningError, match="NOT MATCHED BY SOURCE cannot UPDATE SET \\*"
    ):
        local_ctx.sql(
            "MERGE INTO t USING twice ON t.id = twice.id WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *"
        )
