"""The serving scorecard: `vllm bench serve` results of every target, round and rate, the issue's two targets, a plot.

A repeated run (`bench-serve --repeat N`) keeps every round's figures (`results.TARGET.rounds`) and summarises each
target and rate by the median over its rounds, with the spread (min, max) beside it; the targets are judged on the
medians. One round is the same scorecard with a spread of nothing."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
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


def median_point(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One target's points at one rate, a point per round, summarised: each metric's median over the rounds that
    measured it, `spread` its (min, max), failures summed (a median would hide a round's failures). Rounds whose
    run failed are counted in `failed_rounds` with their errors; only when every round failed is the point an error."""
    measured = [point for point in rounds if "error" not in point]
    errors = [point["error"] for point in rounds if "error" in point]
    if not measured:
        return {"error": "; ".join(dict.fromkeys(errors)) or "not run"}
    point: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for metric in _METRICS:
        values = [float(each[metric]) for each in measured if each.get(metric) is not None]
        point[metric] = statistics.median(values) if values else None
        if values:
            spread[metric] = [min(values), max(values)]
    for count in ("sent", "completed", "failures"):
        point[count] = sum(int(each[count]) for each in measured)
    if len(rounds) > 1:
        point.update({"rounds": len(measured), "spread": spread})
    if errors:
        point.update({"failed_rounds": len(errors), "errors": errors})
    return point


