"""OpenAI Batch input: one request per line, `{"custom_id", "method", "url", "body"}`, turned into the job's own row.

What maps one to one (docs/job.md, "Coming from OpenAI Batch"):
- `custom_id` is the row's id (required, unique: a repeat is a `duplicate_id` error row and the first line wins);
- chat (`/v1/chat/completions`): `messages` (string content or arrays of text parts; roles system, developer,
  user, assistant) become the row's messages; completions (`/v1/completions`): `prompt` (one string);
- sampling: `max_completion_tokens` / `max_tokens`, `temperature`, `top_p`, `n`, `stop`, `seed`, `presence_penalty`,
  `frequency_penalty`, `logit_bias`, `logprobs` + `top_logprobs` (chat) or `logprobs` (completions, an integer);
- `response_format` `json_object` and `json_schema` (chat and completions) through vLLM's structured outputs (the
  engine's grammars allow no free whitespace, so a small model still closes its JSON);
- vLLM's own fields that `vllm run-batch` takes (`top_k`, `min_tokens`, `structured_outputs`, ...): each is answered
  or refused naming it with the reason, as workload/files/vllm_fields.py classifies it;
- `model`: the job's model name or one of its aliases; `user`, `metadata` and `echo` are carried to the output;
- chat: `chat_template_kwargs` (e.g. {"enable_thinking": false}) and `reasoning_effort` reach the model's chat
  template as vLLM's server passes them (workload/files/template_args.py);
- chat: `tools`, `tool_choice` and `parallel_tool_calls` ride on the row under the same names (checked, with the
  model's tool-call parser, by workload/files/tools.py), and history turns with tool calls (an assistant's
  `tool_calls`, a `tool` message's `tool_call_id`) are kept for the template;
- embeddings (`/v1/embeddings`): `input` (one string, or an array of strings: one vector each), `encoding_format`
  (float or base64, applied when the output is written) and `dimensions` (passed to vLLM, which answers it only for
  a model trained for shorter vectors, Matryoshka; elsewhere the line's error names it). Token-id inputs are refused;
- responses (`/v1/responses`, issue 56): translated into a chat line by workload/files/responses.py and read as one.

- chat: `image_url` content parts in user messages (`data:` URLs, or keys under `input.image_prefix`), kept in
  place as the template's image parts, their urls on the row (workload/files/images.py, issue 57).

Everything else a request can name (`stream`, `store`, `prediction`, `audio`, file parts,
...) is refused as the line's error, naming the parameter: the engine would not honour it, and ignoring it would
hand back an answer to another question.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from workload.files import images, responses, tools, vllm_fields
from workload.files.responses import RESPONSES_URL
from workload.files.template_args import check_kwargs, with_effort

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL)
# The row's key an embeddings line's texts and dimensions ride on (workload/files/rows.py reads it).
EMBED_KEY = "_embed"
REQUEST_KEYS = frozenset({"custom_id", "method", "url", "body"})
# The row's key the translated request's own facts ride on to the output (a pass-through column).
OPENAI_COLUMN = "openai_request"
# The LoRA adapter a line's `model` names (workload/engine/adapters.py), or null for the base model and its aliases.
ADAPTER_COLUMN = "_adapter"

_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_COMMON = frozenset(
    {"model", "max_tokens", "stop", "logit_bias", "logprobs", "user", "metadata", "response_format", *_SAMPLING}
)
# OpenAI's parameters, and every vLLM field vllm_fields.py classifies (issue 55): a refused one was refused by name
# before this set is read (`_refuse_vllm_fields`), so one still here is answered or at a value that asks nothing.
# A chat line's own chat-template variables, passed as vLLM's server passes them.
TEMPLATE_KEYS = ("chat_template_kwargs", "reasoning_effort")
_CHAT_KEYS = (
    _COMMON
    | {"messages", "max_completion_tokens", "top_logprobs", *TEMPLATE_KEYS}
    | vllm_fields.known(vllm_fields.CHAT)
)
_COMPLETION_KEYS = _COMMON | {"prompt", "echo"} | vllm_fields.known(vllm_fields.COMPLETIONS)
_EMBEDDING_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user"}) | vllm_fields.known(
    vllm_fields.EMBEDDINGS
)
_ENDPOINT = {
    CHAT_URL: vllm_fields.CHAT,
    COMPLETIONS_URL: vllm_fields.COMPLETIONS,
    EMBEDDINGS_URL: vllm_fields.EMBEDDINGS,
}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# A message's keys besides role, content and name, by role: the tool-call turns of a history (workload/files/tools.py).
_TOOL_TURN_KEYS = {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}
# The row's key a chat line's chat-template variables ride on (workload/files/template_args.py), as in native rows.
TEMPLATE_KWARGS_KEY = "chat_template_kwargs"


# The urls whose lines become one kind of row, messages through the chat template: an input may mix them where no
# url was named for it (`OpenAIDialect.mixed_chat`).
CHAT_ROW_URLS = frozenset({CHAT_URL, RESPONSES_URL})


@dataclass(frozen=True)
class OpenAIDialect:
    """How this input's lines are read: the one url of the batch and the names the model answers to.

    `mixed_chat`: the input's url came from its first line, not from `input.openai_url` (which the Batch API always
    sets, as OpenAI holds a batch to one url). Such an input's /v1/chat/completions and /v1/responses lines are
    then both answered, each in its own shape, as vLLM's run-batch answers each line for its own url: both are chat
    rows to the engine, so a file carrying both, say while its code moves to Responses, needs no second job."""

    url: str
    model_names: frozenset[str]
    mixed_chat: bool = False
    # LoRA adapters served beside the model (`model.adapters`): a line naming one runs on it (issue 57).
    adapters: frozenset[str] = frozenset()

    def takes(self, url: str) -> bool:
        """Whether a line of `url` is one of this input's requests."""
        return url == self.url or (self.mixed_chat and self.url in CHAT_ROW_URLS and url in CHAT_ROW_URLS)


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
    if not isinstance(url, str) or not dialect.takes(url):
        raise RequestRefused(f"url {url!r} is not this batch's url {dialect.url!r} (one url per batch)", "url")
    body = line["body"]
    if not isinstance(body, dict):
        raise RequestRefused("body must be an object", "body")
    if url == RESPONSES_URL:
        return _responses_row(custom_id, body, dialect)
    return _body_row(custom_id, url, body, dialect)


