"""Settings (:mod:`distfusion.planner.config`): DistributedConfig resolved for a runtime.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

from distfusion import DistributedConfig


def test_a_users_bytes_per_task_turns_the_runtimes_sizes_off():
    class SparkLike:
        bytes_per_task = 256 * 2**20
        wave_bytes_per_task = 2048 * 2**20
        shuffle_bytes_per_task = 64 * 2**20

    runtimes = DistributedConfig().task_estimator(SparkLike())
    assert (runtimes.wave_bytes_per_task, runtimes.shuffle_bytes_per_task) == (2**31, 2**26)
    user = DistributedConfig(bytes_per_task=2**20).task_estimator(SparkLike())
    assert (user.bytes_per_task, user.wave_bytes_per_task, user.shuffle_bytes_per_task) == (
        2**20,
        None,
        None,
    )
