"""The scorecard: every run's figures, the two ratios the product rests on, and what makes it reproducible."""

from __future__ import annotations

import math
from typing import Any

from workload.bench.profiles import BenchProfile
from workload.bench.results import MODES, ModeRun
from workload.bench.stats import DEFINITIONS, summarise

SCHEMA_VERSION = 1
TARGET_CONTINUOUS_OVER_SYNCHRONOUS = 2.0
TARGET_JOB_OVER_CONTINUOUS = 0.9
RATIO_BASIS = "output_tokens_per_s"  # both ratios compare steady-state output tokens/s on the bimodal point


def _ratio(runs: dict[str, dict[str, Any]], top: str, bottom: str) -> float | None:
    if top not in runs or bottom not in runs:
        return None
    numerator = runs[top].get(RATIO_BASIS, math.nan)
    denominator = runs[bottom].get(RATIO_BASIS, math.nan)
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return float(numerator / denominator)


def long_tokens_of(point: str, profile: BenchProfile) -> float:
    """The x of a point on the sweep plot: its long-decode length (the bimodal point: its range's mean)."""
    if point.startswith("long="):
        return float(point.removeprefix("long="))
    return (profile.workload.long_tokens.min + profile.workload.long_tokens.max) / 2


def build_scorecard(
    profile: BenchProfile,
    runs: list[ModeRun],
    *,
    engine_args: dict[str, Any],
    reproducibility: dict[str, Any],
    errors: dict[str, str],
) -> dict[str, Any]:
    summaries = [summarise(run, profile.engine.max_num_seqs) for run in runs]
    by_point: dict[str, dict[str, dict[str, Any]]] = {}
    for summary in summaries:
        by_point.setdefault(summary["point"], {})[summary["mode"]] = summary
    headline = by_point.get("bimodal", {})
    continuous_over_synchronous = _ratio(headline, "continuous", "synchronous")
    job_over_continuous = _ratio(headline, "job", "continuous")
    sweep = [
        {
            "point": point,
            "long_tokens": long_tokens_of(point, profile),
            **{mode: modes[mode].get(RATIO_BASIS) for mode in MODES if mode in modes},
            "continuous_over_synchronous": _ratio(modes, "continuous", "synchronous"),
            "job_over_continuous": _ratio(modes, "job", "continuous"),
        }
        for point, modes in by_point.items()
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "profile": profile.name,
        "continuous_over_synchronous": continuous_over_synchronous,
        "job_over_continuous": job_over_continuous,
        "targets": {
            "continuous_over_synchronous": TARGET_CONTINUOUS_OVER_SYNCHRONOUS,
            "job_over_continuous": TARGET_JOB_OVER_CONTINUOUS,
        },
        "targets_met": {
            "continuous_over_synchronous": continuous_over_synchronous is not None
            and continuous_over_synchronous >= TARGET_CONTINUOUS_OVER_SYNCHRONOUS,
            "job_over_continuous": job_over_continuous is not None
            and job_over_continuous >= TARGET_JOB_OVER_CONTINUOUS,
        },
        "ratio_basis": f"steady-state {RATIO_BASIS} on the bimodal point",
        "measurement": DEFINITIONS,
        "runs": summaries,
        "sweep": sorted(sweep, key=lambda row: (row["point"] != "bimodal", row["long_tokens"])),
        "errors": errors,
        "reproducibility": {
            **reproducibility,
            "engine_args": engine_args,
            "seed": profile.workload.seed,
            "workload": profile.workload.model_dump(mode="json"),
            "sweep_long_tokens": profile.sweep_long_tokens,
            "synchronous_chunk": profile.chunk_size,
            "job": profile.job.model_dump(mode="json"),
            "model": profile.model.name,
            "device": profile.device,
        },
    }
