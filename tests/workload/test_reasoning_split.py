"""The tiny model's thinking (issue 55): its tokenizer holds `<think>`/`</think>` as single, non-special tokens and
its template opens a thinking block unless `enable_thinking` is false, as Qwen3's thinking models do; vLLM's own
`qwen3` parser, run as the engine stage runs it, splits an answer into thinking and answer and counts the thinking
tokens. The same through the real engine and job: test_openai_batch_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from workload.engine.choices import CHOICES_COLUMN, engine_columns
from workload.engine.reasoning import ReasoningSplitter
from workload.engine.tiny_model import THINK_END, THINK_START, ensure_tiny_model

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models"))


def _engine(model: Path) -> Any:
    """Stands in for vLLM's AsyncLLM, of which the splitter reads only the tokenizer and the model's name and
    architecture: starting a real engine takes 15-20 s, and test_openai_batch_e2e.py does it once for all."""
    from vllm.tokenizers import get_tokenizer

    return SimpleNamespace(
        get_tokenizer=lambda: get_tokenizer(str(model)),
        model_config=SimpleNamespace(model=str(model), hf_config=SimpleNamespace(model_type="llama")),
    )


def test_the_tiny_template_opens_a_thinking_block_unless_thinking_is_off(tiny: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    ids = tokenizer.convert_tokens_to_ids([THINK_START, THINK_END])
    assert tokenizer(THINK_START + THINK_END, add_special_tokens=False).input_ids == ids  # one token each
    assert tokenizer.decode(ids, skip_special_tokens=True) == THINK_START + THINK_END  # kept in decoded text
    on = tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    off = tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert str(on).endswith("<|assistant|>\n<think>\n")
    assert str(off).endswith("<|assistant|>\n<think>\n\n</think>\n\n")


def test_vllms_qwen3_parser_splits_the_tiny_models_answer(tiny: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    splitter = ReasoningSplitter("qwen3", _engine(tiny))
    text = "weigh it</think>\n\nyes"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    thinking = len(tokenizer("weigh it", add_special_tokens=False).input_ids)
    split = splitter.split(text, ids, None, "{}")
    assert (split.reasoning, split.content, split.reasoning_tokens) == ("weigh it", "\n\nyes", thinking)
    # Thinking off: the template closed the block in the prompt, and the whole text is the answer.
    off = splitter.split(text, ids, None, json.dumps({"enable_thinking": False}))
    assert (off.reasoning, off.content, off.reasoning_tokens) == (None, text, 0)
    # Out of tokens while thinking: all thinking, no answer (as vLLM's server writes it: content null).
    cut = splitter.split("still weighing", tokenizer("still weighing").input_ids, None, "{}")
    assert cut.reasoning == "still weighing" and cut.content is None


def test_every_sample_of_a_chat_row_carries_its_thinking_apart(tiny: Path) -> None:
    from vllm.outputs import CompletionOutput

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    splitter = ReasoningSplitter("qwen3", _engine(tiny))
    samples = [
        CompletionOutput(i, text, tokenizer(text, add_special_tokens=False).input_ids, None, None, "stop")
        for i, text in enumerate(("a</think>b", "c"))
    ]
    output = SimpleNamespace(outputs=samples)
    columns = engine_columns(
        output, SimpleNamespace(n=2, logprobs=None), lambda s: splitter.split(s.text, s.token_ids, None, "{}")
    )
    choices = json.loads(columns[CHOICES_COLUMN])
    assert columns["generated_text"] == "b"
    assert [(c["reasoning"], c["text"], c["reasoning_tokens"]) for c in choices] == [("a", "b", 1), ("c", None, 1)]


def test_a_gpt_oss_answer_is_split_by_vllms_harmony_parser_as_the_server_picks_it(tiny: Path) -> None:
    """What of gpt-oss's harmony format runs without a download: the harmony encoding ships inside the
    `openai_harmony` wheel (vLLM's dependency), so a gpt-oss answer can be written as the model writes it (an
    `analysis` channel, then `final`) and read by vLLM's own parser; the model and its tokenizer stay out of reach
    (the stand-in engine's tokenizer is the tiny model's, which the harmony parser does not read)."""
    import openai_harmony

    encoding = openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    text = "<|channel|>analysis<|message|>Weigh it.<|end|><|start|>assistant<|channel|>final<|message|>Yes.<|return|>"
    ids = encoding.encode(text, allowed_special="all")
    engine = _engine(tiny)
    engine.model_config.hf_config.model_type = "gpt_oss"  # what makes vLLM's server pick its harmony parser
    split = ReasoningSplitter("openai_gptoss", engine).split(encoding.decode(ids), ids, None, "{}")
    assert (split.reasoning, split.content) == ("Weigh it.", "Yes.") and split.reasoning_tokens > 0
