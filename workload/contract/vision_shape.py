"""A vision-language model's vision side, from its config.json alone (issue 57): the encoder's weights and the
prompt tokens an image costs, for `engine-plan --images-per-row --image-size`.

Token counts follow each family's own processor, for a square image of `image_size` pixels:
- Idefics3 / SmolVLM: the encoder sees tiles of `vision_config.image_size`; its connector folds
  `scale_factor`^2 patches into one token, so a tile is (tile / patch)^2 / scale_factor^2 tokens, wrapped in
  `<fake_token_around_image>` and a tile tag (3 tokens with the global image's `<global-img>`). An image larger
  than one tile is also cut into ceil(size / tile)^2 tiles beside the global one (the processor's splitting; each
  tile's tag is `<row_i_col_j>`, one token here, and its newlines are left out: a few tokens low per image);
- Qwen2-VL / Qwen2.5-VL: 14-pixel patches merged 2x2, so (size / 28)^2 tokens (size rounded to 28), plus
  `<|vision_start|>` and `<|vision_end|>`;
- LLaVA (CLIP tower): (image_size / patch)^2 tokens whatever the input's size (the processor resizes to it).
Another family is refused by name rather than guessed.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workload.contract.model_shape import DTYPE_BYTES, SizingError


class VisionPlan(BaseModel):
    """What engine-plan adds for images: the encoder's weights (held beside the language model's) and the prompt
    tokens a typical row's images cost (added to its prompt, so to row_tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    encoder_parameters_m: float = Field(description="The vision encoder and its projector, in millions")
    encoder_weights_gib: float
    image_size: int = Field(description="The square image the count is for, in pixels")
    tokens_per_image: int = Field(description="Prompt tokens one image becomes, its wrapper tokens included")
    images_per_row: int
    image_tokens_per_row: int


def vision_plan(config: dict[str, Any], images_per_row: int, image_size: int, name: str = "model") -> VisionPlan:
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise SizingError(f"{name}: config.json has no vision_config: a text-only model takes no images")
    if images_per_row < 1 or image_size < 1:
        raise SizingError(f"--images-per-row and --image-size must be positive, got {images_per_row}, {image_size}")
    family = str(config.get("model_type", ""))
    tokens = _tokens_per_image(family, config, vision, image_size, name)
    parameters = _encoder_parameters(vision, config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or vision.get("torch_dtype") or "bfloat16")
    weight_bytes = parameters * DTYPE_BYTES.get(dtype, 2)
    return VisionPlan(
        family=family,
        encoder_parameters_m=round(parameters / 1e6, 2),
        encoder_weights_gib=round(weight_bytes / 2**30, 3),
        image_size=image_size,
        tokens_per_image=tokens,
        images_per_row=images_per_row,
        image_tokens_per_row=tokens * images_per_row,
    )


def encoder_weight_bytes(plan: VisionPlan) -> int:
    return int(plan.encoder_weights_gib * 2**30)


def _tokens_per_image(family: str, config: dict[str, Any], vision: dict[str, Any], size: int, name: str) -> int:
    if family in ("idefics3", "smolvlm"):
        tile = int(vision.get("image_size", 364))
        per_tile = (tile // int(vision.get("patch_size", 14))) ** 2 // int(config.get("scale_factor", 2)) ** 2
        tiles = 0 if size <= tile else math.ceil(size / tile) ** 2
        return (per_tile + 3) * (1 + tiles)  # the global image and its tiles, each wrapped
    if family in ("qwen2_vl", "qwen2_5_vl"):
        merged = int(vision.get("patch_size", 14)) * int(vision.get("spatial_merge_size", 2))
        side = max(1, round(size / merged))
        return side * side + 2
    if family == "llava":
        return (int(vision.get("image_size", 336)) // int(vision.get("patch_size", 14))) ** 2
    raise SizingError(f"{name}: engine-plan does not know how a {family!r} model counts image tokens")


def _encoder_parameters(vision: dict[str, Any], config: dict[str, Any]) -> int:
    """A ViT's weights: attention (4 h^2) and MLP (2 h i) per layer, the patch embedding, and a projector to the
    language model's width (Idefics3 folds scale_factor^2 patches into its input; Qwen merges 2x2)."""
    hidden = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    inner = int(vision.get("intermediate_size") or 4 * hidden)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or 0)
    patch = int(vision.get("patch_size", 14))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    out = int(vision.get("out_hidden_size") or (text or {}).get("hidden_size") or hidden)
    fold = int(config.get("scale_factor", 1)) ** 2 or int(vision.get("spatial_merge_size", 1)) ** 2
    return layers * (4 * hidden * hidden + 2 * hidden * inner) + 3 * patch * patch * hidden + hidden * fold * out
