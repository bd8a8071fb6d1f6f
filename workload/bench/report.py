"""The scorecard as a markdown table, and the short summary printed at the end of a run."""

from __future__ import annotations

import math
from typing import Any

_COLUMNS = (
    ("point", "point", "{}"),
    ("mode", "mode", "{}"),
    ("requests_per_s", "req/s", "{:.2f}"),
    ("output_tokens_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p95_s", "TTFT p95 s", "{:.2f}"),
    ("itl_p95_s", "ITL p95 ms", "ms"),
    ("e2e_p95_s", "E2E p95 s", "{:.2f}"),
    ("queue_p50_s", "queue p50 s", "{:.2f}"),
    ("queue_p95_s", "queue p95 s", "{:.2f}"),
    ("occupancy", "occupancy", "{:.0%}"),
    ("failures", "failures", "{}"),
    ("peak_memory_gib", "peak mem GiB", "{:.1f}"),
    ("startup_s", "start-up s", "{:.1f}"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "ms":
        return f"{value * 1000:.1f}"
    return fmt.format(value)


def _ratio_line(name: str, value: float | None, target: float, at_most: bool = False) -> str:
    shown = "not measured" if value is None else f"**{value:.2f}**"
    met = value is not None and (value <= target if at_most else value >= target)
    verdict = "" if value is None else (" (target met)" if met else " (target missed)")
    return f"- {name}: {shown}, target {'<=' if at_most else '>='} {target}{verdict}"


def _by_process(scorecard: dict[str, Any], key: str, title: str, top: int) -> list[str]:
    """A titled list, one line per mode of the bimodal point, of the `top` largest process roles under `key`."""
    runs = [run for run in scorecard["runs"] if run["point"] == "bimodal" and run.get(key)]
    if not runs:
        return []
    lines = ["", f"{title}:", ""]
    for run in runs:
        parts = list(run[key].items())[:top]
        lines.append(f"- {run['mode']}: " + ", ".join(f"{role} {value:g}" for role, value in parts))
    return lines


def _startup_lines(startup: dict[str, Any]) -> list[str]:
    lines = []
    for group, figures in startup.items():
        if not figures:
            continue
        phases = ", ".join(
            f"{name} {_cell(seconds, '{:.1f}')}" for name, seconds in figures.get("phases_s", {}).items()
        )
        lines.append(f"- {group}: **{_cell(figures.get('total_s'), '{:.1f}')} s** ({phases})")
    return lines


def _like_for_like_lines(scorecard: dict[str, Any]) -> list[str]:
    """The same three job ratios against the bare engine in the job's process layout: what the targets judge."""
    like = scorecard.get("like_for_like") or {}
    if not any(value is not None for value in like.values()):
        return []
    targets = scorecard["targets"]
    return [
        "",
        f"Like for like ({scorecard.get('baseline', 'the bare engine in the job process layout')}; the targets "
        "are judged on these):",
        "",
        _ratio_line("job / continuous", like.get("job_over_continuous"), targets["job_over_continuous"]),
        _ratio_line(
            "job start-up / engine start-up",
            like.get("job_startup_over_engine_startup"),
            targets.get("job_startup_over_engine_startup", 1.3),
            at_most=True,
        ),
        _ratio_line(
            "job peak memory / engine peak memory",
            like.get("job_peak_memory_over_engine"),
            targets.get("job_peak_memory_over_engine", 1.3),
            at_most=True,
        ),
    ]


def markdown(scorecard: dict[str, Any]) -> str:
    repro = scorecard["reproducibility"]
    targets = scorecard["targets"]
    lines = [
        f"# Benchmark scorecard: profile `{scorecard['profile']}`",
        "",
        f"Ratios ({scorecard['ratio_basis']}):",
        "",
        _ratio_line(
            "continuous / synchronous",
            scorecard["continuous_over_synchronous"],
            targets["continuous_over_synchronous"],
        ),
        _ratio_line("job / continuous", scorecard["job_over_continuous"], targets["job_over_continuous"]),
        _ratio_line(
            "job start-up / engine start-up",
            scorecard.get("job_startup_over_engine_startup"),
            targets.get("job_startup_over_engine_startup", 1.3),
            at_most=True,
        ),
        _ratio_line(
            "job peak memory / engine peak memory",
            scorecard.get("job_peak_memory_over_engine"),
            targets.get("job_peak_memory_over_engine", 1.3),
            at_most=True,
        ),
        *_like_for_like_lines(scorecard),
        "",
        "| " + " | ".join(header for _, header, _ in _COLUMNS) + " |",
        "|" + "|".join("---" for _ in _COLUMNS) + "|",
    ]
    for run in scorecard["runs"]:
        lines.append("| " + " | ".join(_cell(run.get(key), fmt) for key, _, fmt in _COLUMNS) + " |")
    lines += _by_process(
        scorecard, "cpu_seconds_by_process", "CPU seconds by process during the bimodal point (where the time goes)", 6
    )
    lines += _by_process(
        scorecard,
        "peak_pss_mib_by_process",
        "PSS by process at the peak of the bimodal point (MiB; where the memory goes)",
        12,
    )
    startup = _startup_lines(scorecard.get("startup") or {})
    if startup:
        lines += ["", "Start-up, worker process start to first output token, by phase (seconds):", "", *startup]
    if scorecard["errors"]:
        lines += ["", "Errors:", ""] + [f"- {group}: {error}" for group, error in scorecard["errors"].items()]
    lines += [
        "",
        f"Command: `{repro.get('command', '')}` (commit {repro.get('commit') or 'unknown'})",
        f"Model: {repro['model']} on {repro['device']}; hardware: {repro['hardware'].get('cpu')}, "
        f"{repro['hardware'].get('usable_cores')} cores, {repro['hardware'].get('memory_gib')} GiB"
        + (f", GPUs {repro['hardware']['gpus']}" if repro["hardware"].get("gpus") else ""),
        "Versions: " + ", ".join(f"{name} {version}" for name, version in repro["versions"].items()),
        f"Seed {repro['seed']}; synchronous chunk {repro['synchronous_chunk']}; engine args: `{repro['engine_args']}`",
        "",
        "How each figure is measured (identically in every mode):",
        "",
        *[f"- {name}: {text}" for name, text in scorecard["measurement"].items()],
        "",
    ]
    return "\n".join(lines)


def terminal_summary(scorecard: dict[str, Any]) -> str:
    lines = []
    for run in scorecard["runs"]:
        lines.append(
            f"{run['point']:>10} {run['mode']:>12}: "
            f"{_cell(run.get('output_tokens_per_s'), '{:.0f}'):>7} out tok/s, "
            f"{_cell(run.get('requests_per_s'), '{:.2f}'):>6} req/s, "
            f"failures {run['failures']}"
        )
    for name in (
        "continuous_over_synchronous",
        "job_over_continuous",
        "job_startup_over_engine_startup",
        "job_peak_memory_over_engine",
    ):
        value = scorecard.get(name)
        lines.append(f"{name}: {'not measured' if value is None else f'{value:.2f}'}")
    for name, value in (scorecard.get("like_for_like") or {}).items():
        lines.append(f"{name} (like for like, judged): {'not measured' if value is None else f'{value:.2f}'}")
    return "\n".join(lines)
