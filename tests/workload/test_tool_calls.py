"""Tool calls on chat lines (issue 56) without an engine: `model.tool_call_parser` takes vLLM's own parser names,
checked before any work, `auto` by the model's family; a line's `tools`, `tool_choice` and `parallel_tool_calls` are
checked per line, a bad one the line's error naming the field; history turns with tool calls reach the template; the
tiny model's template renders tools in the format vLLM's `hermes` parser reads; the answer's shape is the official
SDK's. The engine's side (forcing and parsing the calls with vLLM's parser) runs in tests/workload/
test_openai_batch_e2e.py, beside `vllm run-batch`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from workload.contract.config import ConfigError, ModelConfig, SamplingParams, build_config
from workload.contract.tool_calls import TOOL_PARSERS
from workload.files.openai_batch import CHAT_URL, OpenAIDialect
from workload.files.rows import Origin, Record, RowError, ValidRow, validate_record
from workload.files.tools import finish_reason
from workload.job.openai_files import response_body

BASE = {"input": {"uri": "in/"}, "output": {"uri": "out/"}}
CHAT = OpenAIDialect(CHAT_URL, frozenset({"llm-batch"}))
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
]


def _line(**body: Any) -> bytes:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "Weather?"}], **body}
    return json.dumps({"custom_id": "r1", "method": "POST", "url": CHAT_URL, "body": body}).encode()


def _validated(raw: bytes, parser: str | None = "hermes", openai: OpenAIDialect | None = CHAT) -> ValidRow | RowError:
    return validate_record(Record(0, Origin("f", 0, 1), raw), SamplingParams(), openai, tool_parser=parser)


def test_the_parser_names_are_the_pinned_vllms_registry() -> None:
    from vllm.tool_parsers import ToolParserManager

    assert set(ToolParserManager.list_registered()) == TOOL_PARSERS


def test_an_unknown_parser_stops_the_config_naming_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({**BASE, "model": {"tool_call_parser": "hermes2"}})
    message = str(refused.value)
    assert "model.tool_call_parser" in message and "'hermes2'" in message and "llama3_json" in message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "hermes"),
        ("Qwen/Qwen3-8B", "hermes"),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        ("Qwen/Qwen3-Embedding-0.6B", None),
        ("NousResearch/Hermes-3-Llama-3.1-8B", "hermes"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
        ("openai/gpt-oss-20b", "openai"),
        ("google/gemma-2-9b-it", None),
        (None, "hermes"),  # the embedded tiny model writes Hermes-style calls
    ],
)
def test_auto_picks_the_families_parser_by_name(source: str | None, expected: str | None) -> None:
    assert ModelConfig(source=source).tools == expected
    assert ModelConfig(source=source, tool_call_parser="none").tools is None


def test_a_named_parser_changes_the_output_hash_and_auto_does_not() -> None:
    plain, named = build_config(BASE), build_config({**BASE, "model": {"tool_call_parser": "hermes"}})
    assert plain.output_hash() != named.output_hash()
    assert build_config({**BASE, "model": {"tool_call_parser": "auto"}}).output_hash() == plain.output_hash()


def test_a_line_with_tools_rides_on_the_row_and_its_history_reaches_the_template() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    row = _validated(_line(tools=[WEATHER], tool_choice=named, parallel_tool_calls=False, messages=HISTORY))
    assert isinstance(row, ValidRow), row
    assert row.tools == {"tools": [WEATHER], "tool_choice": named, "parallel_tool_calls": False}
    assert row.messages is not None
    # The arguments as an object, as vLLM's renderer gives them to tool-use templates.
    assert row.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert row.messages[2] == {"role": "tool", "content": "18 C", "tool_call_id": "c1"}
    auto = _validated(_line(tools=[WEATHER]))
    assert isinstance(auto, ValidRow) and auto.tools is not None and auto.tools["tool_choice"] == "auto"


def test_a_native_row_takes_the_same_keys() -> None:
    raw = json.dumps({"id": 1, "messages": HISTORY, "tools": [WEATHER], "tool_choice": "required"}).encode()
    row = _validated(raw, openai=None)
    assert isinstance(row, ValidRow) and row.tools is not None and row.tools["tool_choice"] == "required"
    prompt_row = _validated(json.dumps({"id": 2, "prompt": "x", "tools": [WEATHER]}).encode(), openai=None)
    assert isinstance(prompt_row, RowError) and "tools need 'messages'" in prompt_row.error_message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": []}, "tools"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0]"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_a_bad_tool_request_is_the_lines_error_naming_the_field(body: dict[str, Any], param: str) -> None:
    error = _validated(_line(**body))
    assert isinstance(error, RowError), error
    assert error.error_message.endswith(f"(param: {param})"), error.error_message


def test_a_model_without_a_parser_refuses_tools_naming_why() -> None:
    error = _validated(_line(tools=[WEATHER]), parser=None)
    assert isinstance(error, RowError) and error.error_type == "invalid_tools"
    assert "no tool-call parser" in error.error_message and error.error_message.endswith("(param: tools)")
    # tool_choice "none" without tools asks for nothing: the line is answered.
    assert isinstance(_validated(_line(tool_choice="none"), parser=None), ValidRow)


@pytest.mark.parametrize(
    ("choice", "calls", "engine", "expected"),
    [
        ("auto", [{"id": "c"}], "stop", "tool_calls"),
        ("auto", [], "stop", "stop"),
        ("required", [{"id": "c"}], "stop", "tool_calls"),
        ("required", [], "length", "length"),
        ({"type": "function", "function": {"name": "f"}}, [{"id": "c"}], "stop", "stop"),  # OpenAI's, for named
    ],
)
def test_the_finish_reason_is_vllms_servers(
    choice: Any, calls: list[dict[str, str]], engine: str, expected: str
) -> None:
    assert finish_reason(choice, calls, engine) == expected


def test_an_answer_with_calls_parses_as_the_sdks_chat_completion() -> None:
    call = {"id": "chatcmpl-tool-1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    choice = {"index": 0, "text": "", "finish_reason": "tool_calls", "logprobs": None, "tool_calls": [call]}
    row = {"id": "r1", "choices": json.dumps([choice]), "num_input_tokens": 9, "num_output_tokens": 7}
    body = ChatCompletion.model_validate(response_body(row, {"url": CHAT_URL}, "llm-batch", 0))
    made = body.choices[0].message.tool_calls
    assert body.choices[0].finish_reason == "tool_calls" and made is not None and len(made) == 1
    assert (made[0].id, made[0].type, made[0].function.name) == ("chatcmpl-tool-1", "function", "get_weather")  # type: ignore[union-attr]
    assert json.loads(made[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_the_tiny_models_template_writes_what_vllms_hermes_parser_reads(tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    from workload.engine.tiny_model import TOOL_CALL_END, TOOL_CALL_START, ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(tmp_path))
    row = _validated(_line(tools=[WEATHER], messages=HISTORY))
    assert isinstance(row, ValidRow) and row.messages is not None and row.tools is not None
    text = tokenizer.apply_chat_template(
        row.messages, tools=row.tools["tools"], tokenize=False, add_generation_prompt=True
    )
    assert json.dumps(WEATHER) in text and "<tool_response>\n18 C\n</tool_response>" in text
    # The history's call, written as the model is asked to write one, is read back by vLLM's parser itself.
    written = text[
        text.index(TOOL_CALL_START, text.index("<|assistant|>")) : text.index(
            TOOL_CALL_END, text.index("<|assistant|>")
        )
    ]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": ""}], tools=[WEATHER])
    parser = ToolParserManager.get_tool_parser("hermes")(tokenizer, request.tools)
    found = parser.extract_tool_calls(written + TOOL_CALL_END, request)
    assert found.tools_called and [c.function.name for c in found.tool_calls] == ["get_weather"]
    assert json.loads(found.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert all(len(tokenizer.encode(m, add_special_tokens=False)) == 1 for m in (TOOL_CALL_START, TOOL_CALL_END))
