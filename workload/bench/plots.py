"""PNG plots: throughput against decode length for the three modes, and latency distributions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on batch hosts; must precede pyplot's import

import matplotlib.pyplot as plt

from workload.bench.results import MODES, ModeRun
from workload.bench.stats import ready_time

_STYLE = {"synchronous": "tab:red", "continuous": "tab:blue", "job": "tab:green"}


def plot_throughput(scorecard: dict[str, Any], path: Path) -> Path:
    """Steady-state output tokens/s against the long-decode length (the sweep; the bimodal point apart)."""
    rows = scorecard["sweep"]
    sweep = [row for row in rows if row["point"] != "bimodal"] or rows
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in MODES:
        points = [(row["long_tokens"], row[mode]) for row in sweep if row.get(mode)]
        if points:
            xs, ys = zip(*points, strict=True)
            left.plot(xs, ys, marker="o", color=_STYLE[mode], label=mode)
        bimodal = next((row for row in rows if row["point"] == "bimodal" and row.get(mode)), None)
        if bimodal is not None and sweep is not rows:
            left.scatter([bimodal["long_tokens"]], [bimodal[mode]], marker="*", s=140, color=_STYLE[mode])
    left.set_xlabel("long-decode length (tokens); * = bimodal point at its mean")
    left.set_ylabel("output tokens/s (steady state)")
    left.set_title("Throughput vs decode length")
    left.legend()
    left.grid(alpha=0.3)
    for name, color in (("continuous_over_synchronous", "tab:blue"), ("job_over_continuous", "tab:green")):
        points = [(row["long_tokens"], row[name]) for row in sweep if row.get(name)]
        if points:
            xs, ys = zip(*points, strict=True)
            right.plot(xs, ys, marker="o", color=color, label=name.replace("_over_", " / "))
    for target in scorecard["targets"].values():
        right.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    right.set_xlabel("long-decode length (tokens)")
    right.set_ylabel("ratio")
    right.set_title("Ratios (dashed: targets)")
    right.legend()
    right.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _ecdf(axis: Any, values: list[float], label: str, color: str) -> None:
    if not values:
        return
    ordered = sorted(values)
    axis.step(
        ordered,
        [(index + 1) / len(ordered) for index in range(len(ordered))],
        where="post",
        label=label,
        color=color,
    )


def plot_latency(runs: list[ModeRun], point: str, path: Path) -> Path:
    """Cumulative distributions of TTFT, end-to-end latency and inter-token latency at one point, per mode."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for run in runs:
        if run.point != point:
            continue
        ready = ready_time(run)
        ok = [record for record in run.records if record.ok]
        color = _STYLE.get(run.mode, "black")
        _ecdf(axes[0], [r.first_token - ready for r in ok], run.mode, color)
        _ecdf(axes[1], [r.last_token - ready for r in ok], run.mode, color)
        itl = [1000 * (r.last_token - r.first_token) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
        _ecdf(axes[2], itl, run.mode, color)
    for axis, title, unit in zip(
        axes,
        ("Time to first token", "End-to-end latency", "Inter-token latency (per-request mean)"),
        ("s from ready", "s from ready", "ms"),
        strict=True,
    ):
        axis.set_title(f"{title} ({point})")
        axis.set_xlabel(unit)
        axis.set_ylabel("share of requests")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
