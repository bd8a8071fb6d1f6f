"""An OpenAI Batch input's output files, `output.jsonl` and `errors.jsonl`, built from the committed shards.

The commit protocol underneath is the job's own (workload/job/output.py); these two files are derived from it, in
input order, every line once, and can be rebuilt at any time from what is committed: a finished run writes them,
a resumed run rewrites them whole, `build_openai_files` makes them for a stopped one too.

Lines are OpenAI's batch output objects: `id`, `custom_id`, `response` (`status_code`, `request_id`, `body`) and
`error`. Bodies are OpenAI's: a `chat.completion` or a `text_completion` with every choice, vLLM's finish reason,
log probabilities in OpenAI's shape and usage over all choices; for /v1/embeddings a `list` of `embedding` objects,
one per input with its index, float or base64 as the line asked (workload/files/embeddings.py); for /v1/responses
a `response` object (workload/files/responses.py). Rows refused at
validation answer 400 with OpenAI's error body, as do requests vLLM refuses (`invalid_request`: `dimensions` on a
model without Matryoshka training); the engine's failures (`engine_crash`, `engine_hang`, `inference_error`) 500; a
line that could not be parsed at all has no response, only an `error` naming its line (and its `custom_id` where
it can be read). Ids are derived from the row, so a rebuild writes the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from typing import Any

import pyarrow.parquet as pq

from workload.files.embeddings import embedding_body
from workload.files.openai_batch import CHAT_URL, EMBEDDINGS_URL, OPENAI_COLUMN, split_param
from workload.files.responses import RESPONSES_URL
from workload.files.responses import response_body as responses_body
from workload.files.tools import answer_calls
from workload.job.output import OutputStore, ShardCommit

SERVER_ERRORS = frozenset({"engine_crash", "engine_hang", "inference_error", "prompt_too_long"})
UNPARSED = frozenset({"malformed_json", "invalid_utf8", "not_an_object", "record_too_large", "invalid_text"})
_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def _usage(row: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    prompt, completion = int(row["num_input_tokens"]), int(row["num_output_tokens"])
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    usage.update(_prompt_details(row))
    if samples and any("reasoning_tokens" in s for s in samples):
        # A reasoning parser read the answer (workload/engine/reasoning.py): its thinking tokens over every choice,
        # as vLLM's server counts them; absent where no parser ran, as there.
        usage["completion_tokens_details"] = {
            "reasoning_tokens": sum(int(s.get("reasoning_tokens", 0)) for s in samples)
        }
    return usage


def _prompt_details(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `prompt_tokens_details.cached_tokens`: vLLM's prefix-cache hits of the row's prompt (issue 55);
    left out where the results hold no count (a shard committed before the job counted them)."""
    cached = row.get("num_cached_tokens")
    return {} if cached is None else {"prompt_tokens_details": {"cached_tokens": int(cached)}}


def _samples(row: dict[str, Any]) -> list[dict[str, Any]]:
    if row.get("choices"):
        return list(json.loads(row["choices"]))
    return [{"index": 0, "text": row["generated_text"], "finish_reason": row["finish_reason"], "logprobs": None}]


def _completion_logprobs(positions: list[dict[str, Any]], start: int) -> dict[str, Any]:
    offsets, at = [], start
    for position in positions:
        offsets.append(at)
        at += len(position["token"])
    return {
        "tokens": [p["token"] for p in positions],
        "token_logprobs": [p["logprob"] for p in positions],
        "top_logprobs": [{t["token"]: t["logprob"] for t in p["top_logprobs"]} for p in positions],
        "text_offset": offsets,
    }


