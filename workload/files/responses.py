"""OpenAI's Responses API on a batch line (`/v1/responses`, issue 56): the request translated once into the chat
request the job already answers, and the answer written back as a `response` object.

In: `input` (a string, or a list of messages: roles user, system, developer, assistant; content a string or
`input_text` / `output_text` parts), `instructions` (a system message before them), `max_output_tokens`,
`temperature`, `top_p`, `text.format` (`text`, `json_object`, `json_schema`: chat's `response_format`, so the same
structured-output path), `reasoning.effort` (chat's `reasoning_effort`, so the same chat-template variables, issue
55). `metadata`, `store` and `user` ask nothing of the engine; `metadata` and `user` are echoed (the SDK's
`Response` has no `store`). `to_chat` returns the chat body; the line reader (workload/files/openai_batch.py)
reads it as it reads a chat line, and names chat's parameters back in this API's words (`CHAT_NAMES`), so a
refusal names the parameter the line gave.

Everything else is refused naming the parameter: state this job does not keep (`previous_response_id`,
`conversation`, `prompt`), modes a batch has no use for (`stream`, `background`), extras the output does not carry
(`include`, `top_logprobs`), and tools other than functions (OpenAI's hosted ones: web search, file search, ...).

Function tools are chat's (workload/files/tools.py): `tools` ({"type": "function", "name", "parameters", "strict",
"description"}) and a named `tool_choice` ({"type": "function", "name"}) become chat's nested shapes, so the same
checks, template and vLLM tool-call parser answer them; a history's `function_call` items become an assistant turn
with `tool_calls`, and `function_call_output` items `tool` turns.

Out: `response_body` gives the object the official SDK's `Response` type parses (openai 3.57): `status`
`completed`, or `incomplete` with `incomplete_details.reason: max_output_tokens` where the length ran out (as
vLLM 0.32's own Responses server says it, `ResponsesResponse.from_request`); `output` holds a `reasoning` item
where a reasoning parser split the thinking off (workload/engine/choices.py), then a `function_call` item per call
the tool parser read, then the `message` item with the answer as `output_text` (left out where calls came and the
text is empty, as vLLM's Responses server does); `usage` in this API's names; the request's own fields echoed as
OpenAI echoes them.
"""

from __future__ import annotations

from typing import Any

from workload.files.images import FILE_REF

RESPONSES_URL = "/v1/responses"

# The parameters answered here; each is translated below or echoed only.
ANSWERED = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "reasoning"}
    | {"metadata", "store", "user", "tools", "tool_choice", "parallel_tool_calls"}
)
_NO_STATE = "a batch line is answered on its own: the job keeps no earlier responses or conversations"
# OpenAI's parameters this job refuses, with the reason, and the values that ask for nothing (OpenAI's defaults).
REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "previous_response_id": (_NO_STATE, ()),
    "conversation": (_NO_STATE, ()),
    "context_management": (_NO_STATE, ()),
    "prompt": ("stored prompt templates live in OpenAI's account, not in this job", ()),
    "stream": ("a batch answer is written whole: there is nothing to stream", (False,)),
    "stream_options": ("a batch answer is written whole: there is nothing to stream", ()),
    "background": ("every batch line already runs in the background", (False,)),
    "include": ("the job's output carries none of the extra fields `include` asks for", ([],)),
    "top_logprobs": ("log probabilities are offered on /v1/chat/completions, not on /v1/responses", (0,)),
    "truncation": ("an input over the model's length is the line's error, never cut silently", ("disabled",)),
    "max_tool_calls": ("a line is one turn of the model: it calls what it writes in that turn, uncounted", ()),
    "service_tier": ("the job has one tier: the batch's own", ("auto", "default")),
    "prompt_cache_key": ("vLLM's prefix cache needs no key: every line's prefix is looked up", ()),
    "prompt_cache_retention": ("vLLM's prefix cache keeps blocks while memory allows, not for a set time", ()),
    "prompt_cache_options": ("vLLM's prefix cache keeps blocks while memory allows, not for a set time", ()),
    "safety_identifier": ("the job runs no moderation to tie an identifier to", ()),
    "moderation": ("the job runs no moderation", ()),
    "access_programs": ("OpenAI's account programs have no meaning here", ()),
    "image": ("the job makes no images; it reads them on /v1/chat/completions lines (image_url parts)", ()),
    "background_options": ("every batch line already runs in the background", ()),
}
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})
# chat's parameter (or the start of its path) -> this API's, for a refusal the chat reader raises.
CHAT_NAMES = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "messages": "input",
    "tools": "tools",
}


