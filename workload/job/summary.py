"""summary.json: the whole run across all its attempts, as data; and the short human version."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from workload.contract.config import JobConfig
from workload.engine.tiny_model import TINY_MODEL_VERSION
from workload.job.output import ShardCommit, utc_now


def build_summary(config: JobConfig, manifest: dict[str, Any], commits: dict[int, ShardCommit]) -> dict[str, Any]:
    attempts = manifest["attempts"]
    # Wall time is the sum of the attempts' own times: the gap between a kill and the retry is not work.
    wall_s = sum(float(a.get("wall_s") or 0.0) for a in attempts)
    output_tokens = sum(c.output_tokens for c in commits.values())
    error_types: Counter[str] = Counter()
    for commit in commits.values():
        error_types.update(commit.error_types)
    return {
        "rows_in": manifest["rows_in"],
        "rows_ok": sum(c.rows_ok for c in commits.values()),
        "rows_failed": sum(c.rows_failed for c in commits.values()),
        "errors_by_type": dict(sorted(error_types.items())),
        "input_tokens": sum(c.input_tokens for c in commits.values()),
        # Of input_tokens, those vLLM's prefix cache held (the Batch API's usage.input_tokens_details, issue 55).
        "cached_tokens": sum(c.cached_tokens for c in commits.values()),
        "output_tokens": output_tokens,
        # Of output_tokens, the thinking a reasoning parser read apart (usage.output_tokens_details there).
        "reasoning_tokens": sum(c.reasoning_tokens for c in commits.values()),
        "wall_s": round(wall_s, 3),
        "output_tok_per_s": round(output_tokens / wall_s, 1) if wall_s > 0 else 0.0,
        # An embedding run's throughput is its prompts': it decodes nothing.
        "input_tok_per_s": round(sum(c.input_tokens for c in commits.values()) / wall_s, 1) if wall_s > 0 else 0.0,
        "started_at": attempts[0]["started_at"],
        "finished_at": utc_now(),
        "attempts": len(attempts),
        # Engine deaths the crash guard recovered from (workload/engine/guard.py); 0 on a healthy night.
        "engine_restarts": sum(int(a.get("engine_restarts") or 0) for a in attempts),
        # Each GPU engine's KV-cache tokens as vLLM allocated them beside the plan's (workload/engine/guard.py);
        # `python -m workload engine-calibration` reads them. Empty on the CPU.
        "engine_calibration": [
            json.loads(record) for record in sorted({r for a in attempts for r in a.get("engine_calibration") or ()})
        ],
        # Each attempt's own time; one that was killed reports its time up to its last commit (killed: true).
        "attempt_times": [
            {
                # Attempts are numbered from 1 in the order they started (a manifest written before the number
                # was recorded has none).
                "attempt": a.get("attempt", number),
                "started_at": a["started_at"],
                "wall_s": a.get("wall_s"),
                "killed": a.get("ended_at") is None,
                "engine_restarts": a.get("engine_restarts", 0),
            }
            for number, a in enumerate(attempts, start=1)
        ],
        "shards": len(commits),
        "task": config.task,
        "model": config.model.source or f"embedded:{TINY_MODEL_VERSION}",
        "device": config.device,
        "config_hash": manifest["config_hash"],
        # What the compute cost at the configured hourly price (0 where none is configured, as locally).
        "cost_usd": round(config.metrics.price_per_hour_usd * wall_s / 3600, 4),
    }


def print_summary(summary: dict[str, Any], output_uri: str) -> None:
    errors = ", ".join(f"{k} {v}" for k, v in summary["errors_by_type"].items()) or "none"
    print(
        "\n".join(
            [
                "",
                f"llm-batch: {summary['rows_ok']}/{summary['rows_in']} rows answered, "
                f"{summary['rows_failed']} recorded as errors ({errors})",
                f"  tokens: {summary['input_tokens']} in, {summary['output_tokens']} out; "
                + (
                    f"{summary['input_tok_per_s']} input tok/s"
                    if summary.get("task") == "embed"
                    else f"{summary['output_tok_per_s']} output tok/s"
                )
                + f" over {summary['wall_s']} s ({summary['attempts']} attempt(s))",
                f"  model: {summary['model']} on {summary['device']}",
                f"  output: {output_uri}/results/, errors/, summary.json",
            ]
        )
    )