def _median_or_none(values: Iterable[Any]) -> float | None:
    present = [float(value) for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


def _summarise_target(records: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    rounds = [
        {
            "round": record.get("round", number),
            "ready_s": record.get("ready_s"),
            "load_average": record.get("load_average"),
            "error": record["error"],
            "points": {rate: _point(raw) for rate, raw in record["points"].items()},
        }
        for number, record in enumerate(records, start=1)
    ]
    rates = labels + [rate for each in rounds for rate in each["points"] if rate not in labels]
    points = {
        # A round that never reached this rate (its server failed) counts as a failed round here.
        rate: median_point([each["points"].get(rate, {"error": each["error"] or "not run"}) for each in rounds])
        for rate in dict.fromkeys(rates)
        if any(rate in each["points"] for each in rounds)
    }
    prefix = len(rounds) > 1  # name the round only where there are several
    errors = [
        f"round {each['round']}: {each['error']}" if prefix else each["error"] for each in rounds if each["error"]
    ]
    return {
        "features": records[0]["features"],
        "ready_s": _median_or_none(each["ready_s"] for each in rounds),
        "load_average": {
            rate: _median_or_none((each["load_average"] or {}).get(rate) for each in rounds)
            for rate in dict.fromkeys(rate for each in rounds for rate in each["load_average"] or {})
        },
        "error": "; ".join(errors) or None,
        "points": points,
        "rounds": rounds,
    }


def _per_round_ratios(ours: dict[str, Any], native: dict[str, Any], rate: str, metric: str) -> list[float | None]:
    """The ratio within each round: a Serve target and native vLLM measured minutes apart in the same round saw
    much the same load, so the paired ratios show how steady the verdict is apart from the machine's drift."""
    by_round = {each["round"]: each["points"].get(rate) for each in native.get("rounds", [])}
    return [_ratio(each["points"].get(rate), by_round.get(each["round"]), metric) for each in ours["rounds"]]


def _range(values: list[float | None]) -> list[float] | None:
    present = [value for value in values if value is not None]
    return [min(present), max(present)] if present else None


def build_scorecard(
    profile: ServeBenchProfile, runs: list[dict[str, Any]], targets: list[str] | None = None
) -> dict[str, Any]:
    """`runs`: one record per server started (`bench.run_target`), any number of rounds per target; `targets`
    orders the results (default: as first run)."""
    labels = ["inf" if math.isinf(rate) else f"{rate:g}" for rate in profile.rates]
    grouped: dict[str, list[dict[str, Any]]] = {name: [] for name in targets or []}
    for run in runs:
        grouped.setdefault(run["target"], []).append(run)
    results = {name: _summarise_target(records, labels) for name, records in grouped.items() if records}
    saturation, middle = labels[-1], labels[(len(labels) - 1) // 2]
    checks = {}
    native = results.get(NATIVE, {"points": {}, "rounds": []})
    for name, target in results.items():
        if name == NATIVE:
            continue
        throughput = _ratio(target["points"].get(saturation), native["points"].get(saturation), "output_throughput")
        ttft = _ratio(target["points"].get(middle), native["points"].get(middle), "p99_ttft_ms")
        check: dict[str, Any] = {
            f"throughput_ratio_at_{saturation}": throughput,
            "throughput_ok": throughput is not None and throughput >= MIN_THROUGHPUT_RATIO,
            f"ttft_p99_ratio_at_{middle}": ttft,
            "ttft_ok": ttft is not None and ttft <= MAX_TTFT_P99_RATIO,
        }
        if len(target["rounds"]) > 1:
            per_round_throughput = _per_round_ratios(target, native, saturation, "output_throughput")
            per_round_ttft = _per_round_ratios(target, native, middle, "p99_ttft_ms")
            check.update(
                {
                    f"throughput_ratio_at_{saturation}_per_round": per_round_throughput,
                    f"throughput_ratio_at_{saturation}_range": _range(per_round_throughput),
                    f"ttft_p99_ratio_at_{middle}_per_round": per_round_ttft,
                    f"ttft_p99_ratio_at_{middle}_range": _range(per_round_ttft),
                }
            )
        checks[name] = check
    return {
        "profile": profile.model_dump(mode="json"),
        "rates": labels,
        "saturation_rate": saturation,
        "middle_rate": middle,
        "repeat": max((len(target["rounds"]) for target in results.values()), default=0),
        "summary": "median over rounds, spread = (min, max)",
        "targets_required": {"throughput_ratio_min": MIN_THROUGHPUT_RATIO, "ttft_p99_ratio_max": MAX_TTFT_P99_RATIO},
        "results": results,
        "checks": checks,
        "errors": [f"{name}: {target['error']}" for name, target in results.items() if target["error"]],
    }


def _ratio(ours: dict[str, Any] | None, native: dict[str, Any] | None, metric: str) -> float | None:
    if not ours or not native or not ours.get(metric) or not native.get(metric):
        return None
    return round(float(ours[metric]) / float(native[metric]), 3)


def _number(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def _cell(value: Any, spread: list[float] | None = None) -> str:
    if value is None:
        return "-"
    if spread is None or spread[0] == spread[1]:
        return _number(value)
    return f"{_number(value)} ({_number(spread[0])}-{_number(spread[1])})"


def _check_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join("-" if each is None else f"{each:g}" for each in value) + "]"
    return str(value)


def render_table(scorecard: dict[str, Any]) -> str:
    header = ["target", "rate", *_METRICS.values(), "failures"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, target in scorecard["results"].items():
        for rate in scorecard["rates"]:
            point = target["points"].get(rate, {"error": target["error"] or "not run"})
            if "error" in point:
                lines.append(f"| {name} | {rate} | " + " | ".join(["-"] * len(_METRICS)) + f" | {point['error']} |")
                continue
            spread = point.get("spread", {})
            cells = [_cell(point[metric], spread.get(metric)) for metric in _METRICS]
            failures = str(point["failures"])
            if point.get("failed_rounds"):
                failures += f"; {point['failed_rounds']} round(s) failed: {'; '.join(point['errors'])}"
            lines.append(f"| {name} | {rate} | " + " | ".join(cells) + f" | {failures} |")
    lines.append("")
    if scorecard.get("repeat", 1) > 1:
        lines.append(f"Median of {scorecard['repeat']} interleaved rounds per cell, (min-max) over the rounds.")
        lines.append("")
    for name, check in scorecard["checks"].items():
        lines.append(
            f"- {name} vs {NATIVE}: " + ", ".join(f"{key} {_check_value(value)}" for key, value in check.items())
        )
    lines.append("")
    lines.append("Load average (1 min) as each rate started:")
    for name, target in scorecard["results"].items():
        for each in target.get("rounds", []):
            loads = ", ".join(f"{rate}: {load}" for rate, load in (each["load_average"] or {}).items())
            lines.append(f"- {name} round {each['round']}: {loads or '-'}")
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
        for axis, metric in ((left, "output_throughput"), (right, "p99_ttft_ms")):
            medians = [point[metric] for _, point in points]
            # Bars from the median down to the lowest round and up to the highest (none for a single round).
            spreads = [
                point.get("spread", {}).get(metric, [value, value])
                for (_, point), value in zip(points, medians, strict=True)
            ]
            errors = [
                [value - low for value, (low, _) in zip(medians, spreads, strict=True)],
                [high - value for value, (_, high) in zip(medians, spreads, strict=True)],
            ]
            axis.errorbar(xs, medians, yerr=errors, marker="o", capsize=3, label=name)
    for axis, title, unit in ((left, "Output throughput", "tokens/s"), (right, "TTFT p99", "ms")):
        axis.set_xticks(range(len(rates)), [f"{rate} req/s" if rate != "inf" else "saturation" for rate in rates])
        axis.set_xlabel("offered request rate")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    right.set_yscale("log")
    if scorecard.get("repeat", 1) > 1:
        figure.suptitle(f"Median of {scorecard['repeat']} interleaved rounds; bars: lowest to highest round")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