class Refused(ValueError):
    """A /v1/responses line this job cannot answer; `param` names the parameter (the reader's RequestRefused)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _asks_nothing(value: Any, accepts: tuple[Any, ...]) -> bool:
    # True == 1 in Python: a bool passes only for a bool.
    return value is None or any(value == ok and isinstance(value, bool) == isinstance(ok, bool) for ok in accepts)


def to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat body for a /v1/responses body, and the request's fields the answer echoes; Refused names what the
    job cannot answer."""
    for name in sorted(body):
        if name in REFUSED and not _asks_nothing(body[name], REFUSED[name][1]):
            raise Refused(f"parameter {name!r} is refused by this batch job: {REFUSED[name][0]}", name)
        if name not in ANSWERED and name not in REFUSED:
            raise Refused(f"parameter {name!r} is not supported by this batch job", name)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body), **_chat_tools(body)}
    for name in ("temperature", "top_p", "user", "metadata"):
        if body.get(name) is not None:
            chat[name] = body[name]
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise Refused(f"max_output_tokens must be a positive integer, got {limit!r}", "max_output_tokens")
        chat["max_completion_tokens"] = limit
    text = _text(body.get("text"))
    if text["format"]["type"] != "text":
        chat["response_format"] = _response_format(text["format"])
    reasoning = _reasoning(body.get("reasoning"))
    if reasoning is not None and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "text": text,
        "reasoning": reasoning,
        "metadata": body.get("metadata"),
        "user": body.get("user"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": True if body.get("parallel_tool_calls") is None else body["parallel_tool_calls"],
    }
    return chat, echo


def _chat_tools(body: dict[str, Any]) -> dict[str, Any]:
    """chat's `tools`, `tool_choice` and `parallel_tool_calls` for this API's; the chat reader checks the rest
    (names, schemas, a choice naming a function not given) as it checks a chat line's (workload/files/tools.py)."""
    chat: dict[str, Any] = {}
    given = body.get("tools")
    if given not in (None, []):
        if not isinstance(given, list):
            raise Refused("tools must be an array of function tools", "tools")
        chat["tools"] = [_chat_tool(tool, f"tools[{index}]") for index, tool in enumerate(given)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) - {"type", "name"}:
            raise Refused(f"tool_choice {choice!r} is not supported (auto, none, required, a function)", "tool_choice")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None and (chat or choice != "auto"):
        chat["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    return chat


def _chat_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        why = "only function tools are answered: OpenAI's hosted tools (web search, file search, ...) run there"
        raise Refused(f"{where}.type {kind!r} is refused by this batch job: {why}", f"{where}.type")
    extra = sorted(set(tool) - _FUNCTION_KEYS)
    if extra:
        raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
    return {
        "type": "function",
        "function": {key: tool[key] for key in sorted(_FUNCTION_KEYS - {"type"}) if key in tool},
    }


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise Refused("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        if not given:
            raise Refused("input is empty", "input")
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise Refused("input must be a string or a non-empty array of messages", "input")
    for index, item in enumerate(given):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "function_call":  # calls in a row are one assistant turn, as chat writes them
            call = _history_call(item, where)
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_history_output(item, where))
        else:
            messages.append(_message(item, where))
    return messages


def _history_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `function_call` item of the history as chat's tool call (the chat reader checks its arguments)."""
    extra = sorted(set(item) - {"type", "call_id", "name", "arguments", "id", "status"})
    if extra:
        raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str) or not item[name]:
            raise Refused(f"{where}.{name} must be a non-empty string", f"{where}.{name}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _history_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `function_call_output` item as chat's `tool` turn."""
    extra = sorted(set(item) - {"type", "call_id", "output", "id", "status"})
    if extra:
        raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise Refused(f"{where}.call_id must be a non-empty string", f"{where}.call_id")
    if not isinstance(item.get("output"), str):
        raise Refused(f"{where}.output must be a string (the function's result)", f"{where}.output")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}


