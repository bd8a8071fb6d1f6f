"""What a model's `config.json` says about its memory: parameters part by part, the checkpoint's bytes (quantised
parts at their format's bits), the KV cache a token, one step's activations. No weights, no vLLM;
engine_sizing.py sizes engines from it.

What is read (a multimodal config's `text_config` first):
- attention: grouped-query (q/k/v biases: Qwen2's always, `attention_bias` elsewhere, which also biases o; Qwen3's
  q/k norms; gpt-oss's sinks) or DeepSeek's MLA (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`,
  `qk_rope_head_dim`, `v_head_dim`);
- the MLP: dense at `intermediate_size`, or routed experts (`num_local_experts` for Mixtral and gpt-oss, `num_experts`
  for Qwen, `n_routed_experts` for DeepSeek) at `moe_intermediate_size` where the config has one (Qwen2/3-MoE and
  DeepSeek keep the expert width there and a dense width in `intermediate_size`), shared experts (Qwen2-MoE's
  `shared_expert_intermediate_size`, DeepSeek's `n_shared_experts`), dense layers among the MoE ones (DeepSeek's
  `first_k_dense_replace`, Qwen's `mlp_only_layers` and `decoder_sparse_step`) and gpt-oss's expert biases;
- `quantization_config`: the format, its bits with their scales (MXFP4's 8-bit scale per 32 weights, a group's
  16-bit scale and zero point) and the modules it leaves unquantised, matched by name as the loaders match them
  (`re:` a regular expression, `*` a wildcard, else a substring). A format not listed in `_quantisation` is a
  one-line error naming it: never sized as if it were another.
- The KV cache: 2 (K, V) x KV heads x head_dim a layer, the heads split over tensor parallel; MLA's one latent of
  kv_lora_rank + qk_rope_head_dim a layer, the same on every GPU (vLLM does not split it). Sliding-window layers
  (gpt-oss's every other layer) are counted as full ones: vLLM keeps only the window there, so their cache is
  under-estimated, never over.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
LINEAR_PARTS = ("attention", "mlp", "experts", "shared")
# vLLM's profile samples `max_num_seqs` rows of float32 logits: the logits, their softmax and the log-probabilities
# (or top-p's sorted copy) are alive at once.
SAMPLER_COPIES = 3
# Names a part's weights carry in the checkpoint, for matching a format's list of unquantised modules.
_NAMES = {
    "attention": ("model.layers.{i}.self_attn.q_proj", "model.layers.{i}.self_attn.o_proj"),
    "mlp": ("model.layers.{i}.mlp.down_proj",),
    "experts": ("model.layers.{i}.mlp.experts.0.down_proj", "model.layers.{i}.block_sparse_moe.experts.0.w2"),
    "shared": ("model.layers.{i}.mlp.shared_experts.down_proj", "model.layers.{i}.mlp.shared_expert.down_proj"),
    "lm_head": ("lm_head",),
}


class SizingError(ValueError):
    """A model that cannot fit, or a config.json this cannot read; the message names the fix."""


class ModelShape(BaseModel):
    """The architecture fields of a `config.json` that decide memory and speed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hidden_size: int
    intermediate_size: int  # a dense MLP's width
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    max_position_embeddings: int
    experts: int = 1  # routed experts a MoE layer; 1 = dense
    experts_per_token: int = 1
    moe_intermediate_size: int = 0  # an expert's width; 0 = intermediate_size
    shared_intermediate_size: int = 0  # all shared experts' width together
    dense_layers: tuple[int, ...] = ()  # layers of a MoE model with a dense MLP
    expert_bias: bool = False  # gpt-oss: biases on every expert and on the router
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sinks: bool = False
    kv_lora_rank: int = 0  # MLA; 0 = grouped-query attention
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    dtype: str = "bfloat16"
    quant_method: str = ""
    weight_bits: float = 16  # of the quantised parts, scales included
    quantized_parts: tuple[str, ...] = LINEAR_PARTS
    not_converted: tuple[str, ...] = ()  # the format's module patterns left at `dtype`

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str = "model") -> ModelShape:
        text = config.get("text_config")
        fields = {**config, **text} if isinstance(text, dict) else config  # multimodal configs nest the LM
        missing = [
            k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in fields
        ]
        if missing:
            raise SizingError(f"{name}: config.json has no {', '.join(missing)}: not a decoder model this can size")
        heads = int(fields["num_attention_heads"])
        hidden = int(fields["hidden_size"])
        layers = int(fields["num_hidden_layers"])
        model_type = str(fields.get("model_type", ""))
        dtype = str(fields.get("torch_dtype") or fields.get("dtype") or "bfloat16")
        if dtype not in DTYPE_BYTES:
            raise SizingError(f"{name}: config.json's torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        experts = int(
            fields.get("num_local_experts") or fields.get("num_experts") or fields.get("n_routed_experts") or 1
        )
        moe_width = int(fields.get("moe_intermediate_size") or 0)
        shared = int(fields.get("shared_expert_intermediate_size") or 0) or int(fields.get("n_shared_experts") or 0) * (
            moe_width or int(fields.get("intermediate_size") or 0)
        )
        quant = _quantisation(fields.get("quantization_config"), name)
        bias = bool(fields.get("attention_bias", False))
        return cls(
            name=name,
            hidden_size=hidden,
            intermediate_size=int(fields.get("intermediate_size") or 4 * hidden),
            layers=layers,
            heads=heads,
            kv_heads=int(fields.get("num_key_value_heads") or heads),
            head_dim=int(fields.get("head_dim") or hidden // heads),
            vocab_size=int(fields["vocab_size"]),
            tied_embeddings=bool(fields.get("tie_word_embeddings", False)),
            max_position_embeddings=int(fields.get("max_position_embeddings") or 2048),
            experts=experts,
            experts_per_token=int(fields.get("num_experts_per_tok") or fields.get("experts_per_token") or 1),
            moe_intermediate_size=moe_width,
            shared_intermediate_size=shared,
            dense_layers=_dense_layers(fields, layers) if experts > 1 else (),
            expert_bias=model_type == "gpt_oss",
            # Qwen2 biases q, k and v whatever `attention_bias` says; Llama-style `attention_bias` biases o too.
            qkv_bias=bias or model_type in {"qwen2", "qwen2_moe"} or bool(fields.get("qkv_bias", False)),
            o_bias=bias,
            qk_norm=model_type in {"qwen3", "qwen3_moe"},
            sinks=model_type == "gpt_oss",
            kv_lora_rank=int(fields.get("kv_lora_rank") or 0),
            q_lora_rank=int(fields.get("q_lora_rank") or 0),
            qk_nope_head_dim=int(fields.get("qk_nope_head_dim") or 0),
            qk_rope_head_dim=int(fields.get("qk_rope_head_dim") or 0),
            v_head_dim=int(fields.get("v_head_dim") or 0),
            dtype=dtype,
            **quant,
        )

    # --- parameters --------------------------------------------------------------------------------------
    @property
    def expert_width(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, layer: int) -> bool:
        return self.experts > 1 and layer not in self.dense_layers

    def _attention(self) -> int:
        hidden, heads = self.hidden_size, self.heads
        if self.kv_lora_rank:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk_head
                if self.q_lora_rank
                else hidden * heads * qk_head
            )
            kv = (
                hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + heads * self.v_head_dim * hidden
        params = hidden * self.head_dim * (2 * heads + 2 * self.kv_heads)
        if self.qkv_bias:
            params += self.head_dim * (heads + 2 * self.kv_heads)
        if self.o_bias:
            params += hidden
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.sinks:
            params += heads
        return params

    def layer_parts(self, layer: int) -> dict[str, int]:
        """One decoder layer's parameters by part: attention, mlp (dense), experts (routed), shared, router, norms."""
        hidden = self.hidden_size
        parts = {"attention": self._attention(), "norms": 2 * hidden}
        if not self.is_moe_layer(layer):
            parts["mlp"] = 3 * hidden * self.intermediate_size  # gate, up, down
            return parts
        width = self.expert_width
        parts["experts"] = self.experts * (3 * hidden * width + ((2 * width + hidden) if self.expert_bias else 0))
        parts["router"] = hidden * self.experts + (self.experts if self.expert_bias else 0)
        if self.shared_intermediate_size:
            parts["shared"] = 3 * hidden * self.shared_intermediate_size
        return parts

    def outer_parts(self) -> dict[str, int]:
        embeddings = self.vocab_size * self.hidden_size
        return {"embed": embeddings, "lm_head": 0 if self.tied_embeddings else embeddings, "norms": self.hidden_size}

    def parameters(self) -> int:
        return sum(self.outer_parts().values()) + sum(sum(self.layer_parts(i).values()) for i in range(self.layers))

    def active_parameters(self) -> int:
        """The parameters one token's forward pass multiplies: the routed experts at experts_per_token of them."""
        total = self.parameters()
        for i in range(self.layers):
            routed = self.layer_parts(i).get("experts", 0)
            total -= routed - routed * self.experts_per_token // self.experts
        return total

    # --- bytes -------------------------------------------------------------------------------------------
    def _quantized(self, part: str, layer: int | None) -> bool:
        if part not in self.quantized_parts:
            return False
        names = [name.format(i=layer if layer is not None else 0) for name in _NAMES.get(part, ())]
        return not any(_matches(pattern, name) for pattern in self.not_converted for name in names)

    def weight_bytes(self) -> int:
        """The weights as vLLM loads them: quantised parts at `weight_bits`, the rest at the checkpoint's dtype."""
        dense_bits = DTYPE_BYTES[self.dtype] * 8
        bits = sum(
            count * (self.weight_bits if self._quantized(part, None) else dense_bits)
            for part, count in self.outer_parts().items()
        )
        for i in range(self.layers):
            for part, count in self.layer_parts(i).items():
                bits += count * (self.weight_bits if self._quantized(part, i) else dense_bits)
        return int(bits // 8)

    def expert_bytes(self) -> int:
        """The routed experts' share of weight_bytes (what a decode step reads only in part)."""
        dense_bits = DTYPE_BYTES[self.dtype] * 8
        return int(
            sum(
                self.layer_parts(i).get("experts", 0)
                * (self.weight_bits if self._quantized("experts", i) else dense_bits)
                for i in range(self.layers)
            )
            // 8
        )

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        if self.kv_lora_rank:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * DTYPE_BYTES[self.dtype]
        kv_heads_per_gpu = max(1, math.ceil(self.kv_heads / tp))
        return 2 * self.layers * kv_heads_per_gpu * self.head_dim * DTYPE_BYTES[self.dtype]

    def activation_bytes(self, batched_tokens: int, seqs: int, tp: int) -> int:
        """vLLM's profiled peak beside weights and cache, per GPU: the larger of one forward step of
        `batched_tokens` (the widest layer's inputs and outputs for every token: attention's q/k/v, or the MLP's
        gate/up/activation, for MoE each routed copy of the token) and the sampler over `seqs` rows of float32
        logits (vLLM runs the two one after the other, so their peaks do not add)."""
        if self.kv_lora_rank:
            qkv = self.heads * (2 * (self.qk_nope_head_dim + self.qk_rope_head_dim) + self.v_head_dim) // tp
        else:
            qkv = self.head_dim * (self.heads + 2 * self.kv_heads) // tp
        dense = 3 * self.intermediate_size // tp
        routed = self.experts_per_token * (3 * self.expert_width // tp + self.hidden_size) if self.experts > 1 else 0
        shared = 3 * self.shared_intermediate_size // tp
        widest = max(qkv, dense if len(self.dense_layers) or self.experts == 1 else 0, routed + shared)
        forward = batched_tokens * (2 * self.hidden_size + widest) * DTYPE_BYTES[self.dtype]
        sampler = seqs * self.vocab_size * 4 * SAMPLER_COPIES
        return max(forward, sampler)


def _dense_layers(fields: dict[str, Any], layers: int) -> tuple[int, ...]:
    first_dense = int(fields.get("first_k_dense_replace") or 0)
    every = int(fields.get("moe_layer_freq") or fields.get("decoder_sparse_step") or 1)
    only_mlp = {int(i) for i in fields.get("mlp_only_layers") or ()}
    if "decoder_sparse_step" in fields:  # Qwen: layer i is MoE where (i + 1) % step == 0
        return tuple(i for i in range(layers) if i in only_mlp or (i + 1) % every)
    # DeepSeek: layer i is MoE from first_k_dense_replace on where i % moe_layer_freq == 0
    return tuple(i for i in range(layers) if i < first_dense or i in only_mlp or i % every)


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if "*" in pattern:
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return pattern in name


FORMATS = ("awq", "gptq", "fp8", "fbgemm_fp8", "mxfp4", "compressed-tensors", "bitsandbytes", "modelopt")


def _quantisation(quantization: Any, name: str) -> dict[str, Any]:
    """ModelShape's quantisation fields from a `quantization_config`: the bits a weight of its quantised parts
    takes with its share of the scales, and the module patterns it leaves at the checkpoint's dtype."""
    if not quantization:
        return {}
    method = str(quantization.get("quant_method", "")).lower()
    ignore = tuple(
        str(p)
        for key in ("modules_to_not_convert", "ignored_layers", "ignore", "llm_int8_skip_modules", "exclude_modules")
        for p in quantization.get(key) or ()
    )
    parts: tuple[str, ...] = LINEAR_PARTS
    if method == "mxfp4":  # 4-bit E2M1 weights, one 8-bit E8M0 scale per 32; vLLM's loader quantises experts only
        bits, parts = 4.25, ("experts",)
    elif method in {"awq", "gptq"}:
        weight = int(quantization.get("bits", quantization.get("w_bit", 4)))
        group = int(quantization.get("group_size", quantization.get("q_group_size", 128)))
        bits = weight + ((16 + weight) / group if group > 0 else 0)  # a 16-bit scale and a packed zero a group
    elif method in {"fp8", "fbgemm_fp8"}:
        bits = 8
    elif method == "compressed-tensors":
        bits = _compressed_tensors_bits(quantization, name)
        parts = (*LINEAR_PARTS, "lm_head")  # targets every Linear, the head too unless `ignore` names it
    elif method == "bitsandbytes":
        if quantization.get("load_in_4bit"):
            double = quantization.get("bnb_4bit_use_double_quant")
            bits = 4 + (8 / 64 + 32 / (64 * 256) if double else 32 / 64)  # absmax a block of 64
        elif quantization.get("load_in_8bit"):
            bits = 8
        else:
            raise SizingError(f"{name}: quantization method 'bitsandbytes' without load_in_4bit or load_in_8bit")
    elif method == "modelopt":
        algo = str(quantization.get("quant_algo") or quantization.get("quantization", {}).get("quant_algo", ""))
        known = {"FP8": 8.0, "NVFP4": 4.5}  # NVFP4: an FP8 scale per 16 weights
        if algo.upper() not in known:
            raise SizingError(f"{name}: modelopt quant_algo {algo!r} is not one this can size ({', '.join(known)})")
        bits = known[algo.upper()]
    else:
        raise SizingError(f"{name}: quantization method {method!r} is not one this can size ({', '.join(FORMATS)})")
    return {"quant_method": method, "weight_bits": bits, "quantized_parts": parts, "not_converted": ignore}


def _compressed_tensors_bits(quantization: dict[str, Any], name: str) -> float:
    """The largest bits a weight of the config's groups takes (FP8 and W8A8: 8; W4A16 at group 128: 4.125)."""
    groups = quantization.get("config_groups") or {}
    found = []
    for group in groups.values():
        weights = (group or {}).get("weights") or {}
        if "num_bits" not in weights:
            continue
        weight = int(weights["num_bits"])
        size = int(weights.get("group_size") or 0) if weights.get("strategy") in {"group", "tensor_group"} else 0
        scale = 8 if weights.get("type") == "float" and weight == 4 else 16  # NVFP4's scales are FP8
        zero = 0 if weights.get("symmetric", True) else weight
        found.append(weight + ((scale + zero) / size if size else 0))
    if not found:
        raise SizingError(f"{name}: quantization method 'compressed-tensors' with no config_groups' weights to size")
    return max(found)
