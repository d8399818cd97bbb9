"""``distfusion bench tpch``: peers, query selection, JSON output and baseline flagging.

Runs on the local runtime over the small generated TPC-H (``tpch_dir``); asserts on
the structure and the flagging logic, never on how fast anything was.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from distfusion import bench
from distfusion.cli import main


def _bench(tpch_dir, tmp_path, *extra: str) -> dict:
    out = tmp_path / "out.json"
    argv = ["bench", "tpch", "--data", str(tpch_dir), "--runtime", "local", "--workers", "2"]
    argv += ["--peers", "datafusion,local", "--queries", "1,6", "--runs", "1", "--json", str(out)]
    assert main([*argv, *extra]) == 0
    return json.loads(out.read_text())


def test_json_holds_every_run_median_and_shape(tpch_dir, tmp_path):
    doc = _bench(tpch_dir, tmp_path)
    assert doc["format"] == bench.JSON_FORMAT
    settings = doc["settings"]
    assert settings["runtime"] == "local"
    assert settings["workers"] == 2 and settings["num_workers"] == 2
    assert settings["queries"] == [1, 6]
    assert settings["peers"] == ["datafusion", "local"]
    assert settings["runs"] == 1
    assert set(doc["queries"]) == {"1", "6"}
    for q in doc["queries"].values():
        assert set(q["engines"]) == {"distfusion", "datafusion", "local"}
        for engine in q["engines"].values():
            assert len(engine["runs_s"]) == 1
            assert engine["median_s"] == engine["runs_s"][0] > 0
            assert engine["peak_extra_bytes"] is None or engine["peak_extra_bytes"] >= 0
        shape = q["shapes"]["distfusion"]
        assert shape["stages"] == len(shape["tasks_per_stage"])
        assert shape["tasks"] == sum(shape["tasks_per_stage"])
        assert set(q["shapes"]) == {"distfusion", "local"}  # DataFusion has no stages
    assert doc["queries"]["1"]["rows"] == 4 and doc["queries"]["6"]["rows"] == 1
    assert all(q["answers_differ"] == [] for q in doc["queries"].values())
    assert doc["total_s"]["distfusion"] == pytest.approx(
        sum(q["engines"]["distfusion"]["median_s"] for q in doc["queries"].values())
    )
    assert set(doc["ratios"]) == {"datafusion", "local"}
    assert doc["git"] is None or len(doc["git"]["commit"]) == 40
    assert "baseline" not in doc


def test_answer_digest_ignores_row_order_and_float_noise_not_values():
    a = pa.table({"k": ["x", "y"], "v": [0.1 + 0.2, 1.0]})
    shuffled = pa.table({"k": ["y", "x"], "v": [1.0, 0.3]})
    assert bench.answer_digest(a) == bench.answer_digest(shuffled)
    assert bench._answers_differ({"datafusion": a, "distfusion": shuffled}) == []
    wrong = pa.table({"k": ["y", "x"], "v": [1.0, 0.31]})
    assert bench._answers_differ({"datafusion": a, "distfusion": wrong}) == ["distfusion"]


def _baseline_doc(medians_s: dict[int, float]) -> dict:
    return {
        "queries": {
            str(q): {"engines": {"distfusion": {"runs_s": [s], "median_s": s}}}
            for q, s in medians_s.items()
        },
        "git": {"commit": "0" * 40, "dirty": False},
    }


def test_baseline_flags_the_slower_query(tpch_dir, tmp_path, capsys):
    # No run takes a nanosecond, and none takes a day: Q1 is slower, Q6 is not.
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(_baseline_doc({1: 1e-9, 6: 86400.0})))
    doc = _bench(tpch_dir, tmp_path, "--baseline", str(path))
    assert doc["baseline"]["slower"] == [1]
    assert doc["baseline"]["queries"]["1"]["slower"] is True
    assert doc["baseline"]["queries"]["6"]["slower"] is False
    assert doc["baseline"]["commit"] == "0" * 40
    assert "1 of 2 queries more than 5% slower than the baseline: Q1" in capsys.readouterr().out


def test_compare_to_baseline_tolerance_and_missing_queries():
    base = _baseline_doc({1: 1.0, 2: 2.0, 3: 1.0})
    rows = bench.compare_to_baseline({1: 1.05, 2: 2.2, 3: 0.5, 4: 1.0}, base)
    assert [(r.query, r.slower) for r in rows] == [(1, False), (2, True), (3, False), (4, False)]
    assert rows[1].ratio == pytest.approx(1.1)
    assert rows[3].baseline_s is None and rows[3].ratio is None
    assert bench.compare_to_baseline({1: 1.05}, base, tolerance=0.01)[0].slower


def test_baseline_that_is_no_bench_result_fails_before_running(tpch_dir, tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"queries": {"1": {"seconds": 1.0}}}))
    argv = ["bench", "tpch", "--data", str(tpch_dir), "--runtime", "local"]
    assert main([*argv, "--baseline", str(path)]) == 1
    assert "distfusion bench --json" in capsys.readouterr().err


def test_peers_and_queries_are_checked():
    assert bench.parse_peers(None, "spark") == ["datafusion", "spark-sql"]
    assert bench.parse_peers(None, "local") == ["datafusion"]
    assert bench.parse_peers("static,local,datafusion", "flight") == [
        "datafusion",
        "local",
        "static",
    ]
    assert bench.parse_peers("", "spark") == []
    with pytest.raises(ValueError, match="unknown peer"):
        bench.parse_peers("datafusion,duckdb", "local")
    with pytest.raises(ValueError, match="--runtime spark"):
        bench.parse_peers("spark-sql", "local")
    with pytest.raises(ValueError, match="spark-connect peer .* --runtime spark"):
        bench.parse_peers("spark-connect", "flight")
    assert bench.parse_peers("spark-connect,spark-sql", "spark") == ["spark-sql", "spark-connect"]
    assert main(["bench", "tpch", "--data", ".", "--queries", "1,23"]) == 1


class _Frame:
    """A stand-in DistributedDataFrame: ``explain()`` text after a run, maybe decisions."""

    def __init__(self, explain: str) -> None:
        self._explain = explain

    def explain(self) -> str:
        return self._explain


def test_adaptive_decisions_from_the_frame_or_the_explain_difference():
    before = "stage 1: 4 tasks\nstage 0: 1 task"
    assert bench.adaptive_decisions(_Frame(before), before) == []
    after = _Frame(before + "\nadaptive: stage 1 coalesced 4 -> 2 partitions")
    assert bench.adaptive_decisions(after, before) == [
        "adaptive: stage 1 coalesced 4 -> 2 partitions"
    ]
    exposed = _Frame(before)
    exposed.adaptive_decisions = lambda: ["join 2 broadcast (12 KiB measured)"]
    assert bench.adaptive_decisions(exposed, before) == ["join 2 broadcast (12 KiB measured)"]
    report = type("Report", (), {"decisions": ["stage 3: 8 -> 2 tasks"]})()
    reported = _Frame(before)
    reported._report = report
    assert bench.adaptive_decisions(reported, before) == ["stage 3: 8 -> 2 tasks"]
    rendered = _Frame("final graph\nAdaptive decisions:\n  - stage 3: 8 -> 2 tasks\nmore")
    assert bench.adaptive_decisions(rendered, before) == ["stage 3: 8 -> 2 tasks"]


def test_peak_memory_sees_what_a_block_allocates():
    assert bench.used_memory_bytes() is not None
    seen = []
    for _ in range(3):  # the machine's memory: other processes free theirs meanwhile too
        with bench.PeakMemory(interval_s=0.05) as peak:
            block = bytearray(400 * 1024 * 1024)  # touched: zero-filled pages count
            block[::4096] = b"x" * len(block[::4096])
        del block
        seen.append(peak.extra_bytes)
        if peak.extra_bytes > 200 * 1024 * 1024:  # wide: other processes move too
            return
    pytest.fail(f"a 400 MiB block was seen as {seen} extra bytes")


def test_memory_per_task_reaches_the_settings(tpch_dir, tmp_path):
    doc = _bench(tpch_dir, tmp_path, "--memory-per-task", "64MiB")
    assert doc["settings"]["memory_per_task_bytes"] == 64 * 1024 * 1024


def test_no_warmup_times_the_first_run_as_one_of_the_runs(tpch_dir, tmp_path, monkeypatch):
    runs = []  # every distfusion run of a query, the first (probe) one included
    call, probe = bench.DistfusionRunner.__call__, bench.DistfusionRunner.probe
    monkeypatch.setattr(
        bench.DistfusionRunner, "__call__", lambda r, sql: runs.append(sql) or call(r, sql)
    )
    monkeypatch.setattr(
        bench.DistfusionRunner, "probe", lambda r, sql: runs.append(sql) or probe(r, sql)
    )
    doc = _bench(tpch_dir, tmp_path, "--runs", "2", "--no-warmup")
    assert doc["settings"]["warmup"] is False
    # two queries, two distfusion engines (distfusion, local), two runs each: no extra warm-up
    assert len(runs) == 2 * 2 * 2
    for q in doc["queries"].values():
        assert q["answers_differ"] == []
        for engine in q["engines"].values():
            assert len(engine["runs_s"]) == 2 and all(t > 0 for t in engine["runs_s"])
    runs.clear()
    doc = _bench(tpch_dir, tmp_path, "--runs", "2")
    assert doc["settings"]["warmup"] is True and len(runs) == 3 * 2 * 2


def test_no_metrics_peer_runs_the_same_plans_without_operator_metrics(tpch_dir, tmp_path):
    doc = _bench(tpch_dir, tmp_path, "--peers", "datafusion,no-metrics")
    for q in doc["queries"].values():
        assert q["answers_differ"] == []
        assert q["shapes"]["no-metrics"] == q["shapes"]["distfusion"]
    assert set(doc["ratios"]) == {"datafusion", "no-metrics"}


def test_flight_peer_runs_on_its_own_worker_processes(tpch_dir, tmp_path):
    doc = _bench(tpch_dir, tmp_path, "--peers", "datafusion,flight")
    for q in doc["queries"].values():
        assert q["answers_differ"] == []
        assert q["engines"]["flight"]["median_s"] > 0
        assert q["shapes"]["flight"]["stages"] >= 1
    assert set(doc["ratios"]) == {"datafusion", "flight"}


def test_the_spark_data_plane_flag_reaches_the_runtime():
    from distfusion.cli import build_parser
    from distfusion.runtime.registry import runtime_options

    argv = ["bench", "tpch", "--data", "d", "--runtime", "spark"]
    assert runtime_options(build_parser().parse_args([*argv, "--data-plane", "shuffle"])) == {
        "progress": False,
        "data_plane": "shuffle",
    }
    assert "data_plane" not in runtime_options(build_parser().parse_args(argv))
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--data-plane", "jvm"])


def test_timed_rounds_alternate_the_engines_order():
    # No engine follows the same one (Spark SQL's JVM work) in every round.
    engines = {"distfusion": 1, "datafusion": 2, "spark-sql": 3}
    rounds = [[e for e, _ in bench._round_order(engines, i)] for i in range(3)]
    assert rounds[0] == rounds[2] == ["distfusion", "datafusion", "spark-sql"]
    assert rounds[1] == ["spark-sql", "datafusion", "distfusion"]
    before = {r[r.index("distfusion") - 1] for r in rounds if r.index("distfusion") > 0}
    assert before == {"datafusion"}
