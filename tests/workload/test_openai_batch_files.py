"""OpenAI Batch lines in, OpenAI Batch objects out, at module level (no engine): the translation to the job's rows,
every refusal with its parameter, and the output bodies judged by the official `openai` package's own types.
The same through the real job: test_openai_batch_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from workload.contract.config import SamplingParams
from workload.files.openai_batch import CHAT_URL, COMPLETIONS_URL, OPENAI_COLUMN, OpenAIDialect, RequestRefused, to_row
from workload.files.rows import Origin, Record, RowError, ValidRow, validate_record
from workload.job.openai_files import _error_line, response_body

CHAT = OpenAIDialect(CHAT_URL, frozenset({"llm-batch", "gpt-4o-mini"}))
COMPLETIONS = OpenAIDialect(COMPLETIONS_URL, frozenset({"llm-batch"}))


def _line(custom_id: str = "r1", url: str = CHAT_URL, **body: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "llm-batch"}
    if url == CHAT_URL:
        base["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        base["prompt"] = "Once"
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {**base, **body}}


def test_a_chat_request_maps_onto_the_native_row_one_to_one() -> None:
    line = _line(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Classify: "}, {"type": "text", "text": "great"}]},
        ],
        max_completion_tokens=32,
        temperature=0.7,
        top_p=0.9,
        n=2,
        stop="END",
        seed=4,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logit_bias={"17": -100},
        logprobs=True,
        top_logprobs=3,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        user="u-1",
        metadata={"team": "search"},
        model="gpt-4o-mini",
    )
    row = to_row(line, CHAT)
    assert row["id"] == "r1"
    assert row["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Classify: great"},
    ]
    sampling = SamplingParams.model_validate(row["sampling_params"])
    assert (sampling.max_tokens, sampling.n, sampling.seed, sampling.stop, sampling.logprobs) == (32, 2, 4, ["END"], 3)
    engine = SamplingParams.restore_types(sampling.for_engine())
    assert engine["structured_outputs"] == {"json": {"type": "object"}} and engine["logit_bias"] == {17: -100.0}
    assert json.loads(row[OPENAI_COLUMN]) == {
        "url": CHAT_URL,
        "model": "gpt-4o-mini",
        "user": "u-1",
        "metadata": {"team": "search"},
        "logprobs": True,
    }


@pytest.mark.parametrize(
    ("line", "param", "error_type"),
    [
        (_line(functions=[{"name": "f"}]), "functions", "invalid_request"),  # OpenAI's deprecated form of tools
        (_line(stream=True), "stream", "invalid_request"),
        (_line(store=True), "store", "invalid_request"),
        (_line(model="gpt-5"), "model", "model_not_found"),
        (_line(url=COMPLETIONS_URL), "url", "invalid_request"),
        # Images only in a user's content (issue 57), each with a url; a system message's parts are text.
        (_line(messages=[{"role": "system", "content": [{"type": "image_url", "image_url": {}}]}]), None, None),
        (
            _line(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages[0].content[0]",
            "invalid_image",
        ),
        (_line(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id", "invalid_request"),
        (_line(messages=[{"role": "function", "content": "x"}]), "messages[0].role", "invalid_request"),
        (_line(top_logprobs=2), "top_logprobs", "invalid_request"),
        (_line(response_format={"type": "json_schema", "json_schema": {}}), "response_format", "invalid_request"),
        ({**_line(), "method": "GET"}, "method", "invalid_request"),
        ({**_line(), "custom_id": ""}, "custom_id", "missing_id"),
    ],
)
def test_what_the_engine_cannot_honour_is_refused_naming_it(
    line: dict[str, Any], param: str | None, error_type: str | None
) -> None:
    with pytest.raises(RequestRefused) as refused:
        to_row(line, CHAT)
    if param is not None:
        assert refused.value.param == param and refused.value.error_type == error_type
    else:
        assert "only text parts are supported" in refused.value.message


def test_completions_take_one_prompt_and_openais_default_limit() -> None:
    row = to_row(_line(url=COMPLETIONS_URL, logprobs=2, echo=True), COMPLETIONS)
    assert row["prompt"] == "Once" and row["sampling_params"] == {"max_tokens": 16, "logprobs": 2}
    with pytest.raises(RequestRefused, match="one string"):
        to_row(_line(url=COMPLETIONS_URL, prompt=["a", "b"]), COMPLETIONS)
    with pytest.raises(RequestRefused) as refused:
        to_row(_line(url=COMPLETIONS_URL, suffix="x"), COMPLETIONS)
    assert refused.value.param == "suffix"


def test_a_refused_line_is_an_error_row_with_its_custom_id() -> None:
    raw = json.dumps(_line(custom_id="c-9", tools=[])).encode()
    result = validate_record(Record(0, Origin("f", 0, 1), raw), SamplingParams(), CHAT)
    assert isinstance(result, RowError) and (result.id, result.error_type) == ("c-9", "invalid_tools")
    assert "(param: tools)" in result.error_message
    line = _error_line(
        {"input_file": "f", "input_row": 0, "input_line": 1, "id": "c-9", "error_type": result.error_type,
         "error_message": result.error_message, "raw_input": ""}
    )  # fmt: skip
    error = line["response"]["body"]["error"]
    assert error["param"] == "tools" and "(param:" not in error["message"]  # errors.jsonl names it as OpenAI does
    ok = validate_record(Record(1, Origin("f", 1, 2), json.dumps(_line()).encode()), SamplingParams(), CHAT)
    assert isinstance(ok, ValidRow) and ok.messages == [{"role": "user", "content": "Hi"}]


def _position(token: str, logprob: float) -> dict[str, Any]:
    entry = {"token": token, "bytes": list(token.encode()), "logprob": logprob}
    return {**entry, "top_logprobs": [entry, {"token": "z", "bytes": [122], "logprob": -3.0}]}


ROW = {
    "id": "r1",
    "generated_text": "ab",
    "num_input_tokens": 5,
    "num_output_tokens": 4,
    "finish_reason": "stop",
    "choices": json.dumps(
        [
            {"index": 0, "text": "ab", "num_tokens": 2, "finish_reason": "stop", "logprobs": [_position("a", -0.1)]},
            {"index": 1, "text": "cd", "num_tokens": 2, "finish_reason": "length", "logprobs": [_position("c", -0.2)]},
        ]
    ),
}


def test_chat_bodies_parse_as_the_sdks_chat_completion() -> None:
    body = response_body(ROW, {"url": CHAT_URL, "model": "x", "logprobs": True}, "llm-batch", 1764547200)
    parsed = ChatCompletion.model_validate(body)
    assert [c.message.content for c in parsed.choices] == ["ab", "cd"]
    assert parsed.choices[1].finish_reason == "length" and parsed.usage is not None
    assert parsed.usage.completion_tokens == 4 and parsed.usage.total_tokens == 9
    content = parsed.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content[0].top_logprobs) == 2


def test_usage_names_the_prompts_cached_tokens_where_the_results_count_them() -> None:
    """vLLM's prefix-cache hits (issue 55) as OpenAI's usage.prompt_tokens_details.cached_tokens, on both endpoints;
    a shard committed before the job counted them has none, and the body says nothing rather than 0."""
    counted = {**ROW, "num_cached_tokens": 3}
    chat = ChatCompletion.model_validate(response_body(counted, {"url": CHAT_URL, "model": "x"}, "m", 1764547200))
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens == 3
    completion = Completion.model_validate(
        response_body(counted, {"url": COMPLETIONS_URL, "model": "x"}, "m", 1764547200)
    )
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 3
    before = ChatCompletion.model_validate(response_body(ROW, {"url": CHAT_URL, "model": "x"}, "m", 1764547200))
    assert before.usage is not None and before.usage.prompt_tokens_details is None


def test_completion_bodies_parse_as_the_sdks_completion_with_echo_offsets() -> None:
    facts = {"url": COMPLETIONS_URL, "model": "x", "logprobs": True, "echo": True, "prompt": "Once "}
    parsed = Completion.model_validate(response_body(ROW, facts, "llm-batch", 1764547200))
    assert parsed.choices[0].text == "Once ab"
    logprobs = parsed.choices[0].logprobs
    assert logprobs is not None and logprobs.text_offset == [5] and logprobs.top_logprobs == [{"a": -0.1, "z": -3.0}]


def test_error_lines_say_400_for_the_request_500_for_the_engine_and_nothing_for_unparsed_lines() -> None:
    base = {"input_file": "f", "input_row": 3, "input_line": 4, "raw_input_encoding": "utf-8"}
    refused = _error_line({**base, "id": "a", "error_type": "invalid_request", "error_message": "no", "raw_input": ""})
    assert refused["response"]["status_code"] == 400 and refused["custom_id"] == "a"
    assert refused["response"]["body"]["error"]["type"] == "invalid_request_error"
    hung = _error_line({**base, "id": "b", "error_type": "engine_hang", "error_message": "stuck", "raw_input": ""})
    assert hung["response"]["status_code"] == 500
    torn = _error_line(
        {**base, "id": None, "error_type": "malformed_json", "error_message": "bad", "raw_input": '{"custom_id": "c"'}
    )
    assert torn["response"] is None and torn["custom_id"] == "c" and torn["error"]["message"].startswith("line 4:")


def test_thinking_switches_on_a_chat_line_reach_the_row_and_bad_ones_are_refused_naming_them() -> None:
    """Issue 55: both were refused (400) before; now they ride on the row to the chat template."""
    row = to_row(_line(chat_template_kwargs={"enable_thinking": False}), CHAT)
    assert row["chat_template_kwargs"] == {"enable_thinking": False}
    row = to_row(_line(reasoning_effort="low"), CHAT)
    assert row["chat_template_kwargs"] == {"reasoning_effort": "low", "enable_thinking": True}
    assert "chat_template_kwargs" not in to_row(_line(), CHAT)  # the template's own defaults
    for body, param in (
        ({"chat_template_kwargs": "off"}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ):
        with pytest.raises(RequestRefused) as refused:
            to_row(_line(**body), CHAT)
        assert refused.value.param == param, body
    with pytest.raises(RequestRefused) as refused:  # a completions line has no template
        to_row(_line(url=COMPLETIONS_URL, reasoning_effort="low"), COMPLETIONS)
    assert refused.value.param == "reasoning_effort"


def test_a_native_chat_row_takes_template_variables_and_a_prompt_row_is_told_it_has_no_template() -> None:
    chat = {"id": "a", "messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": 0}}
    ok = validate_record(Record(0, Origin("f", 0, 1), json.dumps(chat).encode()), SamplingParams())
    assert isinstance(ok, ValidRow) and ok.chat_template_kwargs == {"enable_thinking": 0} and not ok.passthrough
    prompt = {"id": "b", "prompt": "Hi", "chat_template_kwargs": {"enable_thinking": False}}
    bad = validate_record(Record(1, Origin("f", 1, 2), json.dumps(prompt).encode()), SamplingParams())
    assert isinstance(bad, RowError) and bad.error_type == "invalid_chat_template_kwargs"
    assert "needs 'messages'" in bad.error_message


def test_a_thinking_answer_carries_its_reasoning_and_counts_its_tokens_as_the_sdk_reads_them() -> None:
    """What the official SDK keeps: `usage.completion_tokens_details.reasoning_tokens` is typed; `reasoning` is no
    field of its ChatCompletionMessage and survives as an extra (pydantic's model_extra), read by attribute."""
    row = {
        **ROW,
        "choices": json.dumps(
            [
                {"index": 0, "text": "yes", "reasoning": "weigh it", "reasoning_tokens": 3, "num_tokens": 5,
                 "finish_reason": "stop", "logprobs": None},
                {"index": 1, "text": None, "reasoning": "still weighing", "reasoning_tokens": 4, "num_tokens": 4,
                 "finish_reason": "length", "logprobs": None},
            ]
        ),
    }  # fmt: skip
    parsed = ChatCompletion.model_validate(response_body(row, {"url": CHAT_URL, "model": "x"}, "llm-batch", 1))
    first, second = (choice.message for choice in parsed.choices)
    assert (first.content, first.model_extra) == ("yes", {"reasoning": "weigh it"})
    assert second.content is None and (second.model_extra or {})["reasoning"] == "still weighing"  # no answer
    assert parsed.usage is not None and parsed.usage.completion_tokens_details is not None
    assert parsed.usage.completion_tokens_details.reasoning_tokens == 7
    plain = response_body(ROW, {"url": CHAT_URL, "model": "x"}, "llm-batch", 1)
    assert plain["choices"][0]["message"]["reasoning"] is None and "completion_tokens_details" not in plain["usage"]
