"""A reasoning model's config (issue 55): `model.reasoning_parser` takes vLLM's own parser names, checked before
any work; `auto` picks one for the known thinking families by the model's name; the engine gets it where vLLM
takes it. And a chat row's template variables (`chat_template_kwargs`, `reasoning_effort`) merged by vLLM's rule."""

from __future__ import annotations

from typing import Any

import pytest

from workload.contract.config import ConfigError, ModelConfig, build_config
from workload.contract.reasoning import REASONING_PARSERS
from workload.engine.pipeline import engine_kwargs
from workload.files.template_args import check_kwargs, with_effort

BASE = {"input": {"uri": "in/"}, "output": {"uri": "out/"}}


def test_the_parser_names_are_the_pinned_vllms_registry() -> None:
    from vllm.reasoning import ReasoningParserManager

    assert set(ReasoningParserManager.list_registered()) == REASONING_PARSERS


def test_an_unknown_parser_stops_the_config_naming_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({**BASE, "model": {"reasoning_parser": "qwen-3"}})
    message = str(refused.value)
    assert "model.reasoning_parser" in message and "'qwen-3'" in message
    assert "qwen3" in message and "deepseek_r1" in message and "'none'" in message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("Qwen/Qwen3-8B", "qwen3"),
        ("Qwen/Qwen3-4B-Thinking-2507", "qwen3"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", None),  # never thinks: qwen3 would read its answer as thinking
        ("Qwen/Qwen3-Embedding-0.6B", None),
        ("deepseek-ai/DeepSeek-R1", "deepseek_r1"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek_r1"),
        ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", "deepseek_r1"),
        ("openai/gpt-oss-20b", "openai_gptoss"),
        ("s3://models/qwen3-14b/", "qwen3"),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        (None, None),  # the embedded tiny model: tests opt in
    ],
)
def test_auto_picks_the_families_parser_by_name(source: str | None, expected: str | None) -> None:
    assert ModelConfig(source=source).reasoning == expected


def test_none_and_a_named_parser_override_auto() -> None:
    assert ModelConfig(source="Qwen/Qwen3-8B", reasoning_parser="none").reasoning is None
    assert ModelConfig(source=None, reasoning_parser="qwen3").reasoning == "qwen3"


def test_the_engine_gets_the_parser_where_vllm_takes_it_and_resume_tells_outputs_apart() -> None:
    plain = build_config(BASE)
    thinking = build_config({**BASE, "model": {"reasoning_parser": "qwen3"}})
    assert "reasoning_parser" not in engine_kwargs(plain)["structured_outputs_config"]
    assert engine_kwargs(thinking)["structured_outputs_config"]["reasoning_parser"] == "qwen3"
    # The default leaves the hash of outputs begun before the field existed alone; a parser changes the output.
    assert "reasoning_parser" not in plain.output_affecting()["model"]
    assert plain.output_hash() != thinking.output_hash()


def _vllms_template_kwargs(kwargs: dict[str, Any] | None, effort: str | None) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], chat_template_kwargs=kwargs, reasoning_effort=effort
    )
    merged = dict(request.build_chat_params(None, "auto").chat_template_kwargs)
    # The call's own arguments, which the job sets from the messages (pipeline.ApplyChatTemplate).
    for key in ("add_generation_prompt", "continue_final_message", "documents"):
        merged.pop(key, None)
    return merged


@pytest.mark.parametrize(
    ("kwargs", "effort"),
    [
        ({"enable_thinking": False}, None),
        (None, "none"),
        (None, "high"),
        ({"enable_thinking": False}, "high"),  # the row's own switch wins over the effort's
        ({"reasoning_effort": "low", "x": 1}, "medium"),  # the field wins over the variable
    ],
)
def test_template_variables_merge_as_vllms_server_merges_them(kwargs: dict[str, Any] | None, effort: str) -> None:
    assert (with_effort(kwargs, effort) or {}) == _vllms_template_kwargs(kwargs, effort)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([1], "must be an object"),
        ({"add_generation_prompt": False}, "add_generation_prompt is set by the job"),
        ({"tokenize": True}, "tokenize is set by the job"),
    ],
)
def test_bad_template_variables_name_the_problem(value: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_kwargs(value)


def test_an_effort_vllm_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="reasoning_effort must be one of none, minimal, low"):
        with_effort(None, "extreme")
