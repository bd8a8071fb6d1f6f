"""Every sample of a finished request, as vLLM made it: text, tokens, finish reason and log probabilities.

Ray Data LLM's engine stage keeps only `outputs[0]`'s text and token ids and no finish reason (Ray 2.60,
`vLLMOutputData.from_vllm_engine_output`), which loses `n` samples, vLLM's own finish reason and the top log
probabilities. The guarded engine stage (workload/engine/guard.py) keeps the request's whole output and adds these
two columns to its row. Choices travel as JSON text: one Arrow type whatever `n` and `logprobs` a row asked for.
"""

from __future__ import annotations

import json
import math
from typing import Any

CHOICES_COLUMN = "_choices"  # JSON list of choices, or None where the row asked for one sample and no logprobs
FINISH_COLUMN = "_finish_reason"  # vLLM's finish reason of the first sample: stop, length, abort


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


def engine_columns(output: Any, params: Any) -> dict[str, Any]:
    """The two columns for a finished `vllm.RequestOutput` (`params`: its SamplingParams)."""
    completions = list(getattr(output, "outputs", None) or [])
    if not completions:
        return {FINISH_COLUMN: None, CHOICES_COLUMN: None}
    top = getattr(params, "logprobs", None)
    wanted = getattr(params, "n", 1) > 1 or top is not None
    choices = None
    if wanted:
        choices = json.dumps(
            [
                {
                    "index": c.index,
                    "text": c.text,
                    "num_tokens": len(c.token_ids),
                    "finish_reason": c.finish_reason,
                    "logprobs": None if top is None else _positions(c, top),
                }
                for c in sorted(completions, key=lambda c: c.index)
            ]
        )
    return {FINISH_COLUMN: completions[0].finish_reason, CHOICES_COLUMN: choices}
