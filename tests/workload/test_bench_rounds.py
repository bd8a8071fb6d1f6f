"""`bench --repeat N`: the combined scorecard's arithmetic on hand-made round scorecards (every median and spread
worked out by hand), the verdicts judged on the median, and the command's path through its rounds. No engine and no
Ray: a round's own figures are the single-run scorecard's, which test_bench_scorecard.py and the slow smoke run
test_bench_smoke.py cover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workload.bench import runner
from workload.bench.rounds import RATIOS, combine, combined_markdown, ratio_lines
from workload.cli import commands as workload_cli


def _round(
    number: int,
    ratios: dict[str, float | None],
    throughput: dict[str, float] | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A round's scorecard as `run_bench` writes it, cut to the fields the combined scorecard reads; a ratio left
    out of `ratios` is a field the round's scorecard does not have."""
    throughput = throughput or {"synchronous": 100.0, "continuous": 250.0, "job": 230.0}
    runs = [{"point": "bimodal", "mode": mode, "output_tokens_per_s": value} for mode, value in throughput.items()]
    runs.append({"point": "long=128", "mode": "continuous", "output_tokens_per_s": 999.0})  # not the bimodal point
    return {
        "schema_version": 1,
        "profile": "cpu",
        **ratios,
        "runs": runs,
        "errors": errors or {},
        "reproducibility": {
            "command": "python -m workload bench --out out/bench --repeat 3",
            "commit": "abc123",
            "started_utc": f"2026-12-01T0{number}:00:00Z",
            "versions": {"vllm": "0.32.0", "ray": "2.60.0"},
            "hardware": {"cpu": "test", "usable_cores": 2},
        },
    }


ROUNDS = [
    _round(
        1,
        {
            "continuous_over_synchronous": 2.5,
            "job_over_continuous": 0.85,
            "job_startup_over_engine_startup": 1.2,
            "job_peak_memory_over_engine": 1.4,
        },
    ),
    _round(
        2,
        {
            "continuous_over_synchronous": 1.5,
            "job_over_continuous": 0.95,
            "job_startup_over_engine_startup": 1.5,
            "job_peak_memory_over_engine": 1.1,
        },
        throughput={"synchronous": 90.0, "continuous": 200.0},
        errors={"job": "the job worker exited with status 1; its log is above"},
    ),
    _round(
        3,
        {
            "continuous_over_synchronous": 1.9,
            "job_over_continuous": 0.92,
            "job_startup_over_engine_startup": 1.4,
            "job_peak_memory_over_engine": 1.2,
        },
    ),
]


def test_each_ratio_is_the_median_of_its_rounds_with_min_max_and_every_value() -> None:
    ratios = combine(ROUNDS)["ratios"]
    assert set(ratios) == set(RATIOS)
    assert ratios["job_over_continuous"] == {
        "median": 0.92,
        "min": 0.85,
        "max": 0.95,
        "values": [0.85, 0.95, 0.92],
        "target": 0.9,
        "direction": "at_least",
        "target_met": True,
    }
    assert ratios["continuous_over_synchronous"]["median"] == 1.9
    assert (ratios["continuous_over_synchronous"]["min"], ratios["continuous_over_synchronous"]["max"]) == (1.5, 2.5)


def test_targets_are_judged_on_the_median_not_on_the_best_round() -> None:
    ratios = combine(ROUNDS)["ratios"]
    # at_least: round 1's 2.5 meets 2.0, the median 1.9 does not.
    assert ratios["continuous_over_synchronous"]["target_met"] is False
    # at_most: round 1's 1.2 meets 1.3, the median 1.4 does not ...
    startup = ratios["job_startup_over_engine_startup"]
    assert (startup["direction"], startup["target"], startup["median"]) == ("at_most", 1.3, 1.4)
    assert startup["target_met"] is False
    # ... and round 1's 1.4 misses 1.3 while the median 1.2 meets it.
    memory = ratios["job_peak_memory_over_engine"]
    assert (memory["median"], memory["target_met"]) == (1.2, True)


