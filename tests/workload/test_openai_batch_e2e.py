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

from tests.workload.jobrun import ENGINE, run_job, write_config

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


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path: Path, name: str, lines: list[Any]) -> Path:
    source = tmp_path / name / "in" / "batch.jsonl"
    source.parent.mkdir(parents=True)
    source.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    out = tmp_path / name / "out"
    config = write_config(
        tmp_path / name / "job.yaml",
        str(source.parent),
        str(out),
        tmp_path / "models",
        model={"cache_dir": str(tmp_path / "models"), "aliases": ["gpt-4o-mini"]},
        engine=ENGINE,
    )
    code, log = run_job(["run", "--config", str(config)], timeout=420)
    assert code == 0, log
    return out


def test_chat_batch_in_openai_files_out_matching_vllms_own_runner(tmp_path: Path) -> None:
    good = [
        _chat("plain"),
        _chat("alias", model="gpt-4o-mini"),
        _chat("two", n=2, temperature=0.9, seed=3),
        _chat("lp", logprobs=True, top_logprobs=2),
        _chat(
            "schema",
            max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}},
        ),
    ]
    bad = [
        _chat("wrong-model", model="gpt-5"),
        _chat("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        _chat("plain"),  # a repeated custom_id: the first line wins
        {"custom_id": "other-url", "method": "POST", "url": "/v1/completions", "body": {"model": "llm-batch"}},
        '{"custom_id": "torn", "body": {',
    ]
    out = _run(tmp_path, "chat", good + bad)
    answers, errors = _lines(out / "output.jsonl"), _lines(out / "errors.jsonl")
    assert [a["custom_id"] for a in answers] == ["plain", "alias", "two", "lp", "schema"]  # input order
    bodies = {a["custom_id"]: ChatCompletion.model_validate(a["response"]["body"]) for a in answers}
    assert all(a["response"]["status_code"] == 200 and a["error"] is None for a in answers)
    assert len(bodies["two"].choices) == 2 and bodies["two"].usage is not None
    assert bodies["two"].usage.completion_tokens >= 2  # every choice's tokens count
    content = bodies["lp"].choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(position.top_logprobs) == 2 for position in content)
    schema_choice = bodies["schema"].choices[0]
    assert schema_choice.finish_reason == "stop", schema_choice
    jsonschema.validate(json.loads(schema_choice.message.content or ""), SCHEMA)
    assert all(body.model == "llm-batch" for body in bodies.values())
    by_id = {(e["custom_id"], e["response"]["status_code"] if e["response"] else None) for e in errors}
    assert by_id == {("wrong-model", 400), ("tools", 400), ("plain", 400), ("other-url", 400), ("torn", None)}
    codes = {e["custom_id"]: (e["response"] or {}).get("body", {}).get("error", {}).get("code") for e in errors}
    assert codes["wrong-model"] == "model_not_found" and codes["plain"] == "duplicate_id"
    assert next(e for e in errors if e["custom_id"] == "torn")["error"]["message"].startswith("line 10:")

    # vLLM's own runner on the job's model, over the lines it can serve (it has no aliases: those stay ours).
    model = tmp_path / "models" / "tiny-llama-v1"
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
        # vLLM adds fields of its own beyond OpenAI's object; every OpenAI field it writes, the job writes too.
        assert set(reference_body) - set(body) <= VLLM_EXTENSIONS, custom_id
        assert set(body) <= set(reference_body), custom_id
        assert len(body["choices"]) == len(reference_body["choices"]), custom_id
    # Greedy text agreement is reported, not required: the CPU engine is not batch-invariant.
    agree = [
        c
        for c in ("plain", "lp")
        if ours[c]["response"]["body"]["choices"][0]["message"]["content"]
        == reference[c]["response"]["body"]["choices"][0]["message"]["content"]
    ]
    print(f"greedy texts equal to vllm run_batch's: {agree} of ['plain', 'lp']")


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
