"""The engine stage asks vLLM for final outputs only, and keeps of each answer what Ray's output drops. Upstream's
request builder is stood in for by a recorder: the real engine path, where every answered row passes through this
wrapper, is the job's end-to-end test (tests/workload/test_job_e2e.py); this checks the one field the wrapper sets,
which an answer cannot show."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams

from workload.engine.choices import CACHED_COLUMN, FINISH_COLUMN, engine_columns
from workload.engine.guard import GuardedEngineUDF


class _UpstreamBuilder:
    """Stands in for `vLLMEngineWrapper._prepare_llm_request`: it builds sampling params with vLLM's defaults."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    async def __call__(self, row: dict[str, Any]) -> Any:
        self.rows.append(row)
        return SimpleNamespace(params=SamplingParams(max_tokens=row["max_tokens"]))


def test_rows_ask_for_their_final_output_only() -> None:
    assert SamplingParams(max_tokens=4).output_kind is RequestOutputKind.CUMULATIVE  # what upstream would send
    udf = object.__new__(GuardedEngineUDF)
    builder = _UpstreamBuilder()
    udf.llm = SimpleNamespace(_prepare_llm_request=builder)
    udf._final_outputs_only()
    request = asyncio.run(udf.llm._prepare_llm_request({"max_tokens": 4}))
    assert request.params.output_kind is RequestOutputKind.FINAL_ONLY
    assert request.params.max_tokens == 4 and builder.rows == [{"max_tokens": 4}]


def test_pooling_requests_are_left_as_upstream_built_them() -> None:
    udf = object.__new__(GuardedEngineUDF)

    async def pooling(row: dict[str, Any]) -> Any:
        return SimpleNamespace(params="pooling params")

    udf.llm = SimpleNamespace(_prepare_llm_request=pooling)
    udf._final_outputs_only()
    assert asyncio.run(udf.llm._prepare_llm_request({})).params == "pooling params"


def test_the_prompts_prefix_cache_hits_ride_beside_the_answer() -> None:
    """vLLM's RequestOutput counts the prompt's tokens its prefix cache held (issue 55); Ray's output data does not
    (Ray 2.60's vLLMOutputData), so the guarded stage carries them in a column of their own."""
    answer = CompletionOutput(index=0, text="ab", token_ids=[5, 6], cumulative_logprob=None, logprobs=None)
    answer.finish_reason = "stop"
    output = RequestOutput(
        request_id="r",
        prompt="p",
        prompt_token_ids=list(range(40)),
        prompt_logprobs=None,
        outputs=[answer],
        finished=True,
        num_cached_tokens=32,
    )
    columns = engine_columns(output, SamplingParams(max_tokens=2))
    assert columns[CACHED_COLUMN] == 32 and columns[FINISH_COLUMN] == "stop"
    assert engine_columns(None, SamplingParams())[CACHED_COLUMN] is None  # no answer kept: unknown, not 0
