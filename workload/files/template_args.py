"""A chat row's own chat-template variables: `chat_template_kwargs` (e.g. {"enable_thinking": false}) and OpenAI's
`reasoning_effort`, which reach the model's chat template as vLLM's OpenAI server passes them.

vLLM's rule (vllm/entrypoints/openai/chat_completion/protocol.py, `ChatCompletionRequest.build_chat_params`, vLLM
0.32): the request's `chat_template_kwargs` are the template's variables; a `reasoning_effort` is added as the
variable `reasoning_effort` and, unless the request set `enable_thinking` itself, as `enable_thinking` (false for
"none", else true), so a template that only knows the thinking switch still hears it.
tests/workload/test_reasoning_config.py holds this module to vLLM's own function.
"""

from __future__ import annotations

import json
from typing import Any

# The pipeline's column a chat row's variables ride on, as JSON (null: the template's defaults), from the validation
# stage (workload/job/input_stream.py) through the chat-template stage to the engine stage, whose reasoning parser
# must know whether thinking was on (workload/engine/reasoning.py).
TEMPLATE_KWARGS_COLUMN = "_chat_template_kwargs"
# vLLM 0.32's accepted values (the same protocol.py, `reasoning_effort`); "max" is DeepSeek V4's, not OpenAI's.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Arguments of the template call itself, which the job sets from the row (whether to open the answer's turn or to
# continue the last message, the text not the token ids): a row cannot set them. vLLM overrides the first two
# silently; a row here is told.
RESERVED = frozenset(
    {"add_generation_prompt", "continue_final_message", "tokenize", "messages", "conversation", "chat_template"}
    | {"tools", "documents", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}
)


def check_kwargs(value: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """A row's chat_template_kwargs as given, or ValueError naming what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object, got {type(value).__name__}")
    taken = sorted(RESERVED & set(value))
    if taken:
        raise ValueError(f"{where}.{taken[0]} is set by the job from the messages, not by a row")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:  # a Parquet row can hold what JSON cannot
        raise ValueError(f"{where} must hold JSON values: {error}") from None
    return value


def with_effort(kwargs: dict[str, Any] | None, effort: Any) -> dict[str, Any] | None:
    """The template's variables for a request's chat_template_kwargs and reasoning_effort (vLLM's rule above);
    None where neither is set. ValueError names a bad effort."""
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    merged = dict(kwargs or {})
    merged["reasoning_effort"] = effort
    merged.setdefault("enable_thinking", effort != "none")
    return merged
