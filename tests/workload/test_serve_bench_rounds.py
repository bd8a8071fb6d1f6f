"""The repeated serving benchmark's bookkeeping (`bench-serve --repeat N`): the interleaved order, the median and
spread per target and rate, the targets judged on the medians, per-round ratios. Pure functions over `vllm bench
serve` result dicts (vLLM 0.32's field names); no server or engine, which the benchmark itself runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.workload.serve_results import bench_result
from workload.serve.bench_profiles import SERVE_PROFILES, round_orders
from workload.serve.scorecard import build_scorecard, median_point, plot_scorecard, render_table

PROFILE = SERVE_PROFILES["cpu"].model_copy(update={"rates": [2.0, 8.0, math.inf]})
DIRECT = "serve+haproxy+direct"


def _run(target: str, round_number: int, saturation: float, ttft_at_8: float, **points: Any) -> dict[str, Any]:
    return {
        "target": target,
        "round": round_number,
        "features": None if target == "vllm" else {"haproxy": True, "direct_streaming": True},
        "error": None,
        "ready_s": 10.0 * round_number,
        "load_average": {"2": float(round_number), "8": 2.0, "inf": 3.0},
        "points": {
            "2": bench_result(250, 40),
            "8": bench_result(1000, ttft_at_8),
            "inf": bench_result(saturation, 900),
            **points,
        },
    }


def test_rounds_rotate_so_no_target_always_goes_first() -> None:
    assert round_orders(["vllm", DIRECT], 3) == [["vllm", DIRECT], [DIRECT, "vllm"], ["vllm", DIRECT]]
    assert round_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert round_orders(["vllm"], 2) == [["vllm"], ["vllm"]]
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        round_orders(["vllm"], 0)


def test_a_point_is_the_median_of_its_rounds_with_the_spread_and_every_failure() -> None:
    point = median_point(
        [
            {"output_throughput": 3000.0, "p99_ttft_ms": 100.0, "sent": 40, "completed": 40, "failures": 0},
            {"output_throughput": 5000.0, "p99_ttft_ms": 300.0, "sent": 40, "completed": 38, "failures": 2},
            {"output_throughput": 4000.0, "p99_ttft_ms": None, "sent": 40, "completed": 40, "failures": 0},
            {"error": "vllm bench serve exited 1"},
        ]
    )
    assert point["output_throughput"] == 4000.0 and point["spread"]["output_throughput"] == [3000.0, 5000.0]
    assert point["p99_ttft_ms"] == 200.0  # the median of the rounds that measured it (even count: the mean of two)
    assert (point["sent"], point["completed"], point["failures"]) == (120, 118, 2)  # summed, not a median
    assert point["rounds"] == 3 and point["failed_rounds"] == 1
    assert point["errors"] == ["vllm bench serve exited 1"]
    assert median_point([{"error": "a"}, {"error": "a"}, {"error": "b"}]) == {"error": "a; b"}


def test_the_targets_are_judged_on_the_medians_and_each_round_keeps_its_figures(tmp_path: Path) -> None:
    # Native swings 3,000-6,000 tok/s from round to round; Serve follows it at 0.95x in every round.
    runs = [
        _run("vllm", 1, 6000, 50),
        _run(DIRECT, 1, 5700, 60),
        _run(DIRECT, 2, 2850, 70),
        _run("vllm", 2, 3000, 50),
        _run("vllm", 3, 4000, 50),
        _run(DIRECT, 3, 3800, 80),
    ]
    scorecard = build_scorecard(PROFILE, runs, ["vllm", DIRECT])
    assert scorecard["repeat"] == 3 and list(scorecard["results"]) == ["vllm", DIRECT]
    native, serve = scorecard["results"]["vllm"], scorecard["results"][DIRECT]
    assert native["points"]["inf"]["output_throughput"] == 4000.0
    assert native["points"]["inf"]["spread"]["output_throughput"] == [3000.0, 6000.0]
    assert [each["round"] for each in serve["rounds"]] == [1, 2, 3]
    assert serve["rounds"][1]["points"]["inf"]["output_throughput"] == 2850
    assert serve["ready_s"] == 20.0 and serve["load_average"] == {"2": 2.0, "8": 2.0, "inf": 3.0}
    check = scorecard["checks"][DIRECT]
    assert check["throughput_ratio_at_inf"] == 0.95 and check["throughput_ok"]
    assert check["throughput_ratio_at_inf_per_round"] == [0.95, 0.95, 0.95]  # paired within each round
    assert check["ttft_p99_ratio_at_8"] == 1.4 and not check["ttft_ok"]
    assert check["ttft_p99_ratio_at_8_range"] == [1.2, 1.6]
    table = render_table(scorecard)
    assert f"| {DIRECT} | inf | 29.7 (22.3-44.5) | 3,800.0 (2,850.0-5,700.0) |" in table
    assert "Median of 3 interleaved rounds" in table and f"- {DIRECT} round 2: 2: 2.0, 8: 2.0, inf: 3.0" in table
    assert plot_scorecard(scorecard, tmp_path / "plot.png").stat().st_size > 0


def test_a_failed_round_is_reported_and_the_others_still_count() -> None:
    broken = {**_run(DIRECT, 2, 0, 0), "error": "the server exited with 1 before it was ready", "points": {}}
    runs = [_run("vllm", 1, 4000, 50), _run(DIRECT, 1, 3800, 60), broken, _run("vllm", 2, 4000, 50)]
    scorecard = build_scorecard(PROFILE, runs, ["vllm", DIRECT])
    serve = scorecard["results"][DIRECT]
    assert serve["points"]["inf"]["output_throughput"] == 3800.0 and serve["points"]["inf"]["rounds"] == 1
    assert serve["points"]["inf"]["errors"] == ["the server exited with 1 before it was ready"]
    assert scorecard["errors"] == [f"{DIRECT}: round 2: the server exited with 1 before it was ready"]
    assert scorecard["checks"][DIRECT]["throughput_ratio_at_inf_per_round"] == [0.95, None]


def test_one_round_gives_the_single_run_scorecard() -> None:
    runs = [{**_run("vllm", 1, 4000, 50)}, {**_run(DIRECT, 1, 3000, 50)}]
    for run in runs:
        del run["round"]
    scorecard = build_scorecard(PROFILE, runs)
    point = scorecard["results"][DIRECT]["points"]["inf"]
    assert "spread" not in point and point["failures"] == 0 and scorecard["repeat"] == 1
    assert not any(key.endswith("per_round") for key in scorecard["checks"][DIRECT])
    assert f"| {DIRECT} | inf | 23.4 | 3,000.0 |" in render_table(scorecard)
