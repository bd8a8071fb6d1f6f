"""Engine sizing from real models' config.json (tests/workload/data/model_configs, no weights): the figures of
issue 42 fixed as expectations, the CLI's JSON and exits, and `auto` settled at start without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from workload.contract.config import build_config
from workload.contract.engine_sizing import (
    GIB,
    ModelShape,
    SizingError,
    gpu_kinds,
    kind_of_instance,
    plan_engine,
    read_model_config,
)
from workload.engine.auto_settings import kind_of_gpu_name, settle
from workload.engine.pipeline import engine_kwargs

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "data" / "model_configs"
TIER_GPUS = ("a10g", "l4", "a100-40gb", "a100-80gb", "h100")


def shape(name: str) -> ModelShape:
    return ModelShape.from_config(read_model_config(MODELS / name), name)


def test_parameter_counts_match_the_model_cards() -> None:
    """Counted from the architecture fields alone; Qwen's 32,763,876,352 is its published exact count."""
    assert shape("qwen2.5-32b-instruct").parameters() == 32_763_876_352
    assert round(shape("llama-3.1-8b-instruct").parameters() / 1e9, 2) == 8.03
    assert round(shape("llama-3.1-70b-instruct").parameters() / 1e9, 1) == 70.6
    assert round(shape("mixtral-8x7b-instruct").parameters() / 1e9, 1) == 46.7  # Mistral's card: 46.7 B


def test_llama_8b_on_an_a10g_holds_about_46_rows_of_600_tokens() -> None:
    """Issue 52's calibration (CUDA's 21.99 GiB, vLLM's profiled reserve) moved issue 42's 33.5k tokens to 27.8k."""
    plan = plan_engine(shape("llama-3.1-8b-instruct"), "a10g")
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert 26_000 <= plan.kv_cache_tokens <= 30_000
    assert 42 <= plan.max_num_seqs <= 50  # 128 over-admits
    assert plan.tensor_parallel_size == 1 and plan.engines_per_node == 1
    assert plan.max_num_batched_tokens * 8 <= plan.kv_cache_tokens


def test_llama_8b_on_an_a100_40gb_leaves_about_half_its_cache_unused_at_128() -> None:
    plan = plan_engine(shape("llama-3.1-8b-instruct"), "a100-40gb")
    used_at_128 = 128 * 600 / plan.kv_cache_tokens
    assert 0.4 <= 1 - used_at_128 <= 0.6
    assert plan.max_num_seqs > 200 and plan.max_num_batched_tokens == 16384


def test_qwen_32b_needs_tensor_parallel_below_80_gb() -> None:
    qwen = shape("qwen2.5-32b-instruct")
    assert plan_engine(qwen, "a10g", 4).tensor_parallel_size == 4
    # The smallest tp that fits (2) leaves 4 engines of ~50 sequences; tp 4 holds ~700 each and decodes faster.
    eight = plan_engine(qwen, "a100-40gb", 8)
    assert (eight.tensor_parallel_size, eight.engines_per_node) == (4, 2)
    assert plan_engine(qwen, "a100-40gb", 8, tensor_parallel_size=2).engines_per_node == 4  # a pinned value wins
    assert plan_engine(qwen, "a100-80gb").tensor_parallel_size == 1
    with pytest.raises(SizingError, match=r"tensor parallel over 4 a10g GPUs \(--gpus 4\)"):
        plan_engine(qwen, "a10g", 1)


@pytest.mark.parametrize("name", ["llama-3.1-70b-instruct", "mixtral-8x7b-instruct"])
def test_a_model_that_cannot_fit_a_four_gpu_a10g_node_names_the_fixes(name: str) -> None:
    with pytest.raises(SizingError) as caught:
        plan_engine(shape(name), "a10g", 4)
    message = str(caught.value)
    assert "cannot fit on 4 x a10g" in message
    assert "--gpus 8" in message and "a larger GPU (a100-40gb, h100, a100-80gb, h200 x 4)" in message
    assert plan_engine(shape(name), "a10g", 8).tensor_parallel_size == 8


