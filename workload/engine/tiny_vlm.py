"""A tiny vision-language model with random weights, for the image tests: an Idefics3 (SmolVLM's architecture).

Why Idefics3: vLLM serves it (`Idefics3ForConditionalGeneration`) and its processor has a PIL backend
(transformers' `Idefics3ImageProcessorPil`), so it runs on the CPU set, which leaves torchvision out on purpose
(docs/development.md); Qwen2-VL's and LLaVA's processors need torchvision. The text side is the tiny text model's
shape and tokenizer (workload/engine/tiny_model.py) with Idefics3's image tokens added. Images are not split into
tiles (`do_image_splitting` off), so every image costs the same tokens: what engine-plan's image count gives for
its config (workload/contract/vision_shape.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from workload.engine.tiny_model import build_once, ensure_tiny_model

# Bump when the recipe changes, so a cached copy of an older recipe is never reused.
TINY_VLM_VERSION = "tiny-idefics3-v1"

# The vision tower sees one 32x32 image as 4x4 patches of 8; Idefics3's connector folds scale_factor^2 patches
# into one token: 16 patches / 4 = 4 image tokens.
IMAGE_SIZE = 32
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
_VISION_HIDDEN = 32
_TEXT_HIDDEN = 64  # vLLM's CPU attention takes head size 32: 64 / 2 heads
_HEADS = 2

# Content as parts ({"type": "text"} / {"type": "image"}) or a plain string; an image part is the processor's
# `<image>` placeholder, which the engine's processor expands into the image's tokens.
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _build(target: Path, text_model: Path) -> None:
    # Imported here, as in tiny_model: torch and transformers take seconds to import.
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    tokenizer = AutoTokenizer.from_pretrained(text_model)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]}
    )
    tokenizer.add_tokens(["<global-img>"])
    tokenizer.chat_template = _CHAT_TEMPLATE
    image_processor = Idefics3ImageProcessorPil(
        do_resize=True,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=False,
    )
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=_CHAT_TEMPLATE
    )
    processor.save_pretrained(target)

    torch.manual_seed(0)
    vocab = 2048  # the tiny text model's embedding rows: holds the added image tokens too
    if len(tokenizer) > vocab:
        raise RuntimeError(f"tiny VLM tokenizer has {len(tokenizer)} tokens, more than the model's {vocab}")
    config = Idefics3Config(
        vision_config={
            "hidden_size": _VISION_HIDDEN,
            "intermediate_size": 2 * _VISION_HIDDEN,
            "num_hidden_layers": 1,
            "num_attention_heads": _HEADS,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": _TEXT_HIDDEN,
            "intermediate_size": 4 * _TEXT_HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": _HEADS,
            "num_key_value_heads": _HEADS,
            "max_position_embeddings": 4096,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": True,
        },
        scale_factor=SCALE_FACTOR,
        pad_token_id=tokenizer.pad_token_id,  # Idefics3's default (128002) lies outside this vocabulary
        image_token_id=int(tokenizer.convert_tokens_to_ids("<image>")),  # type: ignore[arg-type]  # one token: an int
        tie_word_embeddings=True,
        dtype="float32",
    )
    Idefics3ForConditionalGeneration(config).save_pretrained(target, safe_serialization=True)


def ensure_tiny_vlm(cache_dir: str | Path) -> Path:
    """Return the cached tiny VLM's folder, building it once; safe when several processes race."""
    root = Path(os.path.expanduser(str(cache_dir)))
    text_model = ensure_tiny_model(root)
    return build_once(root / TINY_VLM_VERSION, "config.json", lambda staging: _build(staging, text_model))