def _message(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise Refused(f"{where} must be a message object", where)
    kind = item.get("type", "message")
    if kind != "message":
        # reasoning, item_reference, hosted tools' calls, ...: items of stored state or of tools run elsewhere.
        raise Refused(f"{where} is a {kind!r} item; only messages and function calls are supported", f"{where}.type")
    extra = sorted(set(item) - {"type", "role", "content"})
    if extra:
        raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
    role = item.get("role")
    if role not in _ROLES:
        raise Refused(f"{where}.role {role!r} is not supported (user, system, developer, assistant)", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list) or not content:
        raise Refused(f"{where}.content must be a string or a non-empty array of text parts", f"{where}.content")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        part_where = f"{where}.content[{index}]"
        if role == "user" and isinstance(part, dict) and part.get("type") == "input_image":
            parts.append(_image_part(part, part_where))
            continue
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            message = f"{part_where} is a {kind!r} part; only input_text, output_text and input_image are supported"
            raise Refused(message, part_where)
        parts.append({"type": "text", "text": part["text"]})
    if any(p["type"] == "image_url" for p in parts):
        return {"role": role, "content": parts}  # chat's image_url parts, read as chat reads them (files/images.py)
    return {"role": role, "content": "".join(p["text"] for p in parts)}


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An `input_image` part as chat's `image_url` part (issue 57): a url (`data:` or under input.image_prefix),
    or an uploaded `vision` file's `file_id` as a FILE_REF url, which only the batch's checked mapping resolves
    (input.image_files; docs/batch-api.md, "Images")."""
    file_id = part.get("file_id")
    if file_id is not None:
        if part.get("image_url") is not None:
            raise Refused(f"{where} gives both image_url and file_id; give one", f"{where}.file_id")
        if not isinstance(file_id, str) or not file_id:
            raise Refused(f"{where}.file_id must be a file id string", f"{where}.file_id")
        extra = sorted(set(part) - {"type", "file_id", "image_url", "detail"})
        if extra:
            raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
        return {"type": "image_url", "image_url": {"url": FILE_REF + file_id}}
    extra = sorted(set(part) - {"type", "image_url", "detail"})
    if extra:
        raise Refused(f"{where}.{extra[0]} is not supported by this batch job", f"{where}.{extra[0]}")
    if not isinstance(part.get("image_url"), str):
        raise Refused(f"{where}.image_url must be a string url", f"{where}.image_url")
    return {"type": "image_url", "image_url": {"url": part["image_url"]}}


def _text(value: Any) -> dict[str, Any]:
    """The line's `text` with its format spelled out (OpenAI echoes `{"format": {"type": "text"}}` by default)."""
    if value is None:
        return {"format": {"type": "text"}}
    if not isinstance(value, dict):
        raise Refused("text must be an object", "text")
    extra = sorted(set(value) - {"format", "verbosity"})
    if extra:
        raise Refused(f"text.{extra[0]} is not supported by this batch job", f"text.{extra[0]}")
    if value.get("verbosity") not in (None, "medium"):  # OpenAI's default; the job's models take no such switch
        raise Refused("text.verbosity is refused by this batch job: the model takes no verbosity switch", "text")
    form = value.get("format") or {"type": "text"}
    if not isinstance(form, dict) or form.get("type") not in ("text", "json_object", "json_schema"):
        kind = form.get("type") if isinstance(form, dict) else form
        raise Refused(f"text.format type {kind!r} is not supported (text, json_object, json_schema)", "text.format")
    return {**value, "format": form}


def _response_format(form: dict[str, Any]) -> dict[str, Any]:
    """chat's response_format for a text.format: Responses puts the schema's fields beside `type`."""
    if form["type"] == "json_object":
        return {"type": "json_object"}
    extra = sorted(set(form) - {"type", "name", "schema", "strict", "description"})
    if extra:
        raise Refused(f"text.format.{extra[0]} is not supported by this batch job", "text.format")
    if not isinstance(form.get("schema"), dict):
        raise Refused("text.format.schema must be an object (a JSON schema)", "text.format")
    schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
    return {"type": "json_schema", "json_schema": schema}


def _reasoning(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refused("reasoning must be an object", "reasoning")
    extra = sorted(set(value) - {"effort", "summary", "generate_summary"})
    if extra:
        raise Refused(f"reasoning.{extra[0]} is not supported by this batch job", f"reasoning.{extra[0]}")
    for name in ("summary", "generate_summary"):
        if value.get(name) is not None:
            why = "the thinking comes back whole, in the reasoning item's content, never summarised"
            raise Refused(f"reasoning.{name} is refused by this batch job: {why}", f"reasoning.{name}")
    return value


def chat_param(param: str | None) -> str | None:
    """This API's name for a parameter the chat reader named (`messages[2].content` -> `input`)."""
    if param is None:
        return None
    if param.startswith("tools[") or param.startswith("tool_choice"):  # chat nests a function's fields
        return param.replace(".function.", ".").replace(".function", "")
    for chat, ours in CHAT_NAMES.items():
        if param == chat or param.startswith(f"{chat}["):
            return ours
    return param


def response_body(
    key: str, sample: dict[str, Any], usage: dict[str, Any], echo: dict[str, Any], model: str, created: int
) -> dict[str, Any]:
    """The `response` object for one answered line. `key`: the row's stable digest (ids are derived from it, so a
    rebuild writes the same bytes); `sample`: its one choice; `usage`: chat's usage of the row."""
    incomplete = sample["finish_reason"] == "length"
    status = "incomplete" if incomplete else "completed"
    output: list[dict[str, Any]] = []
    if sample.get("reasoning") is not None:
        # vLLM's shape for split thinking (its Responses server): the text whole as reasoning_text, no summary.
        reasoning = [{"type": "reasoning_text", "text": sample["reasoning"]}]
        output.append({"id": f"rs_{key}", "type": "reasoning", "summary": [], "content": reasoning, "status": status})
    calls = sample.get("tool_calls") or []
    for index, call in enumerate(calls):  # the calls vLLM's tool parser read ({"id", "name", "arguments"})
        output.append(
            {
                "id": f"fc_{key}_{index}",
                "type": "function_call",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": call["arguments"],
                "status": "completed",
            }
        )
    text = sample.get("text")
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else []
    if content or not calls:
        output.append(
            {"id": f"msg_{key}", "type": "message", "role": "assistant", "status": status, "content": content}
        )
    details = usage.get("prompt_tokens_details") or {}
    thinking = usage.get("completion_tokens_details") or {}
    return {
        "id": f"resp_{key}",
        "object": "response",
        "created_at": created,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            # cache_write_tokens: OpenAI's count of tokens written to an explicit cache, which the SDK's type
            # requires; vLLM's prefix cache is implicit and bills no write, so none are written.
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0), "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": thinking.get("reasoning_tokens", 0)},
            "total_tokens": usage["total_tokens"],
        },
        **echo,
    }
