"""`bench --repeat N`: N full rounds, each a complete single run in `round-k/`, and one scorecard over them.

On a 2-core machine shared with other work a single run's figures move by 20-30%, so one round's ratio can land on
either side of its target. The combined scorecard keeps every round's value of every ratio, their median and spread
(min, max), and judges each target on the median: not on the best round, not on the last. A round that did not
measure a ratio (its group failed, or its scorecard predates the field) counts as not measured, not as zero.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from workload.bench import runner
from workload.bench import scorecard as scorecard_module
from workload.bench.profiles import BenchProfile
from workload.bench.progress import say
from workload.bench.results import MODES

SCHEMA_VERSION = 1
# name -> (target, direction); the targets are the single-run scorecard's, so both judge the same line.
RATIOS: dict[str, tuple[float, str]] = {
    "continuous_over_synchronous": (scorecard_module.TARGET_CONTINUOUS_OVER_SYNCHRONOUS, "at_least"),
    "job_over_continuous": (scorecard_module.TARGET_JOB_OVER_CONTINUOUS, "at_least"),
    "job_startup_over_engine_startup": (scorecard_module.TARGET_JOB_STARTUP_OVER_ENGINE, "at_most"),
    "job_peak_memory_over_engine": (scorecard_module.TARGET_JOB_PEAK_MEMORY_OVER_ENGINE, "at_most"),
}
_SYMBOL = {"at_least": ">=", "at_most": "<="}


def _judged(scorecard: dict[str, Any], name: str) -> Any:
    like = (scorecard.get("like_for_like") or {}).get(name)
    return like if like is not None else scorecard.get(name)


def round_dir(number: int) -> str:
    return f"round-{number}"


def _met(value: float | None, target: float, direction: str) -> bool:
    if value is None:
        return False
    return value >= target if direction == "at_least" else value <= target


def _ratio(values: list[float | None], target: float, direction: str) -> dict[str, Any]:
    measured = [value for value in values if value is not None]
    median = statistics.median(measured) if measured else None
    return {
        "median": median,
        "min": min(measured) if measured else None,
        "max": max(measured) if measured else None,
        "values": values,
        "target": target,
        "direction": direction,
        "target_met": _met(median, target, direction),
    }


def _bimodal_throughput(scorecard: dict[str, Any]) -> dict[str, float | None]:
    return {
        run["mode"]: run.get("output_tokens_per_s")
        for run in scorecard.get("runs", [])
        if run.get("point") == "bimodal"
    }


def combine(round_scorecards: list[dict[str, Any]]) -> dict[str, Any]:
    """The combined scorecard of rounds 1..N (in order): every ratio's values, median, spread and verdict."""
    if not round_scorecards:
        raise ValueError("combine needs at least one round's scorecard")
    ratios = {}
    for name, (target, direction) in RATIOS.items():
        # A round's like-for-like figure where it has one (what its targets were judged on), else the default one.
        values = [_number(_judged(scorecard, name)) for scorecard in round_scorecards]
        ratios[name] = _ratio(values, target, direction)
    per_round = [
        {
            "round": number,
            "dir": round_dir(number),
            "started_utc": scorecard.get("reproducibility", {}).get("started_utc"),
            "bimodal_output_tokens_per_s": _bimodal_throughput(scorecard),
            "errors": scorecard.get("errors", {}),
        }
        for number, scorecard in enumerate(round_scorecards, start=1)
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "profile": round_scorecards[0].get("profile"),
        "rounds": len(round_scorecards),
        "round_dirs": [each["dir"] for each in per_round],
        "summary": "each ratio's median over the rounds that measured it, (min, max) its spread; "
        "targets judged on the median",
        "ratios": ratios,
        "per_round": per_round,
        "errors": {
            f"{each['dir']}/{group}": error for each in per_round for group, error in (each["errors"] or {}).items()
        },
        "reproducibility": round_scorecards[0].get("reproducibility", {}),
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _verdict(ratio: dict[str, Any]) -> str:
    return "met" if ratio["target_met"] else ("not measured" if ratio["median"] is None else "NOT met")


def ratio_lines(combined: dict[str, Any]) -> list[str]:
    """One line per ratio, for the terminal."""
    lines = []
    for name, ratio in combined["ratios"].items():
        measured = sum(value is not None for value in ratio["values"])
        lines.append(
            f"{name}: median {_fmt(ratio['median'], '.3f')} "
            f"(min {_fmt(ratio['min'], '.3f')}, max {_fmt(ratio['max'], '.3f')}, "
            f"{measured} of {combined['rounds']} rounds), "
            f"target {_SYMBOL[ratio['direction']]} {ratio['target']}: {_verdict(ratio)}"
        )
    return lines


def combined_markdown(combined: dict[str, Any]) -> str:
    rounds = range(1, combined["rounds"] + 1)
    planned = combined.get("rounds_planned", combined["rounds"])
    stopped = f" of {planned} planned" if planned > combined["rounds"] else ""
    lines = [
        f"# Benchmark scorecard: profile `{combined['profile']}`, {combined['rounds']} rounds{stopped}",
        "",
        "Each ratio's median over the rounds that measured it; the targets are judged on the median.",
        "",
        "| ratio | target | median | min-max | " + " | ".join(f"round {number}" for number in rounds) + " | met? |",
        "|" + "---|" * (5 + combined["rounds"]),
    ]
    for name, ratio in combined["ratios"].items():
        spread = "-" if ratio["min"] is None else f"{ratio['min']:.3f}-{ratio['max']:.3f}"
        cells = [
            name,
            f"{_SYMBOL[ratio['direction']]} {ratio['target']}",
            _fmt(ratio["median"], ".3f"),
            spread,
            *(_fmt(value, ".3f") for value in ratio["values"]),
            _verdict(ratio),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Output tokens/s on the bimodal point (steady state), per mode and round:",
        "",
        "| mode | " + " | ".join(f"round {number}" for number in rounds) + " |",
        "|" + "---|" * (1 + combined["rounds"]),
    ]
    throughput = [each["bimodal_output_tokens_per_s"] for each in combined["per_round"]]
    modes = [mode for mode in MODES if any(mode in each for each in throughput)]
    for mode in modes:
        lines.append(f"| {mode} | " + " | ".join(_fmt(each.get(mode), ".0f") for each in throughput) + " |")
    lines += ["", "Rounds:", ""]
    for each in combined["per_round"]:
        started = f", started {each['started_utc']}" if each.get("started_utc") else ""
        lines.append(f"- [round {each['round']}]({each['dir']}/scorecard.md){started}")
    if combined["errors"]:
        lines += ["", "Errors:", ""] + [f"- {where}: {error}" for where, error in combined["errors"].items()]
    repro = combined["reproducibility"]
    versions = ", ".join(f"{name} {version}" for name, version in (repro.get("versions") or {}).items())
    lines += [
        "",
        f"Command: `{repro.get('command', '')}` (commit {repro.get('commit') or 'unknown'}); versions: {versions}",
        "",
    ]
    return "\n".join(lines)


def write_combined(combined: dict[str, Any], out: Path) -> None:
    (out / "scorecard.json").write_text(json.dumps(combined, indent=2, allow_nan=False))
    (out / "scorecard.md").write_text(combined_markdown(combined))


def run_rounds(profile: BenchProfile, out: Path, model_cache: Path, repeat: int) -> dict[str, Any]:
    """`repeat` full runs of the profile, round k into `out/round-k/`, then the combined scorecard in `out/`."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    out.mkdir(parents=True, exist_ok=True)
    scorecards: list[dict[str, Any]] = []
    combined: dict[str, Any] = {}
    for number in range(1, repeat + 1):
        say(f"round {number}/{repeat} into {out / round_dir(number)}")
        scorecards.append(runner.run_bench(profile, out / round_dir(number), model_cache).scorecard)
        # Written after every round: a run stopped part way still leaves the combined figures of the rounds it did.
        combined = {**combine(scorecards), "rounds_planned": repeat}
        write_combined(combined, out)
    return combined
