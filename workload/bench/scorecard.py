"""The scorecard: every run's figures, the two ratios the product rests on, and what makes it reproducible."""

from __future__ import annotations

import math
from typing import Any

from workload.bench.profiles import BenchProfile
from workload.bench.results import JOB_LAYOUT_MODE, MODES, ModeRun
from workload.bench.stats import DEFINITIONS, summarise

SCHEMA_VERSION = 1
TARGET_CONTINUOUS_OVER_SYNCHRONOUS = 2.0
TARGET_JOB_OVER_CONTINUOUS = 0.9
TARGET_JOB_STARTUP_OVER_ENGINE = 1.3  # at most: the job's start-up over a bare vllm.LLM's, both to first token
TARGET_JOB_PEAK_MEMORY_OVER_ENGINE = 1.3  # at most: the job's peak summed PSS over the bare engine's
RATIO_BASIS = "output_tokens_per_s"  # both throughput ratios compare steady-state output tokens/s on the bimodal point


def _ratio(runs: dict[str, dict[str, Any]], top: str, bottom: str) -> float | None:
    if top not in runs or bottom not in runs:
        return None
    numerator = runs[top].get(RATIO_BASIS, math.nan)
    denominator = runs[bottom].get(RATIO_BASIS, math.nan)
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return float(numerator / denominator)


# Whose start-up the scorecard reports: the engine group's (one engine serves both engine modes), the same bare
# engine's in the job's process layout (the like-for-like baseline), and the job's.
STARTUP_MODES = (("engine", "continuous"), ("engine_job_layout", JOB_LAYOUT_MODE), ("job", "job"))


def _quotient(top: float | None, bottom: float | None) -> float | None:
    if top is None or not bottom or math.isnan(top) or math.isnan(bottom):
        return None
    return float(top / bottom)


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
    summaries = [summarise(run, profile.engine.unsized_max_num_seqs) for run in runs]
    by_point: dict[str, dict[str, dict[str, Any]]] = {}
    for summary in summaries:
        by_point.setdefault(summary["point"], {})[summary["mode"]] = summary
    headline = by_point.get("bimodal", {})
    continuous_over_synchronous = _ratio(headline, "continuous", "synchronous")
    job_over_continuous = _ratio(headline, "job", "continuous")
    startup = {group: headline[mode].get("startup") for group, mode in STARTUP_MODES if mode in headline}
    job_startup_over_engine_startup = _quotient(
        (startup.get("job") or {}).get("total_s"), (startup.get("engine") or {}).get("total_s")
    )
    job_peak_memory_over_engine = _quotient(
        headline.get("job", {}).get("peak_memory_gib"), headline.get("continuous", {}).get("peak_memory_gib")
    )
    # Like for like: the bare engine in the job's process layout. The targets are judged on these where they ran;
    # the default-layout ratios above flatter the job on the CPU (its one-process engine core against two).
    like = {
        "job_over_continuous": _ratio(headline, "job", JOB_LAYOUT_MODE),
        "job_startup_over_engine_startup": _quotient(
            (startup.get("job") or {}).get("total_s"), (startup.get("engine_job_layout") or {}).get("total_s")
        ),
        "job_peak_memory_over_engine": _quotient(
            headline.get("job", {}).get("peak_memory_gib"), headline.get(JOB_LAYOUT_MODE, {}).get("peak_memory_gib")
        ),
    }
    judged = {
        "job_over_continuous": like["job_over_continuous"] or job_over_continuous,
        "job_startup_over_engine_startup": like["job_startup_over_engine_startup"] or job_startup_over_engine_startup,
        "job_peak_memory_over_engine": like["job_peak_memory_over_engine"] or job_peak_memory_over_engine,
    }
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
        "job_startup_over_engine_startup": job_startup_over_engine_startup,
        "job_peak_memory_over_engine": job_peak_memory_over_engine,
        "like_for_like": like,
        "baseline": f"the bare engine in the job's process layout ({JOB_LAYOUT_MODE}); the default-layout ratios "
        "compare with the bare engine in vLLM's own layout",
        "startup": startup,
        "targets": {
            "continuous_over_synchronous": TARGET_CONTINUOUS_OVER_SYNCHRONOUS,
            "job_over_continuous": TARGET_JOB_OVER_CONTINUOUS,
            "job_startup_over_engine_startup": TARGET_JOB_STARTUP_OVER_ENGINE,
            "job_peak_memory_over_engine": TARGET_JOB_PEAK_MEMORY_OVER_ENGINE,
        },
        "targets_met": {
            "continuous_over_synchronous": continuous_over_synchronous is not None
            and continuous_over_synchronous >= TARGET_CONTINUOUS_OVER_SYNCHRONOUS,
            "job_over_continuous": judged["job_over_continuous"] is not None
            and judged["job_over_continuous"] >= TARGET_JOB_OVER_CONTINUOUS,
            "job_startup_over_engine_startup": judged["job_startup_over_engine_startup"] is not None
            and judged["job_startup_over_engine_startup"] <= TARGET_JOB_STARTUP_OVER_ENGINE,
            "job_peak_memory_over_engine": judged["job_peak_memory_over_engine"] is not None
            and judged["job_peak_memory_over_engine"] <= TARGET_JOB_PEAK_MEMORY_OVER_ENGINE,
        },
        "ratio_basis": f"steady-state {RATIO_BASIS} on the bimodal point",
        "other_ratio_bases": {
            "job_startup_over_engine_startup": "process start -> first token, job worker over engine worker",
            "job_peak_memory_over_engine": "peak summed PSS of the process tree on the bimodal point, job over "
            "continuous (CPU; NVML device memory on a GPU)",
        },
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
