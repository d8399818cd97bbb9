"""Each runtime's declared RuntimeProfile (``Runtime.profile()``), what the planner reads of it."""

from __future__ import annotations

import pytest

from distfusion import DistributedConfig
from distfusion.planner.config import (
    MAX_BROADCAST_BYTES,
    PlannerConfig,
    RuntimeProfile,
    in_place_bytes,
)
from distfusion.runtime.registry import RUNTIMES


def test_local_runtime_declares_the_defaults_and_its_task_memory(runtime_for):
    runtime = runtime_for("local", 2)
    assert runtime.profile() == RuntimeProfile(
        task_memory_bytes=runtime.memory_per_task_bytes,
        in_place_bytes=in_place_bytes(),  # its workers share this process's cores
    )


def test_the_default_broadcast_bound_follows_the_task_memory(runtime_for):
    """None: the larger of 100 MiB and a sixteenth of a task's memory budget."""
    local = runtime_for("local", 2)

    def bound(runtime, **settings) -> int:
        return PlannerConfig.for_runtime(DistributedConfig(**settings), runtime).max_broadcast_bytes

    assert bound(local) == max(MAX_BROADCAST_BYTES, local.memory_per_task_bytes // 16)
    assert bound(local, memory_per_task_bytes=8 * 2**30) == 512 * 2**20  # the query's budget
    assert bound(local, memory_per_task_bytes=256 * 2**20) == MAX_BROADCAST_BYTES
    assert bound(local, max_broadcast_bytes=0) == 0  # as set
    assert bound(runtime_for("flight", 2)) == MAX_BROADCAST_BYTES  # workers' memory unknown
    assert PlannerConfig(workers=1).max_broadcast_bytes == MAX_BROADCAST_BYTES


def test_flight_runtime_declares_remote_workers(runtime_for):
    assert runtime_for("flight", 2).profile() == RuntimeProfile(remote_workers=True)


def test_spark_runtime_declares_its_task_sizes_and_spark_reads(runtime_for):
    runtime = runtime_for("spark", 2)
    profile = runtime.profile()
    assert profile == RuntimeProfile(
        bytes_per_task=256 * 2**20,
        wave_bytes_per_task=2 * 2**30,  # the Flight data plane (the default)
        shuffle_bytes_per_task=64 * 2**20,
        max_tasks=1024,
        broadcast_copies=runtime.broadcast_copies,
        reads_spark_dataframes=True,
        explain_note=runtime.explain_note,
        in_place_bytes=in_place_bytes(2),  # local[2]: 2 slots on the driver's own cores
        task_memory_bytes=runtime.memory_per_task_bytes,
    )
    config = PlannerConfig.for_runtime(PlannerConfig(workers=1), runtime)
    assert (config.task_cap, config.broadcast_copies) == (1024, runtime.broadcast_copies)


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_every_registered_runtime_declares_a_profile(name, runtime_for):
    assert isinstance(runtime_for(name, 2).profile(), RuntimeProfile)


def test_spark_connect_runtime_declares_the_spark_profile(connect_session):
    from distfusion import SparkRuntime

    runtime = SparkRuntime(spark=connect_session)
    try:
        profile = runtime.profile()
        assert profile.reads_spark_dataframes and profile.max_tasks == 1024
        assert profile.broadcast_copies == runtime.num_workers() == 2  # local[2]'s slots
        assert profile.wave_bytes_per_task == 2 * 2**30  # Connect runs the Flight data plane
    finally:
        runtime.close()
