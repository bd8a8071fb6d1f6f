"""`/v1/responses` lines (issue 56): translated into the job's chat row, refused naming the parameter, and answered
with a body the official SDK's `Response` type parses. The rows fed to the answer stand for what the engine stage
commits (the columns test_openai_batch_files.py feeds too); the real engine's answers are checked in
tests/workload/test_openai_batch_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response

from workload.contract.config import InputConfig, SamplingParams
from workload.files.openai_batch import CHAT_URL, OPENAI_COLUMN, OpenAIDialect, RequestRefused, split_param, to_row
from workload.files.responses import RESPONSES_URL
from workload.files.rows import Origin, Record, RowError, validate_record
from workload.job.input_plan import plan_input
from workload.job.openai_files import _answer_line, _error_line

RESPONSES = OpenAIDialect(RESPONSES_URL, frozenset({"llm-batch", "gpt-4o-mini"}))
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _line(custom_id: str = "r1", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": RESPONSES_URL, "body": {"model": "llm-batch", **body}}


def test_a_string_input_is_one_user_message_and_the_limits_are_chats() -> None:
    row = to_row(_line(input="Hi", max_output_tokens=20, temperature=0.5, top_p=0.9, metadata={"k": "v"}), RESPONSES)
    assert row["messages"] == [{"role": "user", "content": "Hi"}]
    assert row["sampling_params"] == {"max_tokens": 20, "temperature": 0.5, "top_p": 0.9}
    facts = json.loads(row[OPENAI_COLUMN])
    assert facts["url"] == RESPONSES_URL and facts["metadata"] == {"k": "v"}


def _part(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


def test_messages_with_instructions_text_parts_a_schema_and_an_effort_become_the_chat_row() -> None:
    given = [
        {"role": "developer", "content": "Answer in JSON."},
        {"type": "message", "role": "user", "content": [_part("Is it "), _part("ok?")]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
        {"role": "user", "content": "Go on."},
    ]  # fmt: skip
    form = {"type": "json_schema", "name": "verdict", "schema": SCHEMA, "strict": True}
    row = to_row(
        _line(input=given, instructions="You judge.", text={"format": form}, reasoning={"effort": "none"}), RESPONSES
    )
    assert [m["role"] for m in row["messages"]] == ["system", "system", "user", "assistant", "user"]
    assert row["messages"][0]["content"] == "You judge." and row["messages"][2]["content"] == "Is it ok?"
    assert row["sampling_params"]["structured_outputs"] == {"json": SCHEMA}  # chat's response_format path
    assert row["chat_template_kwargs"] == {"reasoning_effort": "none", "enable_thinking": False}  # issue 55's
    plain = to_row(_line(input="x", text={"format": {"type": "json_object"}}), RESPONSES)
    assert plain["sampling_params"]["structured_outputs"] == {"json_object": True}


def test_parameters_that_ask_nothing_pass() -> None:
    harmless = {"store": True, "user": "u1", "background": False, "stream": False, "truncation": "disabled"}
    harmless |= {"tools": [], "tool_choice": "auto", "parallel_tool_calls": False, "include": []}
    row = to_row(_line(input="x", text={"format": {"type": "text"}, "verbosity": "medium"}, **harmless), RESPONSES)
    assert "structured_outputs" not in row["sampling_params"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no earlier responses"),
        ({"conversation": "conv_1"}, "conversation", "keeps no earlier responses"),
        ({"background": True}, "background", "background"),
        ({"stream": True}, "stream", "nothing to stream"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "include"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "stored prompt"),
        ({"truncation": "auto"}, "truncation", "never cut silently"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "hosted tools"),
        ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools[0].defer_loading", "not supp"),
        ({"tools": {"type": "function"}}, "tools", "array of function tools"),
        ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice", "not supported"),
        ({"max_tool_calls": 2}, "max_tool_calls", "one turn"),
        ({"top_logprobs": 2}, "top_logprobs", "/v1/chat/completions"),
        ({"frobnicate": 1}, "frobnicate", "not supported"),
        ({"n": 2}, "n", "not supported"),  # Responses has no n
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", "must be a string"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments", "non-empty"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "only messages and function calls"),
        # An input_image part is read (issue 57; tests/workload/test_images.py) and needs its url.
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url",
         "string url"),
        # A file_id is read too (a Batch API vision file: tests/workload/test_batch_api_vision.py), alone.
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1", "image_url": "u"}]}]},
         "input[0].content[0].file_id", "both image_url and file_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": 7}]}]},
         "input[0].content[0].file_id", "file id string"),
        ({"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
         "input[0].content[0]", "input_image"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]", "input_file"),
        ({"input": [{"role": "tool", "content": "1"}]}, "input[0].role", "'tool'"),
        ({"input": []}, "input", "non-empty"),
        ({"input": None}, "input", "string or a non-empty array"),
        ({"instructions": ["a"]}, "instructions", "string"),
        ({"max_output_tokens": 0}, "max_output_tokens", "positive integer"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "reasoning.effort must be one of"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "never summarised"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format", "'grammar'"),
        ({"text": {"format": {"type": "json_schema", "name": "r"}}}, "text.format", "schema must be an object"),
        ({"text": {"verbosity": "low"}}, "text", "verbosity"),
        ({"model": "gpt-5"}, "model", "not served here"),
    ],
)  # fmt: skip
def test_what_the_job_cannot_answer_is_refused_naming_the_parameter(
    body: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(RequestRefused) as refused:
        to_row(_line(**{"input": "x", **body}), RESPONSES)
    assert refused.value.param == param and says in refused.value.message, refused.value.message


def test_a_refused_line_is_the_error_line_the_other_endpoints_write() -> None:
    raw = json.dumps(_line(custom_id="c-9", input="x", previous_response_id="resp_1")).encode()
    result = validate_record(Record(0, Origin("f", 0, 1), raw), SamplingParams(), RESPONSES)
    assert isinstance(result, RowError) and (result.id, result.error_type) == ("c-9", "invalid_request")
    line = _error_line(
        {"input_file": "f", "input_row": 0, "input_line": 1, "id": "c-9", "error_type": result.error_type,
         "error_message": result.error_message, "raw_input": ""}
    )  # fmt: skip
    assert line["response"]["status_code"] == 400
    assert line["response"]["body"]["error"]["param"] == "previous_response_id"
    chat_url = _line(input="x")
    chat_url["url"] = "/v1/chat/completions"  # one url per batch, as for the others
    with pytest.raises(RequestRefused) as other:
        to_row(chat_url, RESPONSES)
    assert other.value.param == "url"


def _answered(line: dict[str, Any], **engine: Any) -> Response:
    """The output line for `line` once the engine stage answered it with `engine`'s columns."""
    row = to_row(line, RESPONSES)
    sample = {"index": 0, "text": "{}", "finish_reason": "stop", "logprobs": None, **engine}
    row.update(num_input_tokens=7, num_output_tokens=5, num_cached_tokens=2, choices=json.dumps([sample]))
    answer = _answer_line(row, "llm-batch", 1764547200)
    assert answer["response"]["status_code"] == 200 and answer["custom_id"] == line["custom_id"]
    assert answer == _answer_line(row, "llm-batch", 1764547200)  # ids derived from the row: a rebuild is the same
    return Response.model_validate(answer["response"]["body"])


