"""vLLM's own request fields on an OpenAI Batch line: which the job answers, which it refuses, and why (issue 55).

`vllm run-batch` (vLLM 0.32, the version the image pins) validates a line's body with vLLM's server models:
`ChatCompletionRequest` (chat), `EmbeddingRequest` (embeddings) and, on vLLM's server, `CompletionRequest`
(completions). A file written for it names fields OpenAI's API does not have (`top_k`, `min_tokens`,
`structured_outputs`, ...). Every one of those fields is classified here, per endpoint: answered (the line reader,
workload/files/openai_batch.py, passes it to the engine as vLLM's server would) or refused with the reason, which
becomes the line's error naming the field. tests/workload/test_vllm_fields.py reads the installed vLLM's models and
fails when a field is not classified here, so a vLLM upgrade that adds one cannot slip through unread. docs/job.md
holds the same table for readers (`python -m workload.files.vllm_fields` prints it).

A refused field that a line gives as null, or at a value that asks for nothing (`accepts`: vLLM's default, where it
is what the job does anyway), is not refused: a file that spells out defaults is not asking for anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)

# vLLM's own sampling fields the job's row format carries (workload/contract/config.py SamplingParams): a line's
# value reaches vLLM's SamplingParams under the same name.
VLLM_SAMPLING = (
    "top_k",
    "min_p",
    "min_tokens",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)


@dataclass(frozen=True)
class Verdict:
    answered: bool
    why: str
    accepts: tuple[Any, ...] = ()  # refused fields: values besides null that ask for nothing and pass


def _answered(why: str) -> Verdict:
    return Verdict(True, why)


def _refused(why: str, *accepts: Any) -> Verdict:
    return Verdict(False, why, accepts)


_OPENAI = _answered('OpenAI\'s own parameter (docs/job.md, "Coming from OpenAI Batch")')
_SAMPLING = _answered("vLLM's SamplingParams field of the same name")
_STREAM_WHY = "a batch answer is written whole: there is nothing to stream"
_STREAM = _refused(_STREAM_WHY)
_TEXT_ONLY_WHY = (
    "per-line media settings are not taken: images come as image_url parts (docs/job.md, Images); audio and video "
    "are refused"
)
_TEXT_ONLY = _refused(_TEXT_ONLY_WHY)
_TOKEN_EXTRAS_WHY = "a token-level extra of vLLM's server response that the job's output does not carry"
_TOKEN_EXTRAS = _refused(_TOKEN_EXTRAS_WHY)
_BEAM_WHY = "beam search is not run by the job's engine stage (vLLM runs it outside the sampler)"

# Fields the two generation endpoints share, with the same verdict on both.
_GENERATION: dict[str, Verdict] = {
    "model": _OPENAI,
    "max_tokens": _OPENAI,
    "temperature": _OPENAI,
    "top_p": _OPENAI,
    "n": _OPENAI,
    "seed": _OPENAI,
    "presence_penalty": _OPENAI,
    "frequency_penalty": _OPENAI,
    "stop": _OPENAI,
    "logit_bias": _OPENAI,
    "logprobs": _OPENAI,
    "response_format": _answered("json_object and json_schema, through vLLM's structured outputs"),
    "user": _answered("carried to the output's request facts"),
    "structured_outputs": _answered("vLLM's structured outputs, as given (json, regex, choice, grammar, ...)"),
    **{name: _SAMPLING for name in VLLM_SAMPLING},
    "stream": _refused(_STREAM_WHY, False),
    "stream_options": _STREAM,
    "stream_interval": _STREAM,
    "use_beam_search": _refused(_BEAM_WHY, False),
    "length_penalty": _refused(_BEAM_WHY, 1.0),
    "watermarking": _refused("vLLM's watermarking needs its logits processor on the engine; the job loads none"),
    "truncate_prompt_tokens": _refused("a prompt over the model's length is the line's error, never cut silently"),
    "truncation_side": _refused("a prompt over the model's length is the line's error, never cut silently"),
    "prompt_logprobs": _refused("the job's output carries no prompt log probabilities"),
    "logprob_token_ids": _TOKEN_EXTRAS,
    "return_tokens_as_token_ids": _TOKEN_EXTRAS,
    "return_token_ids": _TOKEN_EXTRAS,
    "return_token_offsets": _refused(_TOKEN_EXTRAS_WHY, False),
    "routed_experts_prompt_start": _refused(_TOKEN_EXTRAS_WHY, 0),
    "allowed_token_ids": _refused("not carried by the job's row format; logit_bias or structured_outputs instead"),
    "bad_words": _refused("not carried by the job's row format; logit_bias or structured_outputs instead", []),
    "mm_payload": _refused(_TEXT_ONLY_WHY, "tensors"),
    "return_mm_kwargs": _TEXT_ONLY,
    "priority": _refused("the job feeds rows in input order to vLLM's first-come scheduler", 0),
    "request_id": _refused("the line's custom_id names it; the engine's request ids are the job's"),
    "session_id": _refused("a batch has no sessions: each line is answered on its own"),
    "cache_salt": _refused("one job is one tenant: its rows share the prefix cache on purpose"),
    "kv_transfer_params": _refused("disaggregated prefill: one engine answers each row whole"),
    "ec_transfer_params": _refused("disaggregated encoding: one engine answers each row whole"),
    "repetition_detection": _refused("vLLM's repetition detection is not configured on the job's engine"),
    "vllm_xargs": _refused("extra arguments for custom logits processors; the job's engine loads none"),
    "thinking_token_budget": _refused("the job's engine enforces no thinking budget: bound it with max_tokens"),
}

_CHAT: dict[str, Verdict] = {
    **_GENERATION,
    "messages": _answered("text content (strings or text parts); roles system, developer, user, assistant, tool"),
    "max_completion_tokens": _OPENAI,
    "top_logprobs": _OPENAI,
    # Checked and passed to the chat template by workload/files/template_args.py.
    "chat_template_kwargs": _answered("passed to the model's chat template (e.g. enable_thinking)"),
    "reasoning_effort": _answered("passed to the model's chat template, as vLLM's server does"),
    "include_reasoning": _refused("the thinking always comes back apart, in `reasoning` (docs/job.md)", True),
    # Checked by workload/files/tools.py; a model without a tool-call parser refuses them there, naming why.
    "tools": _answered("read by the model's vLLM tool-call parser into `message.tool_calls` (docs/job.md)"),
    "tool_choice": _answered("auto, none, required or a named function; forced ones through structured outputs"),
    "parallel_tool_calls": _answered("false: at most one call, as vLLM's server constrains it"),
    "documents": _refused("the job renders messages only, with no documents for the template"),
    "chat_template": _refused("every line is rendered with the model's own chat template (one per job)"),
    "add_generation_prompt": _refused("the job decides from the last message: a generation prompt after a user's"),
    "continue_final_message": _refused("the job decides from the last message: an assistant's is continued"),
    "add_special_tokens": _refused("the job tokenizes the rendered chat itself (the tokenizer's BOS, once)"),
    "echo": _refused("chat echo is not offered (completions' echo is)", False),
    "media_io_kwargs": _TEXT_ONLY,
    "mm_processor_kwargs": _TEXT_ONLY,
    "return_prompt_text": _TOKEN_EXTRAS,
}

_COMPLETIONS: dict[str, Verdict] = {
    **_GENERATION,
    "prompt": _answered("one string (a list of prompts is several requests)"),
    "echo": _answered("the prompt is written before the answer, with its log-probability offsets"),
    "suffix": _refused("fill-in-the-middle is not offered"),
    "prompt_embeds": _refused("text prompts only: the job tokenizes every prompt itself"),
    "add_special_tokens": _refused("the job's tokenizer adds the model's special tokens, always", True),
}

_CHAT_EMBEDDING = _refused("chat-formatted embedding requests are not offered: the job embeds text inputs")
_EMBEDDINGS: dict[str, Verdict] = {
    "model": _OPENAI,
    "input": _answered("one string or an array of strings (token-id inputs are refused)"),
    "encoding_format": _answered("float or base64, applied when the output is written"),
    "dimensions": _answered("passed to vLLM (Matryoshka models; elsewhere the line's error names it)"),
    "user": _answered("carried to the output's request facts"),
    "embed_dtype": _refused("vectors are written as float32", "float32"),
    "endianness": _refused("base64 vectors are little-endian float32", "native", "little"),
    "add_special_tokens": _refused("the job's tokenizer adds the model's special tokens, always", True),
    "padding": _refused("inputs are embedded as given, unpadded"),
    "use_activation": _refused("vectors come as the model's pooler makes them"),
    "truncate_prompt_tokens": _refused("an input over the model's length is the line's error, never cut silently"),
    "truncation_side": _refused("an input over the model's length is the line's error, never cut silently"),
    "request_id": _refused("the line's custom_id names it; the engine's request ids are the job's"),
    "priority": _refused("the job feeds rows in input order to vLLM's first-come scheduler", 0),
    "cache_salt": _refused("one job is one tenant: its rows share the prefix cache on purpose"),
    "mm_processor_kwargs": _TEXT_ONLY,
    "messages": _CHAT_EMBEDDING,
    "chat_template": _CHAT_EMBEDDING,
    "chat_template_kwargs": _CHAT_EMBEDDING,
    "add_generation_prompt": _CHAT_EMBEDDING,
    "continue_final_message": _CHAT_EMBEDDING,
    "media_io_kwargs": _CHAT_EMBEDDING,
}

FIELDS: dict[str, dict[str, Verdict]] = {CHAT: _CHAT, COMPLETIONS: _COMPLETIONS, EMBEDDINGS: _EMBEDDINGS}


def known(endpoint: str) -> frozenset[str]:
    return frozenset(FIELDS[endpoint])


def refusal(endpoint: str, body: dict[str, Any]) -> tuple[str, str] | None:
    """(field, reason) of the first field of `body` this endpoint refuses; None where every vLLM field passes.
    Fields vLLM does not know are not judged here (the line reader refuses those as unsupported)."""
    for name in sorted(body):
        verdict = FIELDS[endpoint].get(name)
        if verdict is None or verdict.answered:
            continue
        value = body[name]
        # True == 1 in Python: a bool passes only for a bool, so `priority: false` is not read as 0.
        if value is None or any(
            value == ok and isinstance(value, bool) == isinstance(ok, bool) for ok in verdict.accepts
        ):
            continue
        return name, verdict.why
    return None


# vLLM's StructuredOutputsParams: exactly one of these kinds per request. Its whitespace switches are left out: the
# job sets them once on the engine (workload/engine/pipeline.py), where a request's own would be ignored.
STRUCTURED_KINDS = frozenset({"json", "regex", "choice", "grammar", "json_object", "structural_tag"})


class FieldRefused(ValueError):
    """A vLLM field's value the job cannot pass on: `field` names it (the line reader makes it the line's error)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The row's sampling keys for the vLLM fields a chat or completions line sets. Values are checked where the
    row's SamplingParams model is (workload/files/rows.py), which names the field of a bad one."""
    found = {name: body[name] for name in VLLM_SAMPLING if body.get(name) is not None}
    structured = body.get("structured_outputs")
    if structured is not None:
        found["structured_outputs"] = structured_outputs(structured)
    return found


