"""The embedded default model: a tiny random-weight Llama and a locally trained tokenizer.

No model can be downloaded on a fresh machine without network access, so the demo and the tests use a model the
job builds itself in a few seconds. It produces random text at real engine speed for its size; a real model is a
config change (`model.source`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Bump when the recipe changes, so a cached copy of an older recipe is never reused.
TINY_MODEL_VERSION = "tiny-llama-v1"

# vLLM's CPU attention supports head sizes 32, 64, 80, ... only: hidden 64 / 2 heads = 32.
_HIDDEN = 64
_HEADS = 2
_LAYERS = 2
_VOCAB = 2048
_POSITIONS = 4096

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_TRAINING_TEXT = [
    "Batch inference runs many prompts through one model and writes every answer.",
    "Summarise the following support ticket in one sentence.",
    "Translate the product description into French, keeping the brand names.",
    "What is the capital of France? Answer with one word.",
    "Classify the review as positive, negative or neutral.",
    "Write a haiku about spot instances being reclaimed at night.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "Extract every date and amount from this invoice as JSON.",
]


def _build(target: Path) -> None:
    # Imported here: torch and transformers take seconds to import, and only the first run needs them.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=_POSITIONS,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(target)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=_VOCAB,
        hidden_size=_HIDDEN,
        intermediate_size=4 * _HIDDEN,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        num_key_value_heads=_HEADS,
        max_position_embeddings=_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(target, safe_serialization=True)


def ensure_tiny_model(cache_dir: str | Path) -> Path:
    """Return the cached tiny model's folder, building it once; safe when several processes race."""
    root = Path(os.path.expanduser(str(cache_dir)))
    target = root / TINY_MODEL_VERSION
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{TINY_MODEL_VERSION}-", dir=root))
    try:
        _build(staging)
        try:
            staging.rename(target)  # atomic: readers see a whole model or none
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
