"""Inputs DataFusion pulls from Python (worker/stream_inputs.py): slots, replays, which inputs.

Real DataFusion contexts over small Arrow tables; the end-to-end behaviour
(rows before producers end, cancelled tasks going idle) is in
tests/runtime/test_streaming.py and tests/runtime/test_cancellation.py.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from datafusion import SessionConfig, SessionContext

from distfusion.errors import QueryCancelled
from distfusion.worker.stream_inputs import (
    FIRST_SLICE_ROWS,
    MAX_BUILD_BYTES,
    PULL_SECONDS,
    InputBinding,
    InputStreams,
    PullSlots,
    StreamPlan,
    paced,
)

BIG = MAX_BUILD_BYTES * 4


def test_a_probe_side_streams_behind_a_small_build_side_or_when_it_is_larger():
    plan = StreamPlan(whole=frozenset({"build"}), gated={"probe": frozenset({"build"})})
    assert plan.streams("probe", {"build": 1024})
    assert not plan.streams("probe", {})  # its build side is not read yet
    assert not plan.streams("probe", {"build": BIG})  # size unknown: DataFusion might swap
    assert plan.streams("probe", {"build": BIG}, own_bytes=BIG)  # no swap either way
    assert not plan.streams("probe", {"build": BIG}, own_bytes=BIG - 1)
    assert not plan.streams("build", {"build": 1}, own_bytes=BIG)
    assert plan.streams("other", {})  # under no join


def test_pull_slots_for_local_producers_are_all_or_nothing_and_remote_ones_up_to_the_free():
    slots = PullSlots(slots=2, remote_slots=3)
    assert slots.take(3) == 0
    assert slots.take(2) == 2
    assert slots.take(2, remote=True) == 1  # 3 threads may wait in all
    assert slots.take(1, remote=True) == 0
    slots.give_back(3)
    assert slots.used == 0


def _table(n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(n), pa.int64()), "v": pa.array([1.0] * n)})


def test_a_replayed_input_gives_the_memory_tables_answer():
    data = _table(50_000).to_batches(max_chunksize=1000)
    sql = "SELECT t.k % 7 AS g, sum(t.v * s.v) AS s FROM t JOIN s ON t.k % 100 = s.k GROUP BY 1"
    small = _table(100).to_batches()
    expected_ctx = SessionContext()
    expected_ctx.register_record_batches("t", [data])
    expected_ctx.register_record_batches("s", [small])
    expected = expected_ctx.sql(sql).sort("g").to_arrow_table()

    binding = InputBinding()
    ctx = SessionContext()
    ctx.register_dataset("t", binding.replay("t", data[0].schema, data, 2))
    ctx.register_record_batches("s", [small])
    got = ctx.sql(sql).sort("g").to_arrow_table()
    assert got.equals(expected)
    again = ctx.sql(sql).sort("g").to_arrow_table()  # a run again replays it whole
    assert again.equals(expected)


def test_a_cancelled_task_stops_at_its_next_pull_of_a_replayed_input():
    data = _table(100_000).to_batches(max_chunksize=1000)
    pulls = []

    def cancelled() -> bool:  # true from the 10th pull on
        pulls.append(1)
        return len(pulls) >= 10

    binding = InputBinding(cancelled)
    ctx = SessionContext()
    ctx.register_dataset("t", binding.replay("t", data[0].schema, data, 1))
    with pytest.raises(Exception, match="query cancelled"):
        ctx.sql("SELECT sum(v) FROM t").to_arrow_table()  # yields nothing until its end
    assert isinstance(binding.error, QueryCancelled)
    assert len(pulls) == 10  # of 100 batches: DataFusion stopped pulling


def _streamed(binding: InputBinding, batches: list[pa.RecordBatch]):
    """One stream of ``batches`` through ``binding`` (a producer partition already written)."""
    dataset = binding.stream("t", batches[0].schema, InputStreams([lambda: iter(batches)]), 1)
    assert dataset is not None
    return dataset.streams[0]


def test_a_run_again_replays_what_was_kept_and_stop_keeping_trims_what_was_read():
    batches = _table(10_000).to_batches(max_chunksize=1000)
    binding = InputBinding(keep=True, slots=PullSlots(slots=1))
    stream = _streamed(binding, batches)
    first = stream.batches()
    assert [next(first) for _ in range(4)] == batches[:4]  # then that run failed
    again = stream.batches()
    got = [next(again) for _ in range(2)]
    binding.stop_keeping()  # the head stage yielded: no run again
    late = next(first)  # an abandoned pass's pull still lands: kept for the live one
    assert late.equals(batches[4])
    got += list(again)
    assert got == batches
    assert stream._kept == []  # nothing held once read
    with pytest.raises(RuntimeError, match="cannot be read twice"):
        next(stream.batches())
    binding.close()


def _sizes(batches, consume) -> list[int]:
    """The rows of each slice ``paced`` hands out, ``consume(slice)`` run on each."""
    binding = InputBinding()
    sizes = []
    for piece in paced(iter(batches), binding):
        consume(piece)
        sizes.append(piece.num_rows)
    return sizes


def test_paced_slices_start_small_and_grow_to_whole_batches():
    batches = _table(8192 * 30).to_batches(max_chunksize=8192)
    got = []
    sizes = _sizes(batches, got.append)
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(batches))
    assert sizes[0] == FIRST_SLICE_ROWS
    # Whole batches once the consumer keeps up (a stall on a busy machine may
    # shrink a few slices, which then grow back).
    assert sizes.count(8192) >= 20


def test_paced_slices_shrink_after_two_slow_pulls():
    batches = _table(600).to_batches()
    per_row = 2 * PULL_SECONDS / FIRST_SLICE_ROWS  # the first slice takes 2x PULL_SECONDS
    got = []
    sizes = _sizes(batches, lambda piece: (got.append(piece), time.sleep(per_row * len(piece))))
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(batches))
    assert sizes[:2] == [FIRST_SLICE_ROWS] * 2
    assert max(sizes[2:]) <= FIRST_SLICE_ROWS // 2  # slower on a busy machine: smaller


def test_a_join_making_millions_of_rows_per_batch_stops_within_a_slice():
    """Without slices, DataFusion made 8,192 x 400,000 rows of the first batch: 16 s here."""
    probe = _table(100_000).to_batches(max_chunksize=8192)
    probe = [b.set_column(0, "k", pa.array([0] * b.num_rows, pa.int64())) for b in probe]
    build = pa.table({"k": pa.array([0] * 400_000, pa.int64()), "w": pa.array([2.0] * 400_000)})
    start = time.monotonic()
    binding = InputBinding(lambda: time.monotonic() - start > 0.3)
    ctx = SessionContext(SessionConfig().with_target_partitions(1))
    ctx.register_dataset("t", binding.replay("t", probe[0].schema, probe, 1))
    ctx.register_record_batches("s", [build.to_batches()])
    with pytest.raises(Exception, match="query cancelled"):
        ctx.sql("SELECT sum(t.v * s.w) FROM s JOIN t ON t.k = s.k").to_arrow_table()
    assert time.monotonic() - start < 5  # 0.5 s here; a whole batch: 16 s
