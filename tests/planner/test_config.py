"""Settings (:mod:`distfusion.planner.config`): DistributedConfig resolved for a runtime.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import dataclasses

import pytest

from distfusion import DistributedConfig
from distfusion.planner.config import PlannerConfig, RuntimeProfile
from distfusion.planner.estimate import DefaultTaskEstimator

SPARK_LIKE = RuntimeProfile(
    bytes_per_task=256 * 2**20, wave_bytes_per_task=2048 * 2**20, shuffle_bytes_per_task=64 * 2**20
)


def test_a_users_bytes_per_task_turns_the_runtimes_sizes_off():
    runtimes = DistributedConfig().task_estimator(SPARK_LIKE)
    assert (runtimes.wave_bytes_per_task, runtimes.shuffle_bytes_per_task) == (2**31, 2**26)
    user = DistributedConfig(bytes_per_task=2**20).task_estimator(SPARK_LIKE)
    assert (user.bytes_per_task, user.wave_bytes_per_task, user.shuffle_bytes_per_task) == (
        2**20,
        None,
        None,
    )


def test_profile_defaults_are_a_runtime_that_declares_nothing():
    profile = RuntimeProfile()
    assert profile == RuntimeProfile(
        bytes_per_task=DefaultTaskEstimator.bytes_per_task,
        wave_bytes_per_task=None,
        shuffle_bytes_per_task=None,
        max_tasks=None,
        broadcast_copies=None,
        remote_workers=False,
        reads_spark_dataframes=False,
        explain_note="",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.max_tasks = 3  # type: ignore[misc]

    class Bare:  # a runtime written before profiles: the defaults
        def num_workers(self) -> int:
            return 3

    assert RuntimeProfile.of(Bare()) == profile
    config = PlannerConfig.for_runtime(DistributedConfig(), Bare())
    assert (config.workers, config.task_cap, config.broadcast_copies) == (3, 3, None)
    assert not config.remote_workers
    assert config.estimator == DefaultTaskEstimator()


def test_planner_config_takes_the_declared_profile():
    class Declared:
        def num_workers(self) -> int:
            return 2

        def profile(self) -> RuntimeProfile:
            return dataclasses.replace(
                SPARK_LIKE, max_tasks=1024, broadcast_copies=2, remote_workers=True
            )

    config = PlannerConfig.for_runtime(DistributedConfig(), Declared())
    assert (config.workers, config.task_cap, config.broadcast_copies) == (2, 1024, 2)
    assert config.remote_workers
    assert config.estimator == DefaultTaskEstimator(256 * 2**20, None, 2**31, 2**26)


def test_a_broadcast_over_the_classic_bound_must_be_small_next_to_its_probe():
    """Over 100 MiB, a broadcast's copies take at most a quarter of the probe's bytes.

    Every copy builds a hash table of the side; below 100 MiB, moving fewer
    bytes than a shuffle is enough.
    """
    mib, gib = 2**20, 2**30
    config = PlannerConfig(workers=2, max_broadcast_bytes=gib)
    assert config.broadcast_pays(200 * mib, 10 * gib, probe_tasks=2)  # TPC-H Q5 at SF30
    assert not config.broadcast_pays(200 * mib, 1 * gib, probe_tasks=2)  # 400 MiB > 256 MiB
    assert config.broadcast_pays(90 * mib, 200 * mib, probe_tasks=2)  # within 100 MiB
    assert not config.broadcast_pays(2 * gib, 100 * gib, probe_tasks=2)  # over the bound
