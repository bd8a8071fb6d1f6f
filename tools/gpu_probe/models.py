"""Real model shapes with random bf16 weights built on the device, and one engine step's activation peak.

A model is built from its config.json (the plan carries it) through transformers' AutoConfig, with as many layers
as fit in half the free memory: a dense 8B whole on an H100, a few layers of a MoE. Inference keeps one layer's
activations at a time, so the step's peak should not grow with layers; it is measured at 1 layer and at all that
were built, and the growth per layer carried to the whole (a number the proposal shows rather than assumes).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .device import Peak

BF16 = 2
# Fields of a config.json that describe the checkpoint, not the architecture.
NOT_ARCHITECTURE = {"architectures", "transformers_version", "torch_dtype", "dtype", "auto_map", "_name_or_path"}


def hf_config(config: dict[str, Any], layers: int) -> Any:
    from transformers import AutoConfig

    fields = {key: value for key, value in config.items() if key not in NOT_ARCHITECTURE}
    fields["num_hidden_layers"] = layers
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build(config: dict[str, Any], layers: int, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            hf_config(config, layers), dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    return model.to(device).eval()


def weight_bytes(config: dict[str, Any]) -> tuple[int, int]:
    """(bytes of one decoder layer, bytes of everything else) at bf16, counted on the meta device (no memory)."""
    model = build(config, 1, torch.device("meta"))
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    return layer * BF16, (sum(p.numel() for p in model.parameters()) - layer) * BF16


def layers_to_build(config: dict[str, Any], free: int | None, dry: bool, share: float = 0.5) -> int:
    """All layers where the whole model fits in `share` of the free memory (the rest is for the step), else as
    many as do, between 2 and 4: enough to see the per-layer growth, few enough to build in seconds."""
    full = int(config["num_hidden_layers"])
    if dry or free is None:
        return min(full, 2)
    layer, rest = weight_bytes(config)
    if rest + full * layer <= free * share:
        return full
    return max(1, min(full, 4, int((free * share - rest) // layer)))


def step_peak(model: Any, batched: int, seqs: int, layers: int, peak: Peak) -> dict[str, Any]:
    """One step as vLLM profiles it at start: `batched` tokens over `seqs` sequences, then the float32 logits of
    each sequence's last token (vLLM samples one token a sequence a step)."""
    rows = max(1, min(seqs, batched))
    ids = torch.randint(0, model.config.vocab_size, (rows, max(1, batched // rows)), device=model.device)
    model.config.num_hidden_layers = layers  # the decoder runs self.layers[: num_hidden_layers]
    with torch.inference_mode():
        peak.start()
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        body = peak.read()
        peak.start()
        logits = model.lm_head(hidden[:, -1, :]).float()
        head = peak.read()
    return {
        "input": list(ids.shape),
        "hidden": list(hidden.shape),
        "logits": list(logits.shape),
        "hidden_bytes": hidden.numel() * hidden.element_size(),
        "body_bytes": body,
        "logits_bytes": head,
    }


def activations(model_plan: dict[str, Any], device: torch.device, dry: bool, deadline: float) -> dict[str, Any]:
    """The activation and logits peak at each token budget and sequence count of the plan, scaled to all layers,
    beside the plan's prediction (engine_sizing.ModelShape.activation_bytes at tensor parallel 1)."""
    config = model_plan["config"]
    full = int(config["num_hidden_layers"])
    peak = Peak(device)
    layer_bytes, rest_bytes = weight_bytes(config)
    built = layers_to_build(config, peak.free_bytes(), dry)
    started = time.monotonic()
    model = build(config, built, device)
    result: dict[str, Any] = {
        "layers": full,
        "layers_built": built,
        "build_s": round(time.monotonic() - started, 2),
        "layer_weight_bytes": layer_bytes,
        "weight_bytes_scaled": rest_bytes + full * layer_bytes,
        "weight_bytes_predicted": model_plan["weight_bytes"],
        "steps": [],
    }
    for budget in model_plan["steps"]:
        batched, seqs = int(budget["max_num_batched_tokens"]), int(budget["max_num_seqs"])
        entry: dict[str, Any] = {**budget}
        if time.monotonic() > deadline:
            entry["skipped"] = "the probe's time budget ran out"
            result["steps"].append(entry)
            continue
        try:
            at = {n: step_peak(model, batched, seqs, n, peak) for n in sorted({1, built})}
        except torch.OutOfMemoryError as error:
            entry["error"] = f"out of memory: {str(error).splitlines()[0]}"
            result["steps"].append(entry)
            torch.cuda.empty_cache()
            continue
        last = at[built]
        entry.update({key: last[key] for key in ("input", "hidden", "logits", "hidden_bytes", "logits_bytes")})
        entry["body_bytes_by_layers"] = {str(n): at[n]["body_bytes"] for n in at}
        if last["body_bytes"] is not None and at[1]["body_bytes"] is not None:
            growth = (last["body_bytes"] - at[1]["body_bytes"]) / max(1, built - 1)
            body = at[1]["body_bytes"] + growth * (full - 1)
            entry["body_bytes_scaled"] = int(body)
            entry["step_bytes"] = int(max(body, last["hidden_bytes"] + (last["logits_bytes"] or 0)))
            entry["measured_over_predicted"] = round(entry["step_bytes"] / budget["predicted_bytes"], 3)
        result["steps"].append(entry)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result
