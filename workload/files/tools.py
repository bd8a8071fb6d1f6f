"""Tool calls on a chat row (issue 56): the request's `tools`, `tool_choice` and `parallel_tool_calls` checked, the
tool-call turns of its history, and the answer's `tool_calls` and finish reason in OpenAI's shape.

What a row asks is checked here, before any work, so a bad tool is the line's error naming the field; the answer
itself is read by vLLM's own tool parser in the engine stage (workload/engine/reasoning.py), which also forces a
`required` or named choice through structured outputs exactly as vLLM's OpenAI server does (the parser's
`adjust_request`). The rules follow vLLM 0.32's `ChatCompletionRequest` validators (vllm/entrypoints/openai/
chat_completion/protocol.py, `check_tool_usage`) and the server's full generator (serving.py,
`chat_completion_full_generator`) for the answer. The Responses reader reuses these functions for its tools.
"""

from __future__ import annotations

import json
import re
from typing import Any

# The pipeline's column a chat row's tool request rides on, as JSON ({"tools", "tool_choice",
# "parallel_tool_calls"}; null: no tools), from the validation stage through the chat-template stage (which renders
# the tools) to the engine stage (which forces and parses the calls).
TOOLS_COLUMN = "_tools"
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
CHOICES = ("none", "auto", "required")
# OpenAI's rule for a function's name (its API reference, `tools[].function.name`, read 2026-12-07).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


class ToolsRefused(ValueError):
    """A tool request the job cannot answer: `field` names the offending field (the line's error names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def asks_tools(body: dict[str, Any]) -> bool:
    return any(body.get(key) is not None for key in TOOL_KEYS)


def check_request(body: dict[str, Any], parser: str | None) -> dict[str, Any] | None:
    """The row's tool request ({"tools", "tool_choice", "parallel_tool_calls"}), None where it gives no tools;
    ToolsRefused names a bad field. `parser`: the model's vLLM tool-call parser (None: tools are refused)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ToolsRefused("tool_choice", "tool_choice needs tools: no tools were given")
        return None
    if parser is None:
        raise ToolsRefused(
            "tools",
            "tools are refused: the model has no tool-call parser (model.tool_call_parser is 'none', or 'auto' "
            "does not know the model's family), so tool calls would come back as plain text",
        )
    names = check_tools(tools)
    choice = check_choice("auto" if choice is None else choice, names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolsRefused("parallel_tool_calls", f"parallel_tool_calls must be true or false, got {parallel!r}")
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}


def check_tools(tools: Any) -> list[str]:
    """The function names of OpenAI chat `tools`; ToolsRefused names the first bad one."""
    if not isinstance(tools, list) or not tools:
        raise ToolsRefused("tools", "tools must be a non-empty array of {type: function, function} objects")
    names: list[str] = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) - {"type", "function"}:
            raise ToolsRefused(where, f'{where} must be {{"type": "function", "function": {{...}}}}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolsRefused(f"{where}.function", f"{where}.function must be an object")
        extra = sorted(set(function) - _FUNCTION_KEYS)
        if extra:
            raise ToolsRefused(f"{where}.function.{extra[0]}", f"{where}.function.{extra[0]} is not a function field")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolsRefused(
                f"{where}.function.name", f"{where}.function.name must be 1-64 letters, digits, _ or -, got {name!r}"
            )
        if name in names:
            raise ToolsRefused(f"{where}.function.name", f"{where}.function.name {name!r} is given twice")
        parameters = function.get("parameters")
        is_object = isinstance(parameters, dict) and parameters.get("type", "object") == "object"
        if parameters is not None and not is_object:
            raise ToolsRefused(
                f"{where}.function.parameters",
                f"{where}.function.parameters must be a JSON schema of an object (type: object)",
            )
        if function.get("description") is not None and not isinstance(function["description"], str):
            raise ToolsRefused(f"{where}.function.description", f"{where}.function.description must be a string")
        names.append(name)
    return names


def check_choice(choice: Any, names: list[str]) -> Any:
    """`none`, `auto`, `required` or {"type": "function", "function": {"name"}} naming one of `names`."""
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolsRefused("tool_choice", f"tool_choice must be one of {', '.join(CHOICES)} or a named function")
        return choice
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolsRefused(
            "tool_choice", 'tool_choice as an object must be {"type": "function", "function": {"name": ...}}'
        )
    if function["name"] not in names:
        raise ToolsRefused(
            "tool_choice.function.name", f"tool_choice names {function['name']!r}, which is not among the tools"
        )
    return {"type": "function", "function": {"name": function["name"]}}


def forces_call(choice: Any) -> bool:
    """Whether the choice forces a call (`required` or a named function): the answer is then constrained."""
    return choice == "required" or isinstance(choice, dict)


def history_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool` message or an assistant message with `tool_calls`, as the chat template gets it: the calls'
    arguments as objects (vLLM's renderer does the same: vllm/renderers/chat_utils.py, `_postprocess_messages`:
    tool-use templates expect dicts). ToolsRefused names the bad field."""
    role = message.get("role")
    out: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ToolsRefused(f"{where}.tool_call_id", f"{where}.tool_call_id must be a non-empty string")
        out["tool_call_id"] = call_id
        return out
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise ToolsRefused(f"{where}.tool_calls", f"{where}.tool_calls must be a non-empty array")
    out["tool_calls"] = [_history_call(call, f"{where}.tool_calls[{index}]") for index, call in enumerate(calls)]
    return out


def _history_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) and call.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolsRefused(where, f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ToolsRefused(f"{where}.function.arguments", f"{where}.function.arguments is not JSON") from None
    if not isinstance(arguments, dict):
        raise ToolsRefused(f"{where}.function.arguments", f"{where}.function.arguments must be a JSON object")
    out: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def answer_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's `message.tool_calls` for the calls vLLM's parser read ({"id", "name", "arguments"} each, the
    arguments a JSON string as the parser gives them)."""
    return [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
    ]


def finish_reason(choice: Any, calls: list[dict[str, Any]], engine_reason: str | None) -> str | None:
    """vLLM's server's finish reason for a chat answer with tools (serving.py, vLLM 0.32): `tool_calls` where an
    `auto` choice called a tool, or a `required` one stopped; a named call ends `stop`, as in OpenAI's API."""
    if (choice == "auto" and calls) or (choice == "required" and engine_reason == "stop"):
        return "tool_calls"
    return engine_reason
