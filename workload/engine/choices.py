"""Every sample of a finished request, as vLLM made it: text, tokens, finish reason and log probabilities.

Ray Data LLM's engine stage keeps only `outputs[0]`'s text and token ids and no finish reason (Ray 2.60,
`vLLMOutputData.from_vllm_engine_output`), which loses `n` samples, vLLM's own finish reason and the top log
probabilities. The guarded engine stage (workload/engine/guard.py) keeps the request's whole output and adds these
columns to its row. Choices travel as JSON text: one Arrow type whatever `n` and `logprobs` a row asked for.
With a reasoning parser every row has choices, each with its thinking apart (`reasoning`, `reasoning_tokens`); a row
with tools has choices with the calls vLLM's tool parser read (`tool_calls`) and the finish reason vLLM's server
gives them (workload/files/tools.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from workload.engine.reasoning import Split
from workload.files.tools import finish_reason, forces_call

CHOICES_COLUMN = "_choices"  # JSON list of choices, or None where the row asked for one sample and no logprobs
FINISH_COLUMN = "_finish_reason"  # vLLM's finish reason of the first sample: stop, length, abort
# Of the prompt's tokens, those vLLM's prefix cache held (RequestOutput.num_cached_tokens, from the scheduler's
# prefill stats): OpenAI's usage.prompt_tokens_details.cached_tokens (issue 55). Ray's output keeps no count of them.
CACHED_COLUMN = "_cached_tokens"


def _token(text: str | None) -> dict[str, Any]:
    token = text or ""
    return {"token": token, "bytes": list(token.encode("utf-8", errors="replace"))}


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else -9999.0  # OpenAI's own stand-in for minus infinity


def _positions(completion: Any, top: int) -> list[dict[str, Any]]:
    """One entry per generated token, in OpenAI's chat shape: token, logprob, bytes, top_logprobs (rank order)."""
    entries = []
    for token_id, candidates in zip(completion.token_ids, completion.logprobs or [], strict=False):
        chosen = candidates.get(token_id)
        ranked = sorted((c for c in candidates.values() if c.rank is not None and c.rank <= top), key=lambda c: c.rank)
        entries.append(
            {
                **_token(chosen.decoded_token if chosen is not None else None),
                "logprob": _logprob(chosen.logprob) if chosen is not None else -9999.0,
                "top_logprobs": [{**_token(c.decoded_token), "logprob": _logprob(c.logprob)} for c in ranked[:top]],
            }
        )
    return entries


def engine_columns(
    output: Any, params: Any, split: Callable[[Any], Split] | None = None, tool_choice: Any = None
) -> dict[str, Any]:
    """The columns for a finished `vllm.RequestOutput` (`params`: its SamplingParams). `split`: vLLM's parsers over
    one sample (workload/engine/reasoning.py); each choice then carries its answer as `text`, its thinking as
    `reasoning` and `reasoning_tokens` (with a reasoning parser), its `tool_calls` (a row with tools, whose
    `tool_choice` sets the finish reason), and `generated_text` becomes the first answer."""
    completions = sorted(getattr(output, "outputs", None) or [], key=lambda c: c.index)
    cached = getattr(output, "num_cached_tokens", None)
    if not completions:
        return {FINISH_COLUMN: None, CHOICES_COLUMN: None, CACHED_COLUMN: cached}
    top = getattr(params, "logprobs", None)
    wanted = getattr(params, "n", 1) > 1 or top is not None or split is not None
    columns: dict[str, Any] = {
        FINISH_COLUMN: completions[0].finish_reason,
        CHOICES_COLUMN: None,
        CACHED_COLUMN: cached,
    }
    if not wanted:
        return columns
    choices = []
    for c in completions:
        choice = {
            "index": c.index,
            "text": c.text,
            "num_tokens": len(c.token_ids),
            "finish_reason": c.finish_reason,
            "logprobs": None if top is None else _positions(c, top),
        }
        if split is not None:
            parts = split(c)
            choice["text"] = parts.content
            if parts.reasoning_tokens is not None:
                choice.update(reasoning=parts.reasoning, reasoning_tokens=parts.reasoning_tokens)
            if parts.tool_calls is not None:
                if forces_call(tool_choice):  # vLLM's server answers a forced call with content "" (serving.py)
                    choice["text"] = parts.content or ""
                choice["tool_calls"] = parts.tool_calls
                choice["finish_reason"] = finish_reason(tool_choice, parts.tool_calls, c.finish_reason)
        choices.append(choice)
    if split is not None:
        columns["generated_text"] = choices[0]["text"] or ""  # a string column: an answer of no text is ""
        columns[FINISH_COLUMN] = choices[0]["finish_reason"]
    columns[CHOICES_COLUMN] = json.dumps(choices)
    return columns
