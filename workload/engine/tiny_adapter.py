"""A LoRA adapter for the embedded tiny model, in PEFT's file format, written by the job's own code (issue 57).

What vLLM loads from an adapter folder (vllm/lora/peft_helper.py and lora/models.py, vLLM 0.32): adapter_config.json
as PEFT writes it (`peft_type`, `r`, `lora_alpha`, `target_modules`) and adapter_model.safetensors with one
`lora_A`/`lora_B` pair per targeted module, named as PEFT names them
(`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, A: rank x in, B: out x rank). The weights are
random, seeded, and B is non-zero (PEFT starts B at zero, which would leave every answer the base model's): the
adapter changes answers, so a test can see that a line ran on it. No peft package needed: the format is two files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workload.engine.tiny_model import HIDDEN_SIZE, LAYERS, TINY_MODEL_VERSION, build_once

# The attention projections of every layer: square (hidden x hidden) in the tiny model (as many KV heads as heads).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# Large enough that the adapter's delta moves the tiny model's greedy answers, which are random text anyway.
WEIGHT_SCALE = 0.5


def tiny_adapter_name(rank: int, seed: int) -> str:
    # Bump the suffix when the recipe changes, so a cached copy of an older recipe is never reused.
    return f"tiny-lora-r{rank}-s{seed}-v1"


def _write(target: Path, rank: int, seed: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    generator = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(LAYERS):
        for module in TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            shape_a, shape_b = (rank, HIDDEN_SIZE), (HIDDEN_SIZE, rank)
            tensors[f"{prefix}.lora_A.weight"] = (generator.standard_normal(shape_a) * WEIGHT_SCALE).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (generator.standard_normal(shape_b) * WEIGHT_SCALE).astype(np.float32)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": TINY_MODEL_VERSION,
        "r": rank,
        "lora_alpha": rank,  # scale 1: the delta is A and B as written
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2))


def ensure_tiny_adapter(cache_dir: str | Path, rank: int = 8, seed: int = 0) -> Path:
    """The folder of a tiny-model adapter of this rank and seed under `cache_dir`, written once; safe when several
    processes race (written to a staging folder and renamed into place whole)."""
    target = Path(os.path.expanduser(str(cache_dir))) / tiny_adapter_name(rank, seed)
    return build_once(target, "adapter_config.json", lambda staging: _write(staging, rank, seed))