def test_a_round_that_did_not_measure_a_ratio_is_left_out_of_its_median() -> None:
    rounds = [
        _round(1, {"job_over_continuous": 0.8, "job_startup_over_engine_startup": None}),
        _round(2, {"job_over_continuous": None}),  # its job group failed: the scorecard holds null
        _round(3, {"job_over_continuous": 1.0}),  # and no startup field at all (a scorecard from before it)
    ]
    ratios = combine(rounds)["ratios"]
    joc = ratios["job_over_continuous"]
    assert joc["values"] == [0.8, None, 1.0]
    assert joc["median"] == pytest.approx(0.9) and (joc["min"], joc["max"]) == (0.8, 1.0)  # two: their mean
    assert joc["target_met"] is True
    startup = ratios["job_startup_over_engine_startup"]
    assert startup["values"] == [None, None, None]
    assert (startup["median"], startup["min"], startup["max"], startup["target_met"]) == (None, None, None, False)
    combined = combine(rounds)
    assert "job_startup_over_engine_startup: median - (min -, max -, 0 of 3 rounds), target <= 1.3: not measured" in (
        ratio_lines(combined)
    )
    assert "| job_startup_over_engine_startup | <= 1.3 | - | - | - | - | - | not measured |" in combined_markdown(
        combined
    )


def test_per_round_figures_errors_and_the_first_rounds_reproducibility() -> None:
    combined = combine(ROUNDS)
    assert combined["schema_version"] == 1 and combined["profile"] == "cpu"
    assert combined["rounds"] == 3 and combined["round_dirs"] == ["round-1", "round-2", "round-3"]
    first, second, _ = combined["per_round"]
    assert first["bimodal_output_tokens_per_s"] == {"synchronous": 100.0, "continuous": 250.0, "job": 230.0}
    assert second["bimodal_output_tokens_per_s"] == {"synchronous": 90.0, "continuous": 200.0}
    assert [each["started_utc"] for each in combined["per_round"]] == [
        "2026-12-01T01:00:00Z",
        "2026-12-01T02:00:00Z",
        "2026-12-01T03:00:00Z",
    ]
    assert second["errors"] == {"job": "the job worker exited with status 1; its log is above"}
    assert combined["errors"] == {"round-2/job": "the job worker exited with status 1; its log is above"}
    assert combined["reproducibility"]["commit"] == "abc123"
    json.dumps(combined, allow_nan=False)  # strict JSON, as the single-run scorecard


def test_the_table_shows_every_round_value_the_spread_the_verdicts_and_links() -> None:
    text = combined_markdown(combine(ROUNDS))
    for value in ("0.850", "0.950", "0.920", "2.500", "1.500", "1.900", "1.200", "1.400", "1.100"):
        assert value in text
    row = next(line for line in text.splitlines() if line.startswith("| job_over_continuous"))
    assert row == "| job_over_continuous | >= 0.9 | 0.920 | 0.850-0.950 | 0.850 | 0.950 | 0.920 | met |"
    startup = next(line for line in text.splitlines() if line.startswith("| job_startup_over_engine_startup"))
    assert startup.startswith("| job_startup_over_engine_startup | <= 1.3 | 1.400 |") and startup.endswith(
        "| NOT met |"
    )
    assert "| job | 230 | - | 230 |" in text  # round 2 measured no job
    for number in (1, 2, 3):
        assert f"[round {number}](round-{number}/scorecard.md)" in text
    assert "round-2/job: the job worker exited" in text
    assert "`python -m workload bench --out out/bench --repeat 3` (commit abc123)" in text
    assert "vllm 0.32.0" in text
    lines = ratio_lines(combine(ROUNDS))
    assert len(lines) == len(RATIOS)
    assert "job_over_continuous: median 0.920 (min 0.850, max 0.950, 3 of 3 rounds), target >= 0.9: met" in lines