def _responses_row(custom_id: str, body: dict[str, Any], dialect: OpenAIDialect) -> dict[str, Any]:
    """A /v1/responses line read as the chat line it translates to (workload/files/responses.py), so the engine
    path is chat's; a refusal names the parameter in this API's words, and the answer's echoed fields ride along."""
    try:
        chat, echo = responses.to_chat(body)
    except responses.Refused as refused:
        raise RequestRefused(refused.message, refused.param) from None
    try:
        row = _body_row(custom_id, CHAT_URL, chat, dialect)
    except RequestRefused as refused:
        message = refused.message
        for theirs, ours in responses.CHAT_NAMES.items():
            message = message.replace(theirs, ours)
        raise RequestRefused(message, responses.chat_param(refused.param), refused.error_type) from None
    facts = json.loads(row[OPENAI_COLUMN])
    facts.update(url=RESPONSES_URL, responses=echo)
    row[OPENAI_COLUMN] = json.dumps(facts, sort_keys=True)
    return row


def _body_row(custom_id: str, url: str, body: dict[str, Any], dialect: OpenAIDialect) -> dict[str, Any]:
    _refuse_vllm_fields(body, url)
    allowed = {CHAT_URL: _CHAT_KEYS, COMPLETIONS_URL: _COMPLETION_KEYS, EMBEDDINGS_URL: _EMBEDDING_KEYS}[url]
    refused = sorted(set(body) - allowed)
    if refused:
        raise RequestRefused(f"parameter {refused[0]!r} is not supported by this batch job", refused[0])
    model = body.get("model")
    if not isinstance(model, str) or model not in dialect.model_names | dialect.adapters:
        names = ", ".join(sorted(dialect.model_names | dialect.adapters))
        raise RequestRefused(f"model {model!r} is not served here (served: {names})", "model", "model_not_found")
    if url == EMBEDDINGS_URL:
        if model in dialect.adapters:
            raise RequestRefused(f"model {model!r} is a LoRA adapter: adapters answer generation only", "model")
        return _embedding_row(custom_id, body, model)
    sampling = _sampling(body, url)
    facts: dict[str, Any] = {"url": url, "model": model}
    if model in dialect.adapters:
        facts["adapter"] = model  # the engine's LoRA request (adapter_of) and the answer's `model`
    for key in ("user", "metadata"):
        if body.get(key) is not None:
            facts[key] = body[key]
    row: dict[str, Any] = {"id": custom_id, "sampling_params": sampling}
    if url == CHAT_URL:
        row["messages"] = _messages(body.get("messages"))
        urls = [u for m in row["messages"] for u in m.pop(images.URLS_FIELD, [])]
        if urls:
            row[images.IMAGE_URLS_KEY] = urls
        template = _template_kwargs(body)
        if template is not None:
            row[TEMPLATE_KWARGS_KEY] = template
        if body.get("logprobs"):
            facts["logprobs"] = True
        # Checked with the model's parser by the row's own validation (workload/files/rows.py), as native rows are.
        row.update({key: body[key] for key in tools.TOOL_KEYS if body.get(key) is not None})
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


