"""`python -m workload engine-calibration SUMMARY|LOG...`: vLLM's KV-cache sizes beside the plan's, read back from
run summaries (`summary.json`'s `engine_calibration`, one record per GPU engine) or from the engines' start-up lines
(`[llm-batch] engine calibration: {...}`, workload/engine/guard.py) in run logs (`.runs/logs/run-*.log`, or a
CloudWatch export of the nodes' logs), and the edit they propose: the reserve
constant of workload/contract/engine_sizing.py moved by the mean gap, and a row per record for
tests/workload/data/vllm_start_logs.json. Proposed, not applied; exit 1 when no record is found.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workload.contract.engine_sizing import GIB, GRAPHS_AND_NON_TORCH_GIB

LINE = "[llm-batch] engine calibration: "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", type=Path, help="run summaries (summary.json) or run logs")


def records(paths: list[Path]) -> list[dict[str, Any]]:
    """The calibration records of run summaries (`summary.json`'s `engine_calibration`) and of logs' lines."""
    found: list[dict[str, Any]] = []
    for path in paths:
        text = path.read_text(errors="replace")
        if path.suffix == ".json":
            found += json.loads(text).get("engine_calibration") or []
            continue
        for line in text.splitlines():
            _, marker, rest = line.partition(LINE)
            if marker and rest.startswith("{"):
                found.append(json.loads(rest))
    return found


def proposal(found: list[dict[str, Any]]) -> str:
    lines = ["model | gpu | tp | plan KV tokens | vLLM KV tokens | vLLM/plan | gap GiB a GPU"]
    gaps = []
    for record in found:
        plan, vllm = record["plan_kv_cache_tokens"], record["vllm_kv_cache_tokens"]
        gap = (plan - vllm) * record["kv_bytes_per_token"] / GIB  # positive: vLLM kept more beside the cache
        gaps.append(gap)
        lines.append(
            f"{record['model']} | {record['gpu']} | {record['tensor_parallel_size']} | {plan:,} | {vllm:,} | "
            f"{vllm / plan:.3f} | {gap:+.2f}"
        )
    mean = sum(gaps) / len(gaps)
    proposed = round(GRAPHS_AND_NON_TORCH_GIB + mean, 2)
    if abs(mean) < 0.05:
        lines.append(f"GRAPHS_AND_NON_TORCH_GIB {GRAPHS_AND_NON_TORCH_GIB}: within 0.05 GiB of vLLM; no edit")
    else:
        lines += [
            "workload/contract/engine_sizing.py:",
            f"-GRAPHS_AND_NON_TORCH_GIB = {GRAPHS_AND_NON_TORCH_GIB}",
            f"+GRAPHS_AND_NON_TORCH_GIB = {proposed}",
        ]
    lines.append("tests/workload/data/vllm_start_logs.json, rows to add (source: the run log named):")
    for record in found:
        row = {
            key: record[key]
            for key in ("model", "gpu", "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs")
        }
        row |= {"kv_cache_tokens": record["vllm_kv_cache_tokens"], "tolerance": 0.02}
        lines.append("  " + json.dumps(row))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    found = records(args.logs)
    if not found:
        print(f"llm-batch: no {LINE.strip()} line in {', '.join(map(str, args.logs))}", file=sys.stderr)
        return 1
    print(proposal(found))
    return 0
