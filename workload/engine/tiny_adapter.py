"""A LoRA adapter for the embedded tiny model or the tests' tiny VLM, in PEFT's file format, written by the job's own
code (issue 57).

What vLLM loads from an adapter folder (vllm/lora/peft_helper.py and lora/models.py, vLLM 0.32): adapter_config.json
as PEFT writes it (`peft_type`, `r`, `lora_alpha`, `target_modules`) and adapter_model.safetensors with one
`lora_A`/`lora_B` pair per targeted module, named as PEFT names them
(`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, A: rank x in, B: out x rank). The weights are
random, seeded, and B is non-zero (PEFT starts B at zero, which would leave every answer the base model's): the
adapter changes answers, so a test can see that a line ran on it. No peft package needed: the format is two files.

For the tiny VLM (workload/engine/tiny_vlm.py, an Idefics3) the adapter targets its language model, whose layers
have the tiny model's shape: PEFT names them `base_model.model.model.text_model.layers.N...` (transformers'
Idefics3 keeps its Llama under `model.text_model`), which is where vLLM's Idefics3 puts its LoRA layers
(`get_mm_mapping`'s language model); vLLM leaves the vision tower and connector without LoRA unless asked. One
engine start then serves the image tests and the adapter tests (tests/workload/test_job_images.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workload.engine.tiny_model import HIDDEN_SIZE, LAYERS, TINY_MODEL_VERSION, build_once
from workload.engine.tiny_vlm import TINY_VLM_VERSION

# The attention projections of every layer: square (hidden x hidden) in the tiny model (as many KV heads as heads).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# Large enough that the adapter's delta moves the tiny model's greedy answers, which are random text anyway.
WEIGHT_SCALE = 0.5


# Where each base keeps its decoder layers, as PEFT names them: the tiny Llama's, and the tiny VLM's language model.
_LAYERS_AT = {
    TINY_MODEL_VERSION: "base_model.model.model.layers",
    TINY_VLM_VERSION: "base_model.model.model.text_model.layers",
}


def tiny_adapter_name(rank: int, seed: int, base: str = TINY_MODEL_VERSION) -> str:
    # Bump the suffix when the recipe changes, so a cached copy of an older recipe is never reused.
    kind = "lora" if base == TINY_MODEL_VERSION else "vlm-lora"
    return f"tiny-{kind}-r{rank}-s{seed}-v1"


def _write(target: Path, rank: int, seed: int, base: str) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    generator = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(LAYERS):
        for module in TARGET_MODULES:
            prefix = f"{_LAYERS_AT[base]}.{layer}.self_attn.{module}"
            shape_a, shape_b = (rank, HIDDEN_SIZE), (HIDDEN_SIZE, rank)
            tensors[f"{prefix}.lora_A.weight"] = (generator.standard_normal(shape_a) * WEIGHT_SCALE).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (generator.standard_normal(shape_b) * WEIGHT_SCALE).astype(np.float32)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
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


def ensure_tiny_adapter(cache_dir: str | Path, rank: int = 8, seed: int = 0, base: str = TINY_MODEL_VERSION) -> Path:
    """The folder of an adapter of this rank and seed under `cache_dir` for `base` (TINY_MODEL_VERSION, or
    TINY_VLM_VERSION for the tiny VLM's language model), written once; safe when several processes race (written to
    a staging folder and renamed into place whole)."""
    if base not in _LAYERS_AT:
        raise ValueError(f"no tiny adapter recipe for {base!r}: one of {sorted(_LAYERS_AT)}")
    target = Path(os.path.expanduser(str(cache_dir))) / tiny_adapter_name(rank, seed, base)
    return build_once(target, "adapter_config.json", lambda staging: _write(staging, rank, seed, base))