def test_an_answer_parses_as_the_sdks_response_with_its_request_echoed() -> None:
    form = {"type": "json_schema", "name": "verdict", "schema": SCHEMA, "strict": True}
    line = _line(input="x", instructions="Judge.", temperature=0.2, text={"format": form}, metadata={"k": "v"})
    parsed = _answered(line, text='{"ok": true}')
    assert (parsed.object, parsed.status, parsed.incomplete_details, parsed.error) == (
        "response",
        "completed",
        None,
        None,
    )
    assert parsed.id.startswith("resp_") and parsed.model == "llm-batch" and parsed.created_at == 1764547200
    assert [item.type for item in parsed.output] == ["message"] and parsed.output_text == '{"ok": true}'
    assert (parsed.instructions, parsed.temperature, parsed.metadata) == ("Judge.", 0.2, {"k": "v"})
    assert parsed.text is not None and parsed.text.format.type == "json_schema"
    assert (parsed.tools, parsed.tool_choice, parsed.parallel_tool_calls) == ([], "auto", True)
    usage = parsed.usage
    assert usage is not None and (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (7, 5, 12)
    assert usage.input_tokens_details.cached_tokens == 2 and usage.output_tokens_details.reasoning_tokens == 0


def test_split_thinking_is_a_reasoning_item_and_a_cut_answer_is_incomplete() -> None:
    parsed = _answered(
        _line(input="x", max_output_tokens=5),
        text="yes",
        reasoning="weigh it",
        reasoning_tokens=3,
        finish_reason="length",
    )
    reasoning, message = parsed.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "weigh it" and reasoning.summary == []
    assert message.type == "message" and parsed.output_text == "yes"
    assert parsed.status == "incomplete" and parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens" and parsed.max_output_tokens == 5
    assert parsed.usage is not None and parsed.usage.output_tokens_details.reasoning_tokens == 3
    # All thinking, no answer (the length ran out inside it): the message item holds no text.
    silent = _answered(_line(input="x"), text=None, reasoning="hmm", reasoning_tokens=5, finish_reason="length")
    assert silent.output[1].type == "message" and silent.output[1].content == [] and silent.output_text == ""


def test_chat_and_responses_lines_share_an_input_only_where_no_url_was_named(tmp_path: Path) -> None:
    """An input whose url comes from its first line (the job run on its own, like `vllm run-batch`) answers chat and
    responses lines alike; one whose url was named (`input.openai_url`, which the Batch API sets: OpenAI's one url
    per batch) refuses the other, and no input takes a completions or embeddings line beside chat rows."""
    chat = {"custom_id": "c1", "method": "POST", "url": CHAT_URL, "body": {"model": "llm-batch", "messages": []}}
    (tmp_path / "in.jsonl").write_text(json.dumps(chat) + "\n" + json.dumps(_line("r1", input="Hi")) + "\n")
    found = plan_input(InputConfig(uri=str(tmp_path))).openai
    assert found is not None and found.url == CHAT_URL and found.mixed_chat
    assert found.takes(RESPONSES_URL) and found.takes(CHAT_URL)
    assert not found.takes("/v1/completions") and not found.takes("/v1/embeddings")
    assert to_row(_line("r1", input="Hi"), found)["messages"] == [{"role": "user", "content": "Hi"}]
    named = plan_input(InputConfig(uri=str(tmp_path), openai_url=CHAT_URL)).openai
    assert named is not None and not named.mixed_chat
    with pytest.raises(RequestRefused) as refused:
        to_row(_line("r1", input="Hi"), named)
    assert refused.value.param == "url" and "one url per batch" in refused.value.message


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True, "description": "Weather."}