def test_quantized_build_is_sized_at_its_bits() -> None:
    config = read_model_config(MODELS / "llama-3.1-70b-instruct")
    awq = ModelShape.from_config({**config, "quantization_config": {"quant_method": "awq", "bits": 4}}, "70b-awq")
    assert awq.weight_bytes() < shape("llama-3.1-70b-instruct").weight_bytes() / 3
    assert plan_engine(awq, "a100-80gb").tensor_parallel_size == 1
    with pytest.raises(SizingError, match="quantization method 'bitsandbytes'"):
        ModelShape.from_config({**config, "quantization_config": {"quant_method": "bitsandbytes"}})


def test_bad_inputs_are_one_line_errors() -> None:
    llama = shape("llama-3.1-8b-instruct")
    with pytest.raises(SizingError, match="unknown GPU kind 'v100'"):
        plan_engine(llama, "v100")
    with pytest.raises(SizingError, match="max_position_embeddings"):
        plan_engine(shape("qwen2.5-32b-instruct"), "h100", max_model_len=65536)
    with pytest.raises(SizingError, match="no num_hidden_layers"):
        ModelShape.from_config({"hidden_size": 8, "num_attention_heads": 1, "vocab_size": 8})
    with pytest.raises(SizingError, match="tensor_parallel_size 3"):
        plan_engine(llama, "a10g", 4, tensor_parallel_size=3)


def test_gpu_kinds_table_is_dated_sourced_and_fresh() -> None:
    table = gpu_kinds()
    assert set(TIER_GPUS) <= set(table.kinds)
    assert (date.today() - table.checked).days <= 365, "re-check workload/contract/gpu_kinds.json (its `how`)"
    # Every GPU instance type the tiers may launch maps to a kind.
    for instance in ("g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge", "g6.xlarge", "p4d.24xlarge"):
        assert kind_of_instance(instance) is not None, instance
    assert kind_of_gpu_name("NVIDIA A100-SXM4-80GB") == "a100-80gb" and kind_of_gpu_name("NVIDIA A10G") == "a10g"