def response_body(row: dict[str, Any], facts: dict[str, Any], model: str, created: int) -> dict[str, Any]:
    """The OpenAI response object for one answered row."""
    if facts["url"] == EMBEDDINGS_URL:
        return embedding_body(row, facts, model)
    samples = _samples(row)
    if facts["url"] == RESPONSES_URL:  # one choice: Responses has no `n` (workload/files/responses.py)
        key = _digest(row["id"], "response")
        return responses_body(key, samples[0], _usage(row, samples), facts["responses"], model, created)
    if facts["url"] == CHAT_URL:
        choices = [
            {
                "index": s["index"],
                "message": _message(s),
                "logprobs": {"content": s["logprobs"], "refusal": None} if facts.get("logprobs") else None,
                "finish_reason": s["finish_reason"],
            }
            for s in samples
        ]
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        prompt = facts.get("prompt", "") if facts.get("echo") else ""
        choices = [
            {
                "index": s["index"],
                "text": prompt + s["text"],
                "logprobs": _completion_logprobs(s["logprobs"] or [], len(prompt)) if facts.get("logprobs") else None,
                "finish_reason": s["finish_reason"],
            }
            for s in samples
        ]
        kind, prefix = "text_completion", "cmpl"
    return {
        "id": f"{prefix}-{_digest(row['id'], kind)}",
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": _usage(row, samples if facts["url"] == CHAT_URL else None),
    }


def _message(sample: dict[str, Any]) -> dict[str, Any]:
    # The thinking apart from the answer under vLLM 0.32's name, `reasoning` (its ChatMessage; the older
    # `reasoning_content` it now only reads on input); null where no parser ran or none was written.
    message = {"role": "assistant", "content": sample["text"], "refusal": None, "reasoning": sample.get("reasoning")}
    if sample.get("tool_calls"):
        # The calls vLLM's tool parser read (workload/engine/reasoning.py); left out where none was made, as OpenAI
        # leaves it out.
        message["tool_calls"] = answer_calls(sample["tool_calls"])
    return message


def _answer_line(row: dict[str, Any], model: str, created: int) -> dict[str, Any]:
    facts = json.loads(row[OPENAI_COLUMN])
    return {
        "id": f"batch_req_{_digest(row['id'], 'line')}",
        "custom_id": row["id"],
        "response": {
            "status_code": 200,
            "request_id": _digest(row["id"], "request"),
            # A line run on a LoRA adapter reports the adapter's name, as vLLM's server does (engine/adapters.py).
            "body": response_body(row, facts, facts.get("adapter") or model, created),
        },
        "error": None,
    }


def _error_line(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["error_type"]
    custom_id = record.get("id")
    if custom_id is None and record.get("raw_input_encoding") == "utf-8":
        found = _CUSTOM_ID.search(record.get("raw_input") or "")
        custom_id = json.loads(f'"{found.group(1)}"') if found else None
    line = {"id": f"batch_req_{_digest(record['input_file'], record['input_row'], 'error')}", "custom_id": custom_id}
    where = f"line {record['input_line']}" if record.get("input_line") is not None else f"row {record['input_row']}"
    if kind in UNPARSED:
        return {**line, "response": None, "error": {"code": kind, "message": f"{where}: {record['error_message']}"}}
    status = 500 if kind in SERVER_ERRORS else 400
    message, param = split_param(record["error_message"])
    error = {
        "message": message,
        "type": "server_error" if status == 500 else "invalid_request_error",
        "param": param,
        "code": kind,
    }
    response = {"status_code": status, "request_id": _digest(line["id"], "request"), "body": {"error": error}}
    return {**line, "response": response, "error": None}


def build_openai_files(
    store: OutputStore, commits: dict[int, ShardCommit], model: str, created: int
) -> tuple[int, int]:
    """Write output.jsonl and errors.jsonl from `commits` (every committed shard), in input order; returns the
    number of lines of each."""
    answers: list[str] = []
    errors: list[str] = []
    for shard in sorted(commits):
        for relative in commits[shard].files:
            data = store.read_part(relative)
            if data is None:
                continue
            if relative.endswith(".parquet"):
                for row in pq.read_table(io.BytesIO(data)).to_pylist():
                    answers.append(json.dumps(_answer_line(row, model, created), ensure_ascii=False))
            else:
                for text in data.decode("utf-8").splitlines():
                    if text.strip():
                        errors.append(json.dumps(_error_line(json.loads(text)), ensure_ascii=False))
    store.write_file("output.jsonl", "".join(line + "\n" for line in answers).encode())
    store.write_file("errors.jsonl", "".join(line + "\n" for line in errors).encode())
    return len(answers), len(errors)