def _validated(line: dict[str, Any]) -> Any:
    raw = json.dumps(line).encode()
    return validate_record(Record(0, Origin("f", 0, 1), raw), SamplingParams(), RESPONSES, tool_parser="hermes")


def test_function_tools_a_named_choice_and_a_call_history_become_chats() -> None:
    """Responses' flat function tools and named choice are chat's nested ones on the row, so chat's checks, template
    and vLLM tool parser answer them; a history's function_call items become one assistant turn with tool_calls,
    and function_call_output items tool turns."""
    history = [
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
    ]
    line = _line(input=history, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    valid = _validated({**line, "body": {**line["body"], "parallel_tool_calls": False}})
    assert not isinstance(valid, RowError), valid
    chat_tool = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
    assert valid.tools == {
        "tools": [chat_tool],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
    }
    roles = [(m["role"], len(m.get("tool_calls") or []), m.get("tool_call_id")) for m in valid.messages or []]
    assert roles == [("user", 0, None), ("assistant", 2, None), ("tool", 0, "call_1"), ("tool", 0, "call_2")]
    assert valid.messages[1]["tool_calls"][1]["function"]["arguments"] == {"city": "Lyon"}  # type: ignore[index]


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "function", "name": "bad name!", "parameters": WEATHER}], None, "tools[0].name"),
        ([{"type": "function", "name": "f", "parameters": {"type": "string"}}], None, "tools[0].parameters"),
        ([TOOL], {"type": "function", "name": "other"}, "tool_choice.name"),
        (None, "required", "tool_choice"),
    ],
)
def test_a_bad_function_tool_is_the_lines_error_naming_this_apis_field(
    tools: list[dict[str, Any]] | None, choice: Any, param: str
) -> None:
    body: dict[str, Any] = {"input": "x", **({"tools": tools} if tools else {})}
    if choice is not None:
        body["tool_choice"] = choice
    result = _validated(_line(**body))
    assert isinstance(result, RowError) and result.error_type == "invalid_tools", result
    message, named = split_param(result.error_message)
    assert named == param, result.error_message
    assert ".function" not in message  # chat's nesting never shows through


def test_calls_are_function_call_items_and_the_echo_holds_the_tools() -> None:
    line = _line(input="Weather in Paris?", tools=[TOOL], tool_choice="required")
    calls = [{"id": "call_9", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    answer = _answered(line, text="", finish_reason="stop", tool_calls=calls)
    assert [item.type for item in answer.output] == ["function_call"]
    call = answer.output[0]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_9", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert [tool.name for tool in answer.tools] == ["get_weather"] and answer.tool_choice == "required"  # type: ignore[union-attr]
    said = _answered(line, text="It is sunny.", finish_reason="stop")  # no call: the message as ever
    assert [item.type for item in said.output] == ["message"] and said.output_text == "It is sunny."