def test_engine_plan_cli_prints_json_and_exits_1_when_it_cannot_fit() -> None:
    command = [sys.executable, "-m", "workload", "engine-plan", "--gpu", "a10g"]
    ok = subprocess.run(
        [*command, "--model", str(MODELS / "llama-3.1-8b-instruct")], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    plan = json.loads(ok.stdout)
    assert plan["max_num_seqs"] == plan_engine(shape("llama-3.1-8b-instruct"), "a10g").max_num_seqs
    assert {"weights_gib", "kv_bytes_per_token", "kv_cache_tokens", "engines_per_node"} <= set(plan)
    too_big = subprocess.run(
        [*command, "--gpus", "4", "--model", str(MODELS / "mixtral-8x7b-instruct")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert too_big.returncode == 1 and too_big.stdout == ""
    assert too_big.stderr.count("\n") == 1 and "cannot fit on 4 x a10g" in too_big.stderr


def test_auto_on_the_cpu_keeps_the_earlier_values_and_a_number_pins() -> None:
    base = {"input": {"uri": "in.jsonl"}, "output": {"uri": "out"}}
    cpu = engine_kwargs(build_config(base), keep_auto=True)
    assert cpu["max_num_seqs"] == 128 and "max_num_batched_tokens" not in cpu
    gpu = engine_kwargs(build_config({**base, "device": "gpu"}), keep_auto=True)
    assert gpu["max_num_seqs"] == "auto" and gpu["max_num_batched_tokens"] == "auto"
    pinned = engine_kwargs(build_config({**base, "device": "gpu", "engine": {"max_num_seqs": 40}}), keep_auto=True)
    assert pinned["max_num_seqs"] == 40
    # The serve and bench paths, which cannot size, get the earlier values on a GPU too.
    assert engine_kwargs(build_config({**base, "device": "gpu"}))["max_num_seqs"] == 128


def test_settle_sizes_auto_from_the_gpus_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML stands in for a GPU here (none on this machine): `free_gpu_memory` returns what an A10G reports."""
    from workload.engine import auto_settings

    monkeypatch.setattr(auto_settings, "free_gpu_memory", lambda: (23028 * 2**20, "NVIDIA A10G"))
    kwargs = {"max_model_len": 2048, "max_num_seqs": "auto", "max_num_batched_tokens": 1024, "dtype": "auto"}
    settled, plan = settle(kwargs, str(MODELS / "llama-3.1-8b-instruct"), 600)
    assert plan is not None and settled["max_num_seqs"] == plan.max_num_seqs == 46
    assert settled["max_num_batched_tokens"] == 1024  # pinned: left alone
    # A GPU the estimate says is too small: the engine starts with vLLM's defaults and lets vLLM's profile decide.
    small = settle(kwargs, str(MODELS / "llama-3.1-70b-instruct"), 600, (23028 * 2**20, "NVIDIA A10G"))
    assert small == (
        {"max_model_len": 2048, "max_num_seqs": 128, "max_num_batched_tokens": 1024, "dtype": "auto"},
        None,
    )
    monkeypatch.setattr(auto_settings, "free_gpu_memory", lambda: None)
    assert settle(kwargs, str(MODELS / "llama-3.1-8b-instruct"), 600)[0]["max_num_seqs"] == 128
    assert plan.kv_cache_gib * GIB <= 23028 * 2**20


def test_the_gpu_check_runs_the_jobs_settings_on_dummy_weights() -> None:
    """tools/gpu_check.py's engine arguments, sized as if on an A10G: engine-plan's figures, dummy weights."""
    from tools.gpu_check import job_engine_kwargs

    kwargs, plan = job_engine_kwargs(MODELS / "llama-3.1-8b-instruct", 600, (23028 * 2**20, "NVIDIA A10G"))
    assert plan == plan_engine(shape("llama-3.1-8b-instruct"), "a10g")
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (
        plan.max_num_seqs,
        plan.max_num_batched_tokens,
    )


def test_engines_start_at_once_and_text_is_decoded_once() -> None:
    """Ray Data LLM's processor config: a fixed pool (n, n), not an int (an autoscaling 1..n); no detokenize stage;
    on GPUs two spread tokenizer actors once there are two engines."""
    from workload.engine.pipeline import cpu_stage_actors, processor_config

    base = {"input": {"uri": "in.jsonl"}, "output": {"uri": "out"}, "device": "gpu", "replicas": 4}
    config = build_config(base)
    processor = processor_config(config, config.model)
    assert processor.concurrency == (4, 4)
    assert processor.get_concurrency(autoscaling_enabled=True) == {"min_size": 4, "max_size": 4}
    assert processor.detokenize_stage is False
    assert cpu_stage_actors(config) == 2
    assert processor_config(build_config({**base, "max_replicas": 6}), config.model).concurrency == (4, 6)
    assert cpu_stage_actors(build_config({**base, "device": "cpu"})) == 1


def test_docs_gpu_table_is_what_engine_plan_gives() -> None:
    """docs/gpu.md's table of the models on the tiers' GPUs, row by row, against the sizing (no drift)."""
    names = {p.name.lower().replace("-instruct", ""): p.name for p in MODELS.iterdir() if p.is_dir()}
    rows = [line.split("|")[1:-1] for line in (ROOT / "docs" / "gpu.md").read_text().splitlines()]
    checked = 0
    for cells in rows:
        cells = [cell.strip() for cell in cells]
        if len(cells) != 8 or cells[1] not in TIER_GPUS or cells[0].lower().replace("-instruct", "") not in names:
            continue
        tp = int(cells[2])
        plan = plan_engine(shape(names[cells[0].lower().replace("-instruct", "")]), cells[1], tp)
        assert plan.tensor_parallel_size == tp, cells
        assert (f"{plan.kv_cache_tokens:,}", str(plan.max_num_seqs)) == (cells[5], cells[6]), cells
        checked += 1
    assert checked == 45
