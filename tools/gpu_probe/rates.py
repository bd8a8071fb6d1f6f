"""What decoding costs on this GPU: the layer GEMMs and the decode attention at batch sizes 1 to 1,024, and one
decode step of `max_num_seqs` sequences beside the plan's roofline.

The roofline (infra/pricing/managed_batch.json's method): a step reads every weight once and every running
sequence's cache once, at the kinds table's bandwidth x `efficiency`. The measured step is the real model's
forward at `seqs` one-token sequences (its GEMMs, norms, MoE routing and head, scaled from the layers built to
all) plus, per layer, the decode attention over `context` tokens of cache: transformers' own cache would copy the
cache every step, which a paged engine does not, so it is left out and the attention measured alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from .device import timed
from .models import build, layers_to_build

BF16 = 2


def _shape(config: dict[str, Any]) -> dict[str, int]:
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return {
        "hidden": hidden,
        "intermediate": int(config["intermediate_size"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or hidden // heads),
    }


def _layer_gemms(shape: dict[str, int]) -> list[tuple[int, int]]:
    """(in, out) of a dense layer's linears: qkv, o, gate+up, down."""
    h, d = shape["hidden"], shape["head_dim"]
    return [
        (h, (shape["heads"] + 2 * shape["kv_heads"]) * d),
        (shape["heads"] * d, h),
        (h, 2 * shape["intermediate"]),
        (shape["intermediate"], h),
    ]


def gemm_rate(shape: dict[str, int], batch: int, device: torch.device, reps: int) -> dict[str, float]:
    gemms = _layer_gemms(shape)
    weights = [torch.randn(k, n, device=device, dtype=torch.bfloat16) for k, n in gemms]
    inputs = [torch.randn(batch, k, device=device, dtype=torch.bfloat16) for k, _ in gemms]
    seconds = timed(lambda: [x @ w for x, w in zip(inputs, weights, strict=True)], device, reps)
    flops = 2 * batch * sum(k * n for k, n in gemms)
    moved = BF16 * sum(k * n + batch * (k + n) for k, n in gemms)
    return {
        "ms": round(seconds * 1e3, 4),
        "tflops": round(flops / seconds / 1e12, 2),
        "gbs": round(moved / seconds / 1e9, 1),
    }


def attention_rate(
    shape: dict[str, int], batch: int, context: int, device: torch.device, reps: int
) -> dict[str, float]:
    """One layer's decode attention: one query token a sequence over `context` cached tokens (grouped KV heads)."""
    d = shape["head_dim"]
    query = torch.randn(batch, shape["heads"], 1, d, device=device, dtype=torch.bfloat16)
    key = torch.randn(batch, shape["kv_heads"], context, d, device=device, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    seconds = timed(lambda: F.scaled_dot_product_attention(query, key, value, enable_gqa=True), device, reps)
    moved = 2 * key.numel() * BF16
    return {"ms": round(seconds * 1e3, 4), "gbs": round(moved / seconds / 1e9, 1)}


def rates(plan: dict[str, Any], device: torch.device, reps: int, deadline: float) -> dict[str, Any]:
    decode = plan["decode"]
    shape = _shape(plan["models"][decode["model"]]["config"])
    rows = []
    for batch in decode["batch_sizes"]:
        if time.monotonic() > deadline:
            rows.append({"batch": batch, "skipped": "the probe's time budget ran out"})
            continue
        rows.append(
            {
                "batch": batch,
                "gemm": gemm_rate(shape, batch, device, reps),
                "attention": attention_rate(shape, batch, decode["context"], device, reps),
            }
        )
    return {"model": decode["model"], "shape": shape, "context": decode["context"], "by_batch": rows}


def decode_step(plan: dict[str, Any], kind: str | None, device: torch.device, reps: int, dry: bool) -> dict[str, Any]:
    decode = plan["decode"]
    model_plan = plan["models"][decode["model"]]
    config = model_plan["config"]
    seqs = int(decode["max_num_seqs"].get(kind or "", decode["max_num_seqs"]["default"]))
    full = int(config["num_hidden_layers"])
    shape = _shape(config)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    built = layers_to_build(config, free, dry)
    model = build(config, built, device)
    ids = torch.randint(0, int(config["vocab_size"]), (seqs, 1), device=device)

    def forward(layers: int) -> float:
        model.config.num_hidden_layers = layers

        def once() -> Any:
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            return model.lm_head(hidden[:, -1, :])

        with torch.inference_mode():
            return timed(once, device, reps)

    at = {n: forward(n) for n in sorted({1, built})}
    per_layer = (at[built] - at[1]) / max(1, built - 1)
    forward_s = at[1] + per_layer * (full - 1)
    attention_s = attention_rate(shape, seqs, decode["context"], device, reps)["ms"] / 1e3 * full
    step_s = forward_s + attention_s
    table = plan["gpu_kinds"].get(kind or "")
    moved = model_plan["weight_bytes"] + seqs * decode["context"] * model_plan["kv_bytes_per_token"]
    result: dict[str, Any] = {
        "model": decode["model"],
        "max_num_seqs": seqs,
        "context": decode["context"],
        "layers_built": built,
        "forward_ms_by_layers": {str(n): round(s * 1e3, 3) for n, s in at.items()},
        "forward_ms": round(forward_s * 1e3, 3),
        "attention_ms": round(attention_s * 1e3, 3),
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(seqs / step_s, 1),
        "bytes_per_step": moved,
    }
    if table:
        bandwidth = table["memory_bandwidth_gbs"] * 1e9
        roofline_s = moved / (bandwidth * plan["efficiency"])
        result.update(
            roofline_ms=round(roofline_s * 1e3, 3),
            roofline_tokens_per_s=round(seqs / roofline_s, 1),
            measured_efficiency=round(moved / bandwidth / step_s, 3),
        )
    return result
