"""OpenAI Batch input: one request per line, `{"custom_id", "method", "url", "body"}`, turned into the job's own row.

What maps one to one (docs/job.md, "Coming from OpenAI Batch"):
- `custom_id` is the row's id (required, unique: a repeat is a `duplicate_id` error row and the first line wins);
- chat (`/v1/chat/completions`): `messages` (string content or arrays of text parts; roles system, developer,
  user, assistant) become the row's messages; completions (`/v1/completions`): `prompt` (one string);
- sampling: `max_completion_tokens` / `max_tokens`, `temperature`, `top_p`, `n`, `stop`, `seed`, `presence_penalty`,
  `frequency_penalty`, `logit_bias`, `logprobs` + `top_logprobs` (chat) or `logprobs` (completions, an integer);
- `response_format` `json_object` and `json_schema` through vLLM's structured outputs (the engine's grammars allow
  no free whitespace, so a small model still closes its JSON);
- `model`: the job's model name or one of its aliases; `user`, `metadata` and `echo` are carried to the output;
- embeddings (`/v1/embeddings`): `input` (one string, or an array of strings: one vector each), `encoding_format`
  (float or base64, applied when the output is written) and `dimensions` (passed to vLLM, which answers it only for
  a model trained for shorter vectors, Matryoshka; elsewhere the line's error names it). Token-id inputs are refused.

Everything else a request can name (`tools`, `tool_choice`, `stream`, `store`, `prediction`, `audio`, image parts,
...) is refused as the line's error, naming the parameter: the engine would not honour it, and ignoring it would
hand back an answer to another question.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
# The row's key an embeddings line's texts and dimensions ride on (workload/files/rows.py reads it).
EMBED_KEY = "_embed"
REQUEST_KEYS = frozenset({"custom_id", "method", "url", "body"})
# The row's key the translated request's own facts ride on to the output (a pass-through column).
OPENAI_COLUMN = "openai_request"

_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_COMMON = frozenset({"model", "max_tokens", "stop", "logit_bias", "logprobs", "user", "metadata", *_SAMPLING})
_CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format"}
_COMPLETION_KEYS = _COMMON | {"prompt", "echo"}
_EMBEDDING_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class OpenAIDialect:
    """How this input's lines are read: the one url of the batch and the names the model answers to."""

    url: str
    model_names: frozenset[str]


class RequestRefused(ValueError):
    """A line that is not a request this job can answer: `param` names the offending field (OpenAI's error body)."""

    def __init__(self, message: str, param: str | None = None, error_type: str = "invalid_request") -> None:
        super().__init__(message)
        self.message, self.param, self.error_type = message, param, error_type


# A refused line reaches errors.jsonl as the job's error row, whose one message field travels through the
# pipeline's error column; the parameter rides at its end in this form and is taken back out for OpenAI's `param`.
_PARAM_SUFFIX = re.compile(r" \(param: ([^()]+)\)$")


def message_with_param(refused: RequestRefused) -> str:
    return refused.message if refused.param is None else f"{refused.message} (param: {refused.param})"


def split_param(message: str) -> tuple[str, str | None]:
    """The message and the parameter `message_with_param` put at its end (None where it named none)."""
    found = _PARAM_SUFFIX.search(message)
    return (message[: found.start()], found.group(1)) if found else (message, None)


def is_request(value: Any) -> bool:
    """Whether a parsed line has the shape of an OpenAI Batch request."""
    return isinstance(value, dict) and "custom_id" in value and "body" in value