@pytest.fixture
def fake_rounds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stands in for `run_bench`, whose real engine rounds the slow smoke test (test_bench_smoke.py) covers: each
    call writes a small round scorecard into the folder it is given, and the folders are recorded in call order."""
    used: list[Path] = []

    def fake_run_bench(profile: Any, out: Path, model_cache: Path, groups: tuple[str, ...] = ()) -> runner.BenchOutputs:
        used.append(out)
        number = len(used)
        scorecard = _round(number, {"job_over_continuous": 0.88 + 0.02 * number, "continuous_over_synchronous": 2.1})
        out.mkdir(parents=True, exist_ok=True)
        (out / "scorecard.json").write_text(json.dumps(scorecard))
        (out / "scorecard.md").write_text(f"round {number}\n")
        return runner.BenchOutputs(scorecard, out / "scorecard.json", out / "scorecard.md", [])

    monkeypatch.setattr(runner, "run_bench", fake_run_bench)
    return used


def test_repeat_runs_every_round_into_its_own_folder_and_writes_the_combined_scorecard(
    tmp_path: Path, fake_rounds: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    assert workload_cli.main(["bench", "--out", str(out), "--repeat", "3"]) == 0
    assert fake_rounds == [out / "round-1", out / "round-2", out / "round-3"]
    for number in (1, 2, 3):
        assert (out / f"round-{number}" / "scorecard.json").is_file()
    combined = json.loads((out / "scorecard.json").read_text())
    assert combined["rounds"] == 3 and combined["rounds_planned"] == 3
    assert combined["round_dirs"] == ["round-1", "round-2", "round-3"]
    joc = combined["ratios"]["job_over_continuous"]
    assert joc["values"] == pytest.approx([0.90, 0.92, 0.94]) and joc["median"] == pytest.approx(0.92)
    assert joc["target_met"] is True
    assert "[round 3](round-3/scorecard.md)" in (out / "scorecard.md").read_text()
    printed = capsys.readouterr().out
    assert "job_over_continuous: median 0.920" in printed and str(out / "scorecard.json") in printed


def test_a_round_with_errors_makes_the_exit_code_1(
    tmp_path: Path, fake_rounds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = runner.run_bench

    def second_round_fails(profile: Any, out: Path, model_cache: Path) -> runner.BenchOutputs:
        outputs = fake(profile, out, model_cache)
        if out.name == "round-2":
            outputs.scorecard["errors"] = {"engine": "the engine worker exited with status 1"}
        return outputs

    monkeypatch.setattr(runner, "run_bench", second_round_fails)
    out = tmp_path / "bench"
    assert workload_cli.main(["bench", "--out", str(out), "--repeat", "2"]) == 1
    assert json.loads((out / "scorecard.json").read_text())["errors"] == {
        "round-2/engine": "the engine worker exited with status 1"
    }


def test_repeat_1_is_the_single_run_straight_into_out(tmp_path: Path, fake_rounds: list[Path]) -> None:
    assert workload_cli.main(["bench", "--out", str(tmp_path), "--repeat", "1"]) == 0
    assert fake_rounds == [tmp_path]
    assert json.loads((tmp_path / "scorecard.json").read_text())["profile"] == "cpu"  # the round's own scorecard


@pytest.mark.parametrize("repeat", ["0", "-2"])
def test_repeat_below_1_is_refused(tmp_path: Path, fake_rounds: list[Path], repeat: str) -> None:
    with pytest.raises(SystemExit, match=f"--repeat must be at least 1 \\(the number of full runs\\), got {repeat}"):
        workload_cli.main(["bench", "--out", str(tmp_path), "--repeat", repeat])
    assert fake_rounds == []


def test_repeat_is_refused_with_the_scale_profile(tmp_path: Path, fake_rounds: list[Path]) -> None:
    with pytest.raises(SystemExit, match="--repeat is for the engine-comparison profiles; 'scale' is a scale run"):
        workload_cli.main(["bench", "--profile", "scale", "--out", str(tmp_path), "--repeat", "3"])
    assert fake_rounds == []
