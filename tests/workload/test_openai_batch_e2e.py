"""OpenAI Batch files through the real job (Ray, Ray Data LLM, vLLM, the embedded model), judged by clients nobody
here wrote: every body parses as the official `openai` package's ChatCompletion or Completion, schema answers
validate with `jsonschema`, and vLLM's own batch runner (`vllm run_batch`) on the same chat input and model gives
the same custom_ids, status codes and body keys, line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from transformers import AutoTokenizer

from tests.workload.jobrun import ENGINE, run_job, write_config
from workload.engine.tiny_adapter import ensure_tiny_adapter
from workload.engine.tiny_model import TINY_MODEL_VERSION, ensure_tiny_model

pytestmark = pytest.mark.slow

# Fields vLLM's run_batch puts in a body that are not OpenAI's (vLLM extensions).
VLLM_EXTENSIONS = {
    "service_tier",
    "system_fingerprint",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
}
SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["good", "bad"]}, "ok": {"type": "boolean"}},
    "required": ["label", "ok"],
    "additionalProperties": False,
}


# A tool whose arguments a random model can only fill one way per field: `strict` asks vLLM's hermes structural tag
# for the parameters' schema (without it the tag takes any JSON object, which a random model may never close).
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
    "required": ["city"],
}
# One short tool: the tests' engine holds 512 tokens, and the tiny tokenizer spends many on JSON.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": WEATHER_PARAMETERS}}]
# Thinking closed in the prompt (as for the schema rows): the forced call's grammar starts at the first token.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]


def _tool_rows(blanks: dict[str, float]) -> list[dict[str, Any]]:
    """Issue 56's rows: a named call, a required one (one call at most), an auto choice, and a history with a
    tool's answer. `blanks`: a logit_bias against JSON's whitespace tokens for the forced rows: the grammar lets JSON
    take free whitespace inside the call, and the random model, left to itself, wrote spaces until max_tokens
    (first run, 2026-12-07). The grammar still forces the tag's own newlines (-100 beats a masked token)."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    history = _chat("tool-history", tools=TOOLS, **NO_THINKING)
    history["body"]["messages"] = HISTORY
    forced = {"max_tokens": 100, "logit_bias": blanks, **NO_THINKING}
    return [
        _chat("tool-named", tools=TOOLS, tool_choice=named, **forced),
        _chat("tool-required", tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **forced),
        _chat("tool-auto", tools=TOOLS, tool_choice="auto", **NO_THINKING),
        history,
    ]


def _check_tools(bodies: dict[str, ChatCompletion]) -> None:
    """The forced calls name their function and their arguments validate against its parameters; auto and the
    history rows are answered (a random model rarely writes a call of its own)."""
    for custom_id, reason in (("tool-named", "stop"), ("tool-required", "tool_calls")):
        choice = bodies[custom_id].choices[0]
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and choice.finish_reason == reason, (custom_id, choice)
        call = calls[0]
        assert call.type == "function" and call.id and call.function.name == "get_weather", call  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
        assert choice.message.content == "", choice  # vLLM's server's content for a forced call
    for custom_id in ("tool-auto", "tool-history"):
        choice = bodies[custom_id].choices[0]
        called = bool(choice.message.tool_calls)
        assert choice.finish_reason == ("tool_calls" if called else choice.finish_reason) and choice.finish_reason
        print(f"{custom_id}: {'called ' if called else 'answered '}{choice.message}")


def _chat(custom_id: str, **body: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "You label reviews."},
        {"role": "user", "content": [{"type": "text", "text": f"Review {custom_id}: it works."}]},
    ]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "llm-batch", "messages": messages, "max_tokens": 12, "temperature": 0, **body},
    }


# A system prompt of about 350 tokens (the embedded model's tokenizer): longer than a KV-cache block, so the second
# line that opens with it finds its blocks in vLLM's prefix cache (issue 55: usage.prompt_tokens_details).
SHARED_PREFIX = " ".join(["Label each review as good or bad, and say whether the product works as sold."] * 8)


def _shared(custom_id: str) -> dict[str, Any]:
    line = _chat(custom_id)
    line["body"]["messages"][0]["content"] = SHARED_PREFIX
    return line


