"""What a probe.json proposes for the project's estimates: the GPU kinds table's row (workload/contract/
gpu_kinds.json), the reserve model (engine_sizing's RESERVE_GIB, the same as GRAPHS_AND_NON_TORCH_GIB, and
model_shape's ModelShape.activation_bytes) and the roofline's efficiency (infra/pricing/managed_batch.json).
Proposed, not applied: a maintainer reads it and edits the files, with the probe's date and machine as the source.
"""

from __future__ import annotations

import math
from typing import Any

from infra.pricing.per_token import managed_table
from workload.contract.engine_sizing import MIB, RESERVE_GIB, gpu_kinds


def _kind_lines(device: dict[str, Any]) -> list[str]:
    kind, total = device.get("kind"), device.get("total_mib")
    if total is None:
        return ["GPU kinds table: no GPU (dry run); no edit"]
    if kind is None:
        return [f"GPU kinds table: no row names {device.get('name')!r}; a new kind would carry cuda_total_mib {total}"]
    row = gpu_kinds().kinds[kind]
    lines = [f"GPU kinds table, {kind} (workload/contract/gpu_kinds.json):"]
    # The probe reads CUDA's total (torch.cuda.mem_get_info), the figure vLLM scales: the row's cuda_total_mib.
    if row.cuda_total_mib != total:
        lines += [f'-  "cuda_total_mib": {row.cuda_total_mib}', f'+  "cuda_total_mib": {total}']
    else:
        lines.append(f"   cuda_total_mib {total} as measured; no edit")
    if device.get("compute_capability") not in (None, row.compute_capability):
        lines += [
            f'-  "compute_capability": "{row.compute_capability}"',
            f'+  "compute_capability": "{device["compute_capability"]}"',
        ]
    context = total - (device.get("free_mib") or total)
    lines.append(
        f"   held before the probe allocated (driver, CUDA context): {context} MiB of RESERVE_GIB's {RESERVE_GIB} GiB"
    )
    return lines


def _reserve_lines(steps: dict[str, Any]) -> list[str]:
    lines = ["Reserve model, one step's activations (engine_sizing.ModelShape.activation_bytes, tensor parallel 1):"]
    lines.append("   model | tokens | seqs | predicted MiB | measured MiB (scaled to all layers) | measured/predicted")
    ratios = []
    for name, result in steps.items():
        if not name.startswith("activations:"):
            continue
        model = name.split(":", 1)[1]
        if "error" in result:
            lines.append(f"   {model}: {result['error']}")
            continue
        lines.append(
            f"   {model}: {result['layers_built']} of {result['layers']} layers built; weights "
            f"{result['weight_bytes_scaled'] / MIB:,.0f} MiB scaled, "
            f"{result['weight_bytes_predicted'] / MIB:,.0f} predicted"
        )
        for step in result["steps"]:
            measured = step.get("step_bytes")
            shown = (
                f"{measured / MIB:,.0f}" if measured is not None else step.get("error") or step.get("skipped", "n/a")
            )
            lines.append(
                f"   {model} | {step['max_num_batched_tokens']} | {step['max_num_seqs']} | "
                f"{step['predicted_bytes'] / MIB:,.0f} | {shown} | {step.get('measured_over_predicted', 'n/a')}"
            )
            if "measured_over_predicted" in step:
                ratios.append(step["measured_over_predicted"])
    if not ratios:
        lines.append("   no GPU peak measured (a dry run, or every step failed); no edit")
    elif max(ratios) > 1:
        factor = math.ceil(max(ratios) * 20) / 20
        lines += ["workload/contract/model_shape.py, ModelShape.activation_bytes:",
                  "-        return max(forward, sampler)",
                  f"+        return int({factor} * max(forward, sampler))"]  # fmt: skip
    else:
        lines.append(f"   the estimate holds (largest measured/predicted {max(ratios)}); no edit")
    return lines


def _decode_lines(decode: dict[str, Any] | None) -> list[str]:
    if not decode or "error" in decode:
        return [f"Roofline: no decode step measured ({(decode or {}).get('error', 'not run')})"]
    lines = [
        f"Decode step, {decode['model']} at max_num_seqs {decode['max_num_seqs']}, {decode['context']} tokens of "
        f"context: {decode['step_ms']} ms ({decode['forward_ms']} forward + {decode['attention_ms']} attention), "
        f"{decode['tokens_per_s']} tok/s"
    ]
    if "measured_efficiency" not in decode:
        return [*lines, "   no kinds-table bandwidth for this GPU; no roofline edit"]
    current = managed_table().throughput.efficiency
    lines.append(
        f"   roofline at efficiency {current}: {decode['roofline_ms']} ms, {decode['roofline_tokens_per_s']} tok/s"
    )
    measured = decode["measured_efficiency"]
    lines += [
        "infra/pricing/managed_batch.json, throughput:",
        f'-  "efficiency": {current}',
        f'+  "efficiency": {measured}',
    ]
    return lines


def _rate_lines(rates: dict[str, Any] | None) -> list[str]:
    if not rates or "error" in rates:
        return []
    lines = [f"Rates, {rates['model']} layer GEMMs and decode attention at {rates['context']} tokens of context:"]
    lines.append("   batch | GEMM ms | GEMM TFLOP/s | GEMM GB/s | attention ms | attention GB/s")
    for row in rates["by_batch"]:
        if "gemm" in row:
            gemm, attention = row["gemm"], row["attention"]
            lines.append(
                f"   {row['batch']} | {gemm['ms']} | {gemm['tflops']} | {gemm['gbs']} | "
                f"{attention['ms']} | {attention['gbs']}"
            )
    return lines


def proposal(result: dict[str, Any]) -> str:
    steps = result.get("steps", {})
    device = steps.get("device", {})
    head = (
        f"GPU probe of {result.get('started')} on {device.get('name')} ({device.get('host')}; torch "
        f"{device.get('torch')}, CUDA {device.get('cuda')}, transformers {device.get('transformers')}), "
        f"plan of {result['plan']['written']} at {result['plan']['commit']}; status {result.get('status')}"
    )
    if result.get("dry"):
        head += " (dry run on the CPU: shapes only, no figure to take)"
    sections = [
        [head],
        _kind_lines(device),
        _reserve_lines(steps),
        _decode_lines(steps.get("decode")),
        _rate_lines(steps.get("rates")),
    ]
    return "\n".join("\n".join(section) for section in sections if section)
