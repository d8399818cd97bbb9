"""The environment switches (:mod:`distfusion.protocol.environment`).

Read in one place, when a query's settings are resolved (not at import), and
carried to every task in its plan.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.planner.config import PlannerConfig
from distfusion.protocol.environment import EnvironmentSwitches, environment_switches
from distfusion.protocol.task_plan import TaskPlan
from distfusion.worker.stream_inputs import streams_task_inputs

TASK_INPUTS = "DISTFUSION_STREAM_TASK_INPUTS"


@pytest.mark.parametrize(
    ("environ", "switches"),
    [
        ({}, EnvironmentSwitches(stream_exchanges=False, stream_task_inputs=None)),
        ({TASK_INPUTS: ""}, EnvironmentSwitches(stream_task_inputs=None)),
        ({TASK_INPUTS: "1"}, EnvironmentSwitches(stream_task_inputs=True)),
        ({TASK_INPUTS: "0"}, EnvironmentSwitches(stream_task_inputs=False)),
        ({"DISTFUSION_STREAM_EXCHANGES": "1"}, EnvironmentSwitches(stream_exchanges=True)),
        ({"DISTFUSION_STREAM_EXCHANGES": "yes"}, EnvironmentSwitches(stream_exchanges=False)),
    ],
)
def test_environment_switches(environ, switches):
    assert environment_switches(environ) == switches


def test_the_environment_is_read_when_settings_are_resolved_not_at_import(monkeypatch):
    class Two:
        def num_workers(self) -> int:
            return 2

    monkeypatch.delenv(TASK_INPUTS, raising=False)
    assert PlannerConfig.for_runtime(DistributedConfig(), Two()).stream_task_inputs is None
    monkeypatch.setenv(TASK_INPUTS, "1")
    assert PlannerConfig.for_runtime(DistributedConfig(), Two()).stream_task_inputs is True
    # the setting, when given, is not overridden
    given = DistributedConfig(stream_task_inputs=False)
    assert PlannerConfig.for_runtime(given, Two()).stream_task_inputs is False


def test_a_worker_without_the_plans_opinion_reads_its_own_environment(monkeypatch):
    monkeypatch.delenv(TASK_INPUTS, raising=False)
    assert not streams_task_inputs(None)
    assert streams_task_inputs(True)
    monkeypatch.setenv(TASK_INPUTS, "1")
    assert streams_task_inputs(None)
    assert not streams_task_inputs(False)


@pytest.mark.parametrize("setting", [None, True, False])
def test_the_setting_reaches_every_task_in_its_plan(setting, monkeypatch, tmp_path):
    monkeypatch.delenv(TASK_INPUTS, raising=False)
    for i in range(2):
        pq.write_table(pa.table({"k": range(50), "v": [1.0] * 50}), tmp_path / f"{i}.parquet")
    runtime = LocalRuntime(workers=2)
    try:
        config = DistributedConfig(tasks_per_stage=2, stream_task_inputs=setting)
        ctx = DistributedContext(runtime=runtime, config=config)
        ctx.register_parquet("t", str(tmp_path))
        graph = ctx.sql("SELECT k, sum(v) AS s FROM t GROUP BY k").stage_graph()
        assert len(graph.stages) > 1
        for stage in graph.stages:
            assert stage.stream_inputs is setting
            plan = TaskPlan.for_task(graph.query_id, stage, 0, ((),) * len(stage.inputs), 1)
            assert TaskPlan.from_json(plan.to_json()).stream_inputs is setting
    finally:
        runtime.close()


def test_a_plan_with_a_bad_switch_is_not_a_plan():
    stage_plan = TaskPlan.from_json(_any_plan_json())
    assert stage_plan.stream_inputs is None  # a plan from before the field: no opinion
    with pytest.raises(ValueError, match="stream_inputs"):
        TaskPlan.from_json(_any_plan_json(stream_inputs="yes"))


def _any_plan_json(**extra) -> str:
    import json

    runtime = LocalRuntime(workers=1)
    try:
        ctx = DistributedContext(runtime=runtime)
        ctx.register_table("t", pa.table({"k": [1, 2]}))
        graph = ctx.sql("SELECT k FROM t").stage_graph()
    finally:
        runtime.close()
    stage = graph.stages[0]
    doc = json.loads(
        TaskPlan.for_task(graph.query_id, stage, 0, ((),) * len(stage.inputs), 1).to_json()
    )
    doc.pop("stream_inputs")
    doc.update(extra)
    return json.dumps(doc)
