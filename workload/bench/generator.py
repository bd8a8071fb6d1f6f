"""The seeded benchmark workload: bimodal decode lengths, a prompt-length distribution, ignore_eos.

Batch traffic mixes short answers with long reasoning traces. A synchronous engine pays for the longest
request in every batch; continuous batching refills a finished slot at once. With `ignore_eos` and
`min_tokens == max_tokens` every request decodes exactly its drawn length, so a run is the same work in
every mode and on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workload.contract.config import SamplingParams

# Plain words for prompts: their token count depends on the tokenizer, so the engine's own count is what is
# reported.
_SENTENCE = (
    "batch inference runs many prompts through one model and writes every answer summarise the following "
    "support ticket in one sentence translate the product description into french keeping brand names what "
    "is the capital of france classify the review as positive negative or neutral write a haiku about spot "
    "instances reclaimed at night extract every date and amount from this invoice as json explain step by "
    "step"
)
_WORDS = tuple(_SENTENCE.split())


class TokenRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is more than max ({self.max})")
        return self


class WorkloadSpec(BaseModel):
    """What to generate. Two specs that compare equal generate the same requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_requests: int = Field(ge=1, description="Requests in the run.")
    seed: int = Field(0, description="Seeds every draw: same seed, same prompts and lengths.")
    long_fraction: float = Field(0.3, ge=0.0, le=1.0, description="Share of long (reasoning-trace) requests.")
    short_tokens: TokenRange = Field(description="Decode length of short answers, drawn uniformly.")
    long_tokens: TokenRange = Field(description="Decode length of long traces, drawn uniformly.")
    prompt_words_median: int = Field(24, ge=1, description="Median prompt length in words (log-normal).")
    prompt_words_sigma: float = Field(0.6, ge=0.0, description="Spread of the log-normal prompt length.")
    prompt_words_max: int = Field(256, ge=1, description="Longest prompt, in words.")
    detokenize: bool = Field(
        True,
        description="Turn tokens into text in the engine; off where a dummy-weight model's vocabulary "
        "is larger than its tokenizer's.",
    )

    def with_long(self, tokens: int) -> WorkloadSpec:
        """The same workload with every long request decoding exactly `tokens` (one point of the sweep)."""
        return self.model_copy(update={"long_tokens": TokenRange(min=tokens, max=tokens)})


@dataclass(frozen=True)
class BenchRequest:
    bench_id: int
    kind: str  # "short" or "long"
    prompt: str
    max_tokens: int

    def sampling_params(self, detokenize: bool = True) -> dict[str, Any]:
        """vLLM sampling params that decode exactly `max_tokens` tokens, greedily (no sampler noise)."""
        params = SamplingParams(
            max_tokens=self.max_tokens, min_tokens=self.max_tokens, temperature=0.0, ignore_eos=True
        ).for_engine()
        if not detokenize:
            params["detokenize"] = False
        return params


def generate(spec: WorkloadSpec) -> list[BenchRequest]:
    """The requests of `spec` in submission order (long and short interleaved at random, as in traffic)."""
    rng = random.Random(spec.seed)
    num_long = round(spec.num_requests * spec.long_fraction)
    kinds = ["long"] * num_long + ["short"] * (spec.num_requests - num_long)
    rng.shuffle(kinds)
    requests = []
    for bench_id, kind in enumerate(kinds):
        tokens = spec.long_tokens if kind == "long" else spec.short_tokens
        words = round(rng.lognormvariate(math.log(spec.prompt_words_median), spec.prompt_words_sigma))
        words = max(1, min(spec.prompt_words_max, words))
        prompt = " ".join(rng.choice(_WORDS) for _ in range(words))
        requests.append(
            BenchRequest(
                bench_id=bench_id,
                kind=kind,
                prompt=f"Request {bench_id}: {prompt}",
                max_tokens=rng.randint(tokens.min, tokens.max),
            )
        )
    return requests
