"""The embedded default model: a tiny random-weight Llama and a locally trained tokenizer.

No model can be downloaded on a fresh machine without network access, so the demo and the tests use a model the
job builds itself in a few seconds. It produces random text at real engine speed for its size; a real model is a
config change (`model.source`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Bump when the recipe changes, so a cached copy of an older recipe is never reused.
TINY_MODEL_VERSION = "tiny-llama-v3"  # v2: think tokens and a Qwen3-style thinking block (issue 55); v3: tools (56)

# vLLM's CPU attention supports head sizes 32, 64, 80, ... only: hidden 64 / 2 heads = 32.
_HIDDEN = 64
_HEADS = 2
_LAYERS = 2
_VOCAB = 2048
_POSITIONS = 4096
# The shape its adapters are written for (workload/engine/tiny_adapter.py).
HIDDEN_SIZE, LAYERS = _HIDDEN, _LAYERS

# Reasoning as Qwen3's thinking models mark it: the answer's turn opens a `<think>` block (Qwen3-2507-Thinking's
# template writes `<think>\n` into the prompt), and `enable_thinking: false` closes it at once with an empty one
# (Qwen3's own template: `<think>\n\n</think>\n\n`), so vLLM's `qwen3` reasoning parser reads this model as it
# reads Qwen3. The model itself is random: whatever follows is what it samples.
THINK_START, THINK_END = "<think>", "</think>"
# Tools as Qwen2.5/Qwen3's templates write them (Hermes style), so vLLM's `hermes` tool parser reads this model as it
# reads Qwen: the tools' signatures as JSON lines inside <tools></tools> in a system turn (Qwen's wording shortened:
# the tests' engine holds 512 tokens, and this tokenizer spends about 2 for every 3 characters of JSON), each call
# the model makes as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, and a tool's answer inside
# <tool_response> in a user turn. An assistant's earlier calls are written back the same way (their arguments are
# objects here: vLLM's renderer and workload/files/tools.py parse the request's JSON strings for the template).
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'Call one as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call></s>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "<|user|>\n<tool_response>\n{{ message['content'] }}\n</tool_response></s>\n"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "<|assistant|>\n{{ message['content'] }}"
    "{% for call in message['tool_calls'] %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", '
    '"arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}</s>\n"
    "{% else %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "{% endif %}"
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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
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
    # Not special, as in Qwen3's tokenizer: the thinking survives `skip_special_tokens` in the decoded text, where
    # the reasoning parser looks for it, and each marker is one token id, which it counts by.
    # The tool-call markers likewise: one token each, kept in the text the tool parser reads.
    markers = (THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END)
    fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in markers])
    fast.chat_template = _CHAT_TEMPLATE
    if len(fast) > _VOCAB:  # the model's embedding must hold every token id the tokenizer gives
        raise RuntimeError(f"tiny model tokenizer has {len(fast)} tokens, more than the model's {_VOCAB}")
    fast.save_pretrained(target)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=_VOCAB,  # holds the think and tool-call tokens: the trained vocabulary is smaller than this
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
    return build_once(Path(os.path.expanduser(str(cache_dir))) / TINY_MODEL_VERSION, "config.json", _build)


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, written by `build` into a staging folder beside it and renamed into place whole unless `marker`
    (a file `build` writes) is already there: several processes may race, and readers see all of it or none."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)  # atomic: readers see a whole folder or none
        except OSError:
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
