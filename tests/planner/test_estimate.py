"""Task sizing (:mod:`distfusion.planner.estimate`): the default task estimator.

See tests/planner/helpers.py for the tables and checks these share.
"""

from __future__ import annotations

import pytest

from distfusion.planner.estimate import DefaultTaskEstimator


def test_wave_sizing_fills_the_slots_then_grows_tasks_in_whole_waves():
    mib = 2**20
    est = DefaultTaskEstimator(256 * mib, wave_bytes_per_task=2048 * mib)
    # Up to the slot count: one task per bytes_per_task, as without waves.
    assert est.shuffle_tasks(100 * mib, 4) == 1
    assert est.shuffle_tasks(1000 * mib, 4) == 4
    # More than the slots would need: 2 GiB tasks, at least one wave, whole waves.
    assert est.shuffle_tasks(1100 * mib, 4) == 4
    assert est.shuffle_tasks(9000 * mib, 2) == 6  # ceil(9000 / 2048) = 5 -> 3 waves of 2
    assert est.leaf_tasks(9000 * mib, 5, 2) == 5  # never more tasks than work units
    assert DefaultTaskEstimator(256 * mib).shuffle_tasks(9000 * mib, 2) == 36
    with pytest.raises(ValueError, match="wave_bytes_per_task"):
        DefaultTaskEstimator(wave_bytes_per_task=0)
    # A stage fed by a shuffle may be sized smaller than a leaf stage.
    split = DefaultTaskEstimator(256 * mib, shuffle_bytes_per_task=64 * mib)
    assert (split.leaf_tasks(200 * mib, 8, 4), split.shuffle_tasks(200 * mib, 4)) == (1, 4)
