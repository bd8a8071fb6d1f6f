"""Cost per million output tokens beside managed batch prices: the table dated and sourced, its model classes the
real models' shapes, and the figures of issue 42 (about $0.11-0.13 of GPU time a million for Llama-3.1-8B on an
A10G at Spot, beside Bedrock batch's $0.11 and OpenAI Batch's $0.20 for gpt-5-nano)."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest

from infra import facts
from infra.ops.stacks import offline_config
from infra.pricing.estimate import estimate
from infra.pricing.per_token import decode_tokens_per_s, format_per_token, managed_table, per_token_costs
from infra.pricing.stack_costs import estimate_inputs
from infra.pricing.table import load_prices
from workload.contract.engine_sizing import ModelShape, plan_engine, read_model_config

MODELS = Path(__file__).resolve().parents[1] / "workload" / "data" / "model_configs"
PRICES = load_prices()


def _costs(stack: str) -> list:
    inputs = estimate_inputs(stack, offline_config(stack, None), PRICES, None, None)
    return per_token_costs(inputs, estimate(inputs, PRICES), PRICES)


@pytest.mark.parametrize(
    ("model_class", "folder"), [("llama-3.1-8b", "llama-3.1-8b-instruct"), ("llama-3.1-70b", "llama-3.1-70b-instruct")]
)
def test_model_classes_are_the_real_models_shapes(model_class: str, folder: str) -> None:
    real = ModelShape.from_config(read_model_config(MODELS / folder), model_class)
    assert managed_table().shape(model_class) == real


def test_the_table_is_dated_sourced_and_warns_when_stale() -> None:
    table = managed_table()
    assert (date.today() - table.as_of).days <= facts.MAX_AGE_DAYS, "re-check infra/pricing/managed_batch.json"
    assert "aws.amazon.com/bedrock/pricing" in table.source and "openai.com/api/pricing" in table.source
    stale = facts.stale_warnings(table.as_of + timedelta(days=facts.MAX_AGE_DAYS + 1))
    assert any(line.startswith("infra/pricing/managed_batch.json was checked") for line in stale)
    assert {p.comparable for s in table.services.values() for p in s.models.values()} <= set(table.model_classes)


def test_llama_8b_on_a_spot_a10g_costs_about_the_issues_figure() -> None:
    small = {row.model_class: row for row in _costs("small")}
    row = small["llama-3.1-8b"]
    assert row.fits and row.instance_type == "g5.xlarge" and row.tensor_parallel_size == 1
    # Like for like (issue 52): 400-in/200-out rows, prefill in the GPU's time, the managed bill on both
    # (Bedrock 0.11 + 2 x 0.11 a 1M output tokens; gpt-5-nano 0.2 + 2 x 0.025; gpt-4o-mini 0.3 + 2 x 0.075).
    assert 0.18 <= row.gpu_time_per_1m <= 0.32
    assert row.all_in_per_1m > row.gpu_time_per_1m  # the head, NAT, storage and monitoring are on top
    assert row.managed == {
        "Amazon Bedrock batch: Llama 3.1 8B Instruct": 0.33,
        "OpenAI Batch: gpt-5-nano": 0.25,
        "OpenAI Batch: gpt-4o-mini": 0.45,
    }
    # Worked by hand, decode alone: 46 rows of 500 tokens of context a step (400 prompt + half of 200 output), 128 KiB
    # each, plus 16.06 GB of weights, read at 600 GB/s x 0.6; prefill's 400 tokens a row at the A10G's 70 TFLOP/s x
    # 0.5 add their share, so the engine's figure is below the decode-only roofline.
    table = managed_table()
    plan = plan_engine(table.shape("llama-3.1-8b"), "a10g")
    decode_only = plan.max_num_seqs / ((16.06e9 + plan.max_num_seqs * 500 * 131072) / 360e9)
    prefill_s = 2 * 8.03e9 * 400 / 35e12
    with_prefill = 200 / (200 / decode_only + prefill_s)
    assert decode_tokens_per_s(plan, "a10g", table.shape("llama-3.1-8b"), table.throughput) == pytest.approx(
        with_prefill, rel=0.01
    )


def test_a_model_too_big_for_the_tiers_gpu_says_so_and_why() -> None:
    for stack in ("small", "medium", "large"):
        rows = {row.model_class: row for row in _costs(stack)}
        assert not rows["llama-3.1-70b"].fits and "cannot fit on 1 x a10g" in (rows["llama-3.1-70b"].why_not or "")
    text = format_per_token(_costs("small"))
    assert "llama-3.1-70b on g5.xlarge: does not fit" in text and "Amazon Bedrock batch" in text