def structured_outputs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldRefused("structured_outputs", 'structured_outputs must be an object, e.g. {"regex": "[0-9]+"}')
    unknown = sorted(set(value) - STRUCTURED_KINDS)
    if unknown:
        kinds = ", ".join(sorted(STRUCTURED_KINDS))
        raise FieldRefused("structured_outputs", f"structured_outputs.{unknown[0]} is not one of {kinds}")
    given = [kind for kind in sorted(value) if value[kind] is not None and value[kind] is not False]
    if len(given) != 1:
        raise FieldRefused("structured_outputs", f"structured_outputs must set exactly one kind, got {given}")
    return {given[0]: value[given[0]]}


def table() -> str:
    """The Markdown table docs/job.md holds: one row per field, its endpoints, answered or refused, and why."""
    rows: dict[tuple[str, bool, str], list[str]] = {}
    for endpoint in ENDPOINTS:
        for name, verdict in FIELDS[endpoint].items():
            rows.setdefault((name, verdict.answered, verdict.why), []).append(endpoint)
    lines = ["| vLLM field | endpoints | here | why |", "| --- | --- | --- | --- |"]
    for (name, is_answered, why), endpoints in sorted(rows.items()):
        lines.append(f"| `{name}` | {', '.join(endpoints)} | {'answered' if is_answered else 'refused'} | {why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
