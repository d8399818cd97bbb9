"""The planned stage graphs of the 22 TPC-H queries on four workers, against snapshots.

Each ``tests/snapshots/tpch_qNN.txt`` holds the static plan
(``DistributedDataFrame.explain()`` before a run) of query NN over the
scale factor 0.1 data of ``tests/conftest.py``, planned twice: with the
default :class:`~distfusion.DistributedConfig`, and with its byte thresholds
scaled down by ten (the plans the defaults give at scale factor 1, as in
``tests/test_plan_shape.py``: shuffle joins, co-partitioned joins and runtime
filters appear only there). A change to the planner that changes a plan shows
up here as a diff of the explain text.

To accept new plans, regenerate the files and review the diff::

    DISTFUSION_UPDATE_SNAPSHOTS=1 pytest tests/test_tpch_snapshots.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distfusion import DistributedConfig, DistributedContext, tpch
from distfusion.planner.config import MAX_BROADCAST_BYTES
from distfusion.planner.estimate import DefaultTaskEstimator

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("DISTFUSION_UPDATE_SNAPSHOTS") == "1"
WORKERS = 4

CONFIGS = {
    # The stages planned, not the in-place decision (tests/test_in_place.py).
    "default configuration": DistributedConfig(adaptive=False, in_place_bytes=0),
    "byte thresholds / 10": DistributedConfig(
        adaptive=False,
        bytes_per_task=DefaultTaskEstimator.bytes_per_task // 10,
        broadcast_threshold_bytes=DistributedConfig.broadcast_threshold_bytes // 10,
        max_broadcast_bytes=MAX_BROADCAST_BYTES // 10,
        replicate_scan_bytes=DistributedConfig.replicate_scan_bytes // 10,
    ),
}


@pytest.fixture(scope="module")
def contexts(runtime_for, tpch_dir) -> dict[str, DistributedContext]:
    out = {}
    for name, config in CONFIGS.items():
        ctx = DistributedContext(runtime=runtime_for("local", WORKERS), config=config)
        tpch.register_tpch(ctx, tpch_dir)
        out[name] = ctx
    return out


def planned(contexts: dict[str, DistributedContext], q: int) -> str:
    """The snapshot text of query ``q``: its explain text under every configuration."""
    parts = [f"TPC-H Q{q}, {WORKERS} workers, static plan (explain before a run)"]
    for name, ctx in contexts.items():
        parts.append(f"\n===== {name}\n")
        parts.append(ctx.sql(tpch.query(q)).explain())
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize("q", range(1, 23))
def test_tpch_stage_graph_matches_snapshot(contexts, q):
    path = SNAPSHOTS / f"tpch_q{q:02d}.txt"
    text = planned(contexts, q)
    if UPDATE:
        path.write_text(text)
        return
    assert path.exists(), f"no snapshot {path.name}: run with DISTFUSION_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), (
        f"the plan of TPC-H Q{q} changed; if intended, regenerate with "
        "DISTFUSION_UPDATE_SNAPSHOTS=1 and review the diff"
    )