def _refuse_vllm_fields(body: dict[str, Any], url: str) -> None:
    """A vLLM field this endpoint refuses (workload/files/vllm_fields.py), named with the reason."""
    found = vllm_fields.refusal(_ENDPOINT[url], body)
    if found is not None:
        raise RequestRefused(f"parameter {found[0]!r} is refused by this batch job: {found[1]}", found[0])


def _vllm_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The vLLM sampling fields a line sets (vllm_fields.sampling), a bad one refused by name."""
    try:
        found = vllm_fields.sampling(body)
    except vllm_fields.FieldRefused as refused:
        raise RequestRefused(str(refused), refused.field) from None
    if "structured_outputs" in found and body.get("response_format") not in (None, {"type": "text"}):
        raise RequestRefused("give response_format or structured_outputs, not both", "structured_outputs")
    return found


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    kwargs = body.get("chat_template_kwargs")
    try:
        checked = None if kwargs is None else check_kwargs(kwargs)
    except ValueError as error:
        raise RequestRefused(str(error), "chat_template_kwargs") from None
    try:
        return with_effort(checked, body.get("reasoning_effort"))
    except ValueError as error:
        raise RequestRefused(str(error), "reasoning_effort") from None


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


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestRefused("messages must be a non-empty array", "messages")
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestRefused(f"{where} must be an object", where)
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise RequestRefused(f"{where}.role {message.get('role')!r} is not supported", f"{where}.role")
        extra = sorted(set(message) - {"role", "content", "name"} - _TOOL_TURN_KEYS.get(role, set()))
        if extra:
            raise RequestRefused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
        if role == "tool" or message.get("tool_calls") is not None:
            content = message.get("content")
            text = "" if content is None else _text(content, f"{where}.content")
            try:
                out.append(tools.history_message({**message, "role": role, "content": text}, where))
            except tools.ToolsRefused as refused:
                raise RequestRefused(str(refused), refused.field) from None
            continue
        content = message.get("content")
        if role == "user" and isinstance(content, list):
            try:
                parts, urls = images.content_parts(content, f"{where}.content")
            except images.ImageRefused as refused:
                raise RequestRefused(refused.message, refused.field, refused.error_type) from None
            out.append({"role": role, "content": parts, images.URLS_FIELD: urls})
            continue
        out.append({"role": role, "content": _text(content, f"{where}.content")})
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
    elif body.get("logprobs") is not None:
        sampling["logprobs"] = body["logprobs"]
    structured = _response_format(body.get("response_format"))
    if structured is not None:
        sampling["structured_outputs"] = structured
    sampling.update(_vllm_sampling(body))
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


def adapter_of(passthrough: dict[str, Any]) -> str | None:
    """The LoRA adapter a validated row's request line named (its ADAPTER_COLUMN), or None."""
    facts = passthrough.get(OPENAI_COLUMN)
    return json.loads(facts).get("adapter") if facts else None
