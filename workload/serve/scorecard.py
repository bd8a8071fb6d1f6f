"""The serving scorecard: `vllm bench serve` results of every target and rate, the issue's two targets, a plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on batch hosts; must precede pyplot's import

import matplotlib.pyplot as plt

from workload.serve.bench_profiles import NATIVE, ServeBenchProfile

# Ray Serve LLM against native vLLM (issue 22): throughput at saturation, p99 TTFT at the middle rate.
MIN_THROUGHPUT_RATIO = 0.9
MAX_TTFT_P99_RATIO = 1.25

_METRICS = {
    "request_throughput": "req/s",
    "output_throughput": "out tok/s",
    "p50_ttft_ms": "TTFT p50 ms",
    "p99_ttft_ms": "TTFT p99 ms",
    "p95_itl_ms": "ITL p95 ms",
    "p95_e2el_ms": "E2E p95 ms",
}


def _point(raw: dict[str, Any]) -> dict[str, Any]:
    if "error" in raw and "completed" not in raw:
        return {"error": raw["error"]}
    sent = int(raw.get("num_prompts", 0))
    completed = int(raw.get("completed", 0))
    point: dict[str, Any] = {name: raw.get(name) for name in _METRICS}
    point.update({"sent": sent, "completed": completed, "failures": sent - completed})
    return point


def build_scorecard(profile: ServeBenchProfile, runs: list[dict[str, Any]]) -> dict[str, Any]:
    targets = {
        run["target"]: {
            "features": run["features"],
            "ready_s": run.get("ready_s"),
            "load_average": run.get("load_average"),
            "error": run["error"],
            "points": {rate: _point(raw) for rate, raw in run["points"].items()},
        }
        for run in runs
    }
    labels = ["inf" if math.isinf(rate) else f"{rate:g}" for rate in profile.rates]
    saturation, middle = labels[-1], labels[(len(labels) - 1) // 2]
    checks = {}
    native = targets.get(NATIVE, {}).get("points", {})
    for name, target in targets.items():
        if name == NATIVE:
            continue
        throughput = _ratio(target["points"].get(saturation), native.get(saturation), "output_throughput")
        ttft = _ratio(target["points"].get(middle), native.get(middle), "p99_ttft_ms")
        checks[name] = {
            f"throughput_ratio_at_{saturation}": throughput,
            "throughput_ok": throughput is not None and throughput >= MIN_THROUGHPUT_RATIO,
            f"ttft_p99_ratio_at_{middle}": ttft,
            "ttft_ok": ttft is not None and ttft <= MAX_TTFT_P99_RATIO,
        }
    return {
        "profile": profile.model_dump(mode="json"),
        "rates": labels,
        "saturation_rate": saturation,
        "middle_rate": middle,
        "targets_required": {"throughput_ratio_min": MIN_THROUGHPUT_RATIO, "ttft_p99_ratio_max": MAX_TTFT_P99_RATIO},
        "results": targets,
        "checks": checks,
        "errors": [f"{name}: {target['error']}" for name, target in targets.items() if target["error"]],
    }


def _ratio(ours: dict[str, Any] | None, native: dict[str, Any] | None, metric: str) -> float | None:
    if not ours or not native or not ours.get(metric) or not native.get(metric):
        return None
    return round(float(ours[metric]) / float(native[metric]), 3)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def render_table(scorecard: dict[str, Any]) -> str:
    header = ["target", "rate", *_METRICS.values(), "failures"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, target in scorecard["results"].items():
        for rate in scorecard["rates"]:
            point = target["points"].get(rate, {"error": target["error"] or "not run"})
            if "error" in point:
                lines.append(f"| {name} | {rate} | " + " | ".join(["-"] * len(_METRICS)) + f" | {point['error']} |")
                continue
            cells = [_cell(point[metric]) for metric in _METRICS]
            lines.append(f"| {name} | {rate} | " + " | ".join(cells) + f" | {point['failures']} |")
    lines.append("")
    for name, check in scorecard["checks"].items():
        lines.append(f"- {name} vs {NATIVE}: " + ", ".join(f"{key} {value}" for key, value in check.items()))
    return "\n".join(lines) + "\n"


def plot_scorecard(scorecard: dict[str, Any], path: Path) -> Path:
    rates = scorecard["rates"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, target in scorecard["results"].items():
        points = [(index, target["points"].get(rate, {})) for index, rate in enumerate(rates)]
        points = [(index, point) for index, point in points if point.get("output_throughput")]
        if not points:
            continue
        xs = [index for index, _ in points]
        left.plot(xs, [point["output_throughput"] for _, point in points], marker="o", label=name)
        right.plot(xs, [point["p99_ttft_ms"] for _, point in points], marker="o", label=name)
    for axis, title, unit in ((left, "Output throughput", "tokens/s"), (right, "TTFT p99", "ms")):
        axis.set_xticks(range(len(rates)), [f"{rate} req/s" if rate != "inf" else "saturation" for rate in rates])
        axis.set_xlabel("offered request rate")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    right.set_yscale("log")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