def to_row(line: dict[str, Any], dialect: OpenAIDialect) -> dict[str, Any]:
    """The job's native row for one request line; raises RequestRefused naming what is wrong."""
    unknown = sorted(set(line) - REQUEST_KEYS)
    if unknown:
        raise RequestRefused(f"unknown request field {unknown[0]!r}", unknown[0])
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestRefused("custom_id must be a non-empty string", "custom_id", "missing_id")
    if line.get("method", "POST") != "POST":
        raise RequestRefused(f"method must be POST, got {line.get('method')!r}", "method")
    url = line.get("url")
    if url != dialect.url:
        raise RequestRefused(f"url {url!r} is not this batch's url {dialect.url!r} (one url per batch)", "url")
    body = line["body"]
    if not isinstance(body, dict):
        raise RequestRefused("body must be an object", "body")
    allowed = {CHAT_URL: _CHAT_KEYS, COMPLETIONS_URL: _COMPLETION_KEYS, EMBEDDINGS_URL: _EMBEDDING_KEYS}[url]
    refused = sorted(set(body) - allowed)
    if refused:
        raise RequestRefused(f"parameter {refused[0]!r} is not supported by this batch job", refused[0])
    model = body.get("model")
    if not isinstance(model, str) or model not in dialect.model_names:
        names = ", ".join(sorted(dialect.model_names))
        raise RequestRefused(f"model {model!r} is not served here (served: {names})", "model", "model_not_found")
    if url == EMBEDDINGS_URL:
        return _embedding_row(custom_id, body, model)
    sampling = _sampling(body, url)
    facts: dict[str, Any] = {"url": url, "model": model}
    for key in ("user", "metadata"):
        if body.get(key) is not None:
            facts[key] = body[key]
    row: dict[str, Any] = {"id": custom_id, "sampling_params": sampling}
    if url == CHAT_URL:
        row["messages"] = _messages(body.get("messages"))
        if body.get("logprobs"):
            facts["logprobs"] = True
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestRefused("prompt must be one string (a list of prompts is several requests)", "prompt")
        row["prompt"] = prompt
        if body.get("echo"):
            facts.update(echo=True, prompt=prompt)
        if body.get("logprobs") is not None:
            facts["logprobs"] = True
    row[OPENAI_COLUMN] = json.dumps(facts, sort_keys=True)
    return row


def _embedding_row(custom_id: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise RequestRefused("input must be a string or a non-empty array of strings", "input")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            # OpenAI also takes token ids; the job embeds text only (its tokenizer is the engine's).
            raise RequestRefused(f"input[{index}] is not a string; token-id inputs are not supported", "input")
        if not text:
            raise RequestRefused(f"input[{index}] is empty", "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestRefused(f"encoding_format must be 'float' or 'base64', got {encoding!r}", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise RequestRefused(f"dimensions must be a positive integer, got {dimensions!r}", "dimensions")
    facts: dict[str, Any] = {"url": EMBEDDINGS_URL, "model": model, "encoding_format": encoding}
    if body.get("user") is not None:
        facts["user"] = body["user"]
    return {
        "id": custom_id,
        EMBED_KEY: {"texts": texts, "dimensions": dimensions},
        OPENAI_COLUMN: json.dumps(facts, sort_keys=True),
    }


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise RequestRefused("messages must be a non-empty array", "messages")
    out = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestRefused(f"{where} must be an object", where)
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise RequestRefused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise RequestRefused(f"{where}.role {message.get('role')!r} is not supported", f"{where}.role")
        out.append({"role": role, "content": _text(message.get("content"), f"{where}.content")})
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestRefused(f"{where} must be a string or an array of text parts", where)
    parts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RequestRefused(f"{where}[{index}] is a {kind!r} part; only text parts are supported", where)
        parts.append(part["text"])
    return "".join(parts)


def _sampling(body: dict[str, Any], url: str) -> dict[str, Any]:
    sampling = {ours: body[theirs] for theirs, ours in _SAMPLING.items() if body.get(theirs) is not None}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        sampling["max_tokens"] = limit
    elif url == COMPLETIONS_URL:
        sampling["max_tokens"] = 16  # OpenAI's default for /v1/completions
    stop = body.get("stop")
    if stop is not None:
        sampling["stop"] = [stop] if isinstance(stop, str) else stop
    if body.get("logit_bias") is not None:
        sampling["logit_bias"] = body["logit_bias"]
    if url == CHAT_URL:
        if body.get("logprobs"):
            sampling["logprobs"] = int(body.get("top_logprobs") or 0)
        elif body.get("top_logprobs") is not None:
            raise RequestRefused("top_logprobs needs logprobs: true", "top_logprobs")
        structured = _response_format(body.get("response_format"))
        if structured is not None:
            sampling["structured_outputs"] = structured
    elif body.get("logprobs") is not None:
        sampling["logprobs"] = body["logprobs"]
    return sampling


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    # The engine runs its grammars without free whitespace (pipeline.engine_kwargs): a small model cannot pad an
    # object past max_tokens before it closes it.
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = (value.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise RequestRefused("response_format.json_schema.schema must be an object", "response_format")
        return {"json": schema}
    raise RequestRefused(f"response_format type {kind!r} is not supported", "response_format")