# A LoRA adapter of the tiny model (issue 57), served beside it in the same engine by the job and by vLLM's runner.
ADAPTER = "tiny-lora"


def _same(custom_id: str, **body: Any) -> dict[str, Any]:
    """One prompt for the base and the adapter lines: the adapter's (non-zero) weights change the greedy answer."""
    line = _chat(custom_id, chat_template_kwargs={"enable_thinking": False}, **body)
    line["body"]["messages"][1]["content"] = "Review: it works."
    return line


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path: Path, name: str, lines: list[Any], **model: Any) -> Path:
    source = tmp_path / name / "in" / "batch.jsonl"
    source.parent.mkdir(parents=True)
    source.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    out = tmp_path / name / "out"
    config = write_config(
        tmp_path / name / "job.yaml",
        str(source.parent),
        str(out),
        tmp_path / "models",
        model={"cache_dir": str(tmp_path / "models"), "aliases": ["gpt-4o-mini"], **model},
        engine=ENGINE,
    )
    code, log = run_job(["run", "--config", str(config)], timeout=420)
    assert code == 0, log
    return out


def test_chat_batch_in_openai_files_out_matching_vllms_own_runner(tmp_path: Path) -> None:
    """Also a thinking model (issue 55): the job and vLLM's runner both run vLLM's `qwen3` reasoning parser over the
    tiny model, whose template opens a thinking block unless `enable_thinking` is false."""
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(tmp_path / "models"))
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    blanks = {str(i): -100.0 for c in " \n\t\r" for i in tokenizer.encode(c, add_special_tokens=False)}
    json_schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    good = [
        _chat("plain"),
        _chat("alias", model="gpt-4o-mini"),
        _chat("two", n=2, temperature=0.9, seed=3),
        _chat("lp", logprobs=True, top_logprobs=2),
        # Thinking closed in the prompt: the grammar constrains the answer from its first token.
        _chat("schema", max_tokens=60, response_format=json_schema, chat_template_kwargs={"enable_thinking": False}),
        # Thinking open: the grammar waits for the thinking to end (which a random model rarely writes).
        _chat("schema-think", response_format=json_schema),
        _chat("effort-none", reasoning_effort="none"),
        # The shape forced: `</think>` made likely (about 1 in 6 a token) on a seeded sample, so the model's own text
        # holds the end of its thinking; logprobs show every token the parser read. (Seed 5 on 2026-12-07: the
        # first token was `</think>`, so no thinking and a 7-character answer; a seed whose end falls later would
        # show both parts, not yet run.)
        _chat("think", max_tokens=32, temperature=1.0, seed=5, logit_bias={str(think_end): 6}, logprobs=True),
        # vLLM's own fields, as a `vllm run-batch` file names them (issue 55, docs/job.md "vLLM's own fields")
        _chat("vllm-sampling", temperature=0.8, top_k=3, min_tokens=10, repetition_penalty=1.2, max_tokens=12),
        # Thinking closed, as for the schema: a grammar from the first token.
        _chat(
            "vllm-choice",
            structured_outputs={"choice": ["good", "bad"]},
            stream=False,
            chat_template_kwargs={"enable_thinking": False},
        ),
        _shared("prefix-first"),
        _shared("prefix-later"),
        *_tool_rows(blanks),
        # LoRA (issue 57): lines naming the adapter run on it, beside base lines in the same engine.
        _chat("lora", model=ADAPTER),
        _same("base-same"),
        _same("lora-same", model=ADAPTER),
    ]
    bad = [
        _chat("beam", use_beam_search=True),
        _chat("wrong-model", model="gpt-5"),
        # A function whose parameters are not an object's schema: the line's 400 names the field.
        _chat("tools", tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
        _chat("plain"),  # a repeated custom_id: the first line wins
        {"custom_id": "other-url", "method": "POST", "url": "/v1/completions", "body": {"model": "llm-batch"}},
        '{"custom_id": "torn", "body": {',
    ]
    responses_good, responses_bad = _responses_lines()  # answered in the same job: one engine start (issue 56)
    adapter = ensure_tiny_adapter(tmp_path / "adapters", rank=8)
    adapters = {ADAPTER: {"source": str(adapter), "rank": 8}}
    out = _run(
        tmp_path, "chat", good + responses_good + bad + responses_bad, reasoning_parser="qwen3", adapters=adapters
    )
    every_answer, every_error = _lines(out / "output.jsonl"), _lines(out / "errors.jsonl")

    def responses(line: dict[str, Any]) -> bool:
        return str(line["custom_id"]).startswith("resp-")

    _check_responses(
        responses_good, [a for a in every_answer if responses(a)], [e for e in every_error if responses(e)]
    )
    answers = [a for a in every_answer if not responses(a)]
    errors = [e for e in every_error if not responses(e)]
    assert [a["custom_id"] for a in answers] == [line["custom_id"] for line in good]  # input order
    bodies = {a["custom_id"]: ChatCompletion.model_validate(a["response"]["body"]) for a in answers}
    assert all(a["response"]["status_code"] == 200 and a["error"] is None for a in answers)
    assert len(bodies["two"].choices) == 2 and bodies["two"].usage is not None
    assert bodies["two"].usage.completion_tokens >= 2  # every choice's tokens count
    content = bodies["lp"].choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(position.top_logprobs) == 2 for position in content)
    schema_choice = bodies["schema"].choices[0]
    assert schema_choice.finish_reason == "stop", schema_choice
    jsonschema.validate(json.loads(schema_choice.message.content or ""), SCHEMA)
    on_adapter = {"lora", "lora-same"}
    assert all(body.model == (ADAPTER if c in on_adapter else "llm-batch") for c, body in bodies.items())
    base_text, lora_text = (bodies[c].choices[0].message.content for c in ("base-same", "lora-same"))
    # The adapter changed the answer: the line ran on it. Also the CPU's spare LoRA slot at work: without it, a base
    # line batched beside an adapter line got the adapter's answer (workload/contract/adapter_config.py).
    assert base_text != lora_text, (base_text, lora_text)
    by_id = {(e["custom_id"], e["response"]["status_code"] if e["response"] else None) for e in errors}
    assert by_id == {
        ("beam", 400),
        ("wrong-model", 400),
        ("tools", 400),
        ("plain", 400),
        ("other-url", 400),
        ("torn", None),
    }
    codes = {e["custom_id"]: (e["response"] or {}).get("body", {}).get("error", {}).get("code") for e in errors}
    assert codes["wrong-model"] == "model_not_found" and codes["plain"] == "duplicate_id"
    wrong_model = next(e for e in errors if e["custom_id"] == "wrong-model")["response"]["body"]["error"]
    assert f"(served: gpt-4o-mini, llm-batch, {ADAPTER})" in wrong_model["message"], wrong_model
    beam = next(e for e in errors if e["custom_id"] == "beam")["response"]["body"]["error"]
    assert beam["param"] == "use_beam_search" and "beam search" in beam["message"]
    tools = next(e for e in errors if e["custom_id"] == "tools")["response"]["body"]["error"]
    assert tools["param"] == "tools[0].function.parameters" and tools["code"] == "invalid_tools", tools
    torn = next(e for e in errors if e["custom_id"] == "torn")["error"]["message"]
    assert torn.startswith(f"line {len(good) + len(responses_good) + len(bad)}:"), torn
    sampled = bodies["vllm-sampling"].usage
    assert sampled is not None and sampled.completion_tokens >= 10  # min_tokens held EOS off
    assert bodies["vllm-choice"].choices[0].message.content in ("good", "bad")
    cached = {c: bodies[c].usage.prompt_tokens_details for c in ("prefix-first", "prefix-later")}  # type: ignore[union-attr]
    assert all(details is not None for details in cached.values()), cached
    assert cached["prefix-later"].cached_tokens > 0, cached  # type: ignore[union-attr,operator]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cached_tokens"] >= cached["prefix-later"].cached_tokens  # type: ignore[union-attr]
    # The batch's usage sums each line's thinking (chat's completion_tokens_details, Responses' output_tokens_details).
    thinking = [
        (a["response"]["body"]["usage"].get(k) or {}).get("reasoning_tokens", 0)
        for a in every_answer
        for k in ("completion_tokens_details", "output_tokens_details")
    ]
    assert summary["reasoning_tokens"] == sum(thinking) > 0, thinking
    _check_thinking(bodies)
    _check_tools(bodies)

    # vLLM's own runner on the job's model, over the lines it can serve (it has no aliases: those stay ours).
    model = tmp_path / "models" / TINY_MODEL_VERSION
    reference_in = tmp_path / "reference.jsonl"
    served = [line for line in good if line["custom_id"] != "alias"]
    reference_in.write_text("".join(json.dumps(line) + "\n" for line in served))
    reference_out = tmp_path / "reference-out.jsonl"
    command = [
        sys.executable,
        "-m",
        "workload.serve.vllm_cli",
        "run-batch",
        "-i",
        str(reference_in),
        "-o",
        str(reference_out),
    ]
    command += ["--model", str(model), "--served-model-name", "llm-batch", "--max-model-len", "512", "--enforce-eager"]
    command += ["--enable-prompt-tokens-details"]  # vLLM's usage then carries cached_tokens, as the job's does
    command += ["--reasoning-parser", "qwen3"]
    # The job's tool-call parser for the tiny model (model.tool_call_parser: auto), with `auto` choices read.
    command += ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    # The adapter, as `vllm serve` takes one (two slots: the CPU's spare, workload/contract/adapter_config.py).
    command += ["--enable-lora", "--lora-modules", f"{ADAPTER}={adapter}", "--max-lora-rank", "8", "--max-loras", "2"]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = {line["custom_id"]: line for line in _lines(reference_out)}
    ours = {a["custom_id"]: a for a in answers}
    assert set(reference) == {line["custom_id"] for line in served}
    for custom_id, theirs in reference.items():
        mine = ours[custom_id]
        assert mine["response"]["status_code"] == theirs["response"]["status_code"], custom_id
        assert set(mine) == set(theirs), custom_id
        body, reference_body = mine["response"]["body"], theirs["response"]["body"]
        assert body["model"] == reference_body["model"], custom_id  # the same adapter routing, line by line
        # vLLM adds fields of its own beyond OpenAI's object; every OpenAI field it writes, the job writes too.
        assert set(reference_body) - set(body) <= VLLM_EXTENSIONS, custom_id
        assert set(body) <= set(reference_body), custom_id
        assert len(body["choices"]) == len(reference_body["choices"]), custom_id
        # The same reasoning split: the same message keys, thinking and answer present or absent alike (the texts
        # themselves may differ: below).
        for mine_choice, their_choice in zip(body["choices"], reference_body["choices"], strict=True):
            message, reference_message = mine_choice["message"], their_choice["message"]
            assert "reasoning" in message and set(message) <= set(reference_message), custom_id
            # Sampled rows (no seed shared with vLLM's runner): where the first </think> falls differs, and on
            # 2026-12-07 (issue 56's run) run-batch's 12 vllm-sampling tokens decoded to no text at all (reasoning
            # and content null) where the job's were thinking.
            if custom_id not in ("think", "vllm-sampling"):
                for part in ("reasoning", "content"):
                    assert (message[part] is None) == (reference_message[part] is None), (custom_id, part)
        assert ("completion_tokens_details" in body["usage"]) == bool(
            reference_body["usage"].get("completion_tokens_details")
        )
    # The forced calls: the same function named by both (issue 56).
    for custom_id in ("tool-named", "tool-required"):
        names = [
            [call["function"]["name"] for call in line["response"]["body"]["choices"][0]["message"]["tool_calls"]]
            for line in (ours[custom_id], reference[custom_id])
        ]
        assert names[0] == names[1] == ["get_weather"], (custom_id, names)
    # Greedy text agreement is reported, not required: the CPU engine is not batch-invariant. (Both rows think
    # until max_tokens: their text is the thinking.)
    agree = [
        c
        for c in ("plain", "lp")
        if ours[c]["response"]["body"]["choices"][0]["message"]["reasoning"]
        == reference[c]["response"]["body"]["choices"][0]["message"]["reasoning"]
    ]
    print(f"greedy texts equal to vllm run_batch's: {agree} of ['plain', 'lp']")
    same = [reference[c]["response"]["body"]["choices"][0]["message"]["content"] for c in ("base-same", "lora-same")]
    assert same[0] != same[1], same  # vLLM's runner too answers the adapter's line differently from the base's
    theirs_cached = {
        c: ((reference[c]["response"]["body"].get("usage") or {}).get("prompt_tokens_details") or {}).get(
            "cached_tokens"
        )
        for c in ("prefix-first", "prefix-later")
    }
    ours_cached = {
        c: ours[c]["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for c in theirs_cached
    }
    print(f"cached prompt tokens, job {ours_cached}, vllm run_batch {theirs_cached}")


def _check_thinking(bodies: dict[str, ChatCompletion]) -> None:
    """What vLLM's qwen3 parser made of the real engine's answers (the job's part of test_chat_batch_...)."""

    def reasoning(custom_id: str) -> str | None:
        return (bodies[custom_id].choices[0].message.model_extra or {}).get("reasoning")

    def thinking_tokens(custom_id: str) -> int:
        details = bodies[custom_id].usage.completion_tokens_details  # type: ignore[union-attr]
        assert details is not None and details.reasoning_tokens is not None, custom_id
        return details.reasoning_tokens

    # Thinking on, no </think> written in 12 tokens: all of it is thinking, there is no answer.
    assert bodies["plain"].choices[0].message.content is None and reasoning("plain") is not None
    assert thinking_tokens("plain") == bodies["plain"].usage.completion_tokens  # type: ignore[union-attr]
    # Thinking off (the switch, or an effort of none): the whole text is the answer, none of it thinking.
    for custom_id in ("schema", "effort-none"):
        assert reasoning(custom_id) is None and bodies[custom_id].choices[0].message.content is not None, custom_id
        assert thinking_tokens(custom_id) == 0, custom_id
    # With thinking open the grammar waits for its end: the thinking is the model's own text, not the schema's.
    assert reasoning("schema-think") is not None and not (reasoning("schema-think") or "").startswith('{"')
    # The forced shape: thinking, then </think>, then an answer, split where the model wrote its first </think>.
    think = bodies["think"].choices[0]
    tokens = [position.token for position in think.logprobs.content or []]  # type: ignore[union-attr]
    assert len(tokens) == bodies["think"].usage.completion_tokens  # type: ignore[union-attr]
    # Seeded, so reproducible; a priori 1 in 250 samples of 32 such tokens holds no </think>.
    assert "</think>" in tokens, tokens
    end = tokens.index("</think>")
    assert thinking_tokens("think") == end  # the tokens before the end of the thinking
    if end > 0:
        assert reasoning("think") is not None
    for part in (reasoning("think"), think.message.content):
        assert "</think>" not in (part or "")  # the end, and any repeat of it, is no one's text
    print(f"forced shape: thinking {reasoning('think')!r}, {end} tokens; answer {think.message.content!r}")


def test_completions_batch_with_echo_and_logprobs(tmp_path: Path) -> None:
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions"}
    lines = [
        {**line, "body": {"model": "llm-batch", "prompt": "Once upon", "max_tokens": 6, "logprobs": 2, "echo": True}},
        {**line, "custom_id": "c2", "body": {"model": "llm-batch", "prompt": "Twice", "n": 2, "temperature": 1.0}},
        {**line, "custom_id": "c3", "body": {"model": "llm-batch", "prompt": ["a", "b"]}},
    ]
    out = _run(tmp_path, "completions", lines)
    answers, errors = _lines(out / "output.jsonl"), _lines(out / "errors.jsonl")
    parsed = {a["custom_id"]: Completion.model_validate(a["response"]["body"]) for a in answers}
    assert set(parsed) == {"c1", "c2"} and [e["custom_id"] for e in errors] == ["c3"]
    first = parsed["c1"].choices[0]
    assert first.text.startswith("Once upon") and first.logprobs is not None
    assert first.logprobs.text_offset is not None and first.logprobs.text_offset[0] == len("Once upon")
    assert all(len(top) == 2 for top in first.logprobs.top_logprobs or [])
    assert len(parsed["c2"].choices) == 2 and parsed["c2"].usage is not None
    # OpenAI's default max_tokens of 16, for each of the 2 choices (a random-weight model may end one early)
    assert 2 <= parsed["c2"].usage.completion_tokens <= 32


def _respond(custom_id: str, **body: Any) -> dict[str, Any]:
    body = {"model": "llm-batch", "input": f"Review {custom_id}: it works.", "max_output_tokens": 12, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": {"temperature": 0, **body}}


def _responses_lines() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Issue 56: `/v1/responses` lines (good, refused), run in the chat test's job: an input whose url came from its
    first line answers chat and responses lines alike (docs/job.md), so they share its engine start."""
    messages = [
        {"role": "user", "content": [{"type": "input_text", "text": "Review m: it works."}]},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Label it."},
    ]
    form = {"type": "json_schema", "name": "r", "schema": SCHEMA, "strict": True}
    good = [
        _respond("resp-string"),
        _respond("resp-messages", input=messages, instructions="You label reviews.", reasoning={"effort": "none"}),
        _respond("resp-schema", max_output_tokens=60, text={"format": form}, reasoning={"effort": "none"}),
        # A named function through chat's tool path (the tools rows above); Responses has no logit_bias, so the
        # grammar's free JSON whitespace may run to the limit (then `incomplete`): checked either way below.
        _respond(
            "resp-tool",
            max_output_tokens=60,
            tools=[{"type": "function", "name": "get_weather", "strict": True, "parameters": WEATHER_PARAMETERS}],
            tool_choice={"type": "function", "name": "get_weather"},
            reasoning={"effort": "none"},
        ),
    ]
    bad = [
        _respond("resp-previous", previous_response_id="resp_1"),
        _respond("resp-tools", tools=[{"type": "web_search"}]),
        {"custom_id": "resp-other-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
    ]
    return good, bad


def _check_responses(good: list[dict[str, Any]], answers: list[dict[str, Any]], errors: list[dict[str, Any]]) -> None:
    """Every responses body parsed by the official SDK's `Response` type (the chat path, vLLM's qwen3 parser)."""
    assert [a["custom_id"] for a in answers] == [line["custom_id"] for line in good]
    bodies = {a["custom_id"]: Response.model_validate(a["response"]["body"]) for a in answers}
    assert all(body.model == "llm-batch" and body.usage is not None for body in bodies.values())
    # Thinking on, the tiny model writes no </think> in 12 tokens: all thinking, cut by the limit.
    string = bodies["resp-string"]
    assert [item.type for item in string.output] == ["reasoning", "message"] and string.output_text == ""
    assert string.status == "incomplete" and string.incomplete_details is not None
    assert string.incomplete_details.reason == "max_output_tokens"
    assert string.usage.output_tokens_details.reasoning_tokens == string.usage.output_tokens  # type: ignore[union-attr]
    # An effort of none closes the thinking in the template: the whole text is the answer.
    for custom_id in ("resp-messages", "resp-schema"):
        body = bodies[custom_id]
        assert [item.type for item in body.output] == ["message"], custom_id
        assert body.usage.output_tokens_details.reasoning_tokens == 0, custom_id  # type: ignore[union-attr]
    assert bodies["resp-messages"].instructions == "You label reviews." and bodies["resp-messages"].output_text
    assert bodies["resp-schema"].status == "completed", bodies["resp-schema"]
    jsonschema.validate(json.loads(bodies["resp-schema"].output_text), SCHEMA)
    tool = bodies["resp-tool"]  # the forced call, or the grammar's whitespace cut by the limit
    calls = [item for item in tool.output if item.type == "function_call"]
    assert tool.tool_choice.name == "get_weather" and [t.name for t in tool.tools] == ["get_weather"]  # type: ignore[union-attr]
    if tool.status == "completed":
        assert len(calls) == 1 and calls[0].name == "get_weather", tool.output  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    print(f"responses' named tool: {tool.status}, {len(calls)} function_call item(s)")
    refused = {e["custom_id"]: e["response"]["body"]["error"] for e in errors}
    assert {key: error["param"] for key, error in refused.items()} == {
        "resp-previous": "previous_response_id",
        "resp-tools": "tools[0].type",
        "resp-other-url": "url",
    }
    assert all(e["response"]["status_code"] == 400 for e in errors)
