"""Issue 52's models sized right before deploy: MoE, MXFP4 and FP8 checkpoints, a 70B laid out for throughput, the
memory calibrated against vLLM's start-up logs, a model that fits nowhere, and the GPU names the engine maps.
Every config.json is test data with its source (tests/workload/data/model_configs/README.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workload.contract.engine_sizing import (
    GIB,
    MIB,
    ModelShape,
    SizingError,
    gpu_kind,
    gpu_kinds,
    plan_engine,
    read_model_config,
    reserve_bytes,
)
from workload.engine.auto_settings import kind_of_gpu_name, settled_summary

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
MODELS = DATA / "model_configs"


def shape(name: str) -> ModelShape:
    return ModelShape.from_config(read_model_config(MODELS / name), name)


@pytest.mark.parametrize(
    ("name", "published_gb"),
    [
        ("qwen3-30b-a3b", 61.1),
        ("gpt-oss-120b", 65.3),
        ("gpt-oss-20b", 13.8),
        ("llama-3.1-8b-instruct-fp8", 9.1),
        ("llama-3.1-70b-instruct", 141.0),
    ],
)
def test_weights_are_within_5_percent_of_the_published_checkpoints(name: str, published_gb: float) -> None:
    assert shape(name).weight_bytes() / 1e9 == pytest.approx(published_gb, rel=0.05)


def test_moe_experts_are_counted_at_their_own_width() -> None:
    qwen = shape("qwen3-30b-a3b")
    assert (qwen.experts, qwen.expert_width, qwen.experts_per_token) == (128, 768, 8)
    # Qwen's card: 30.5 B in all, 3.3 B activated.
    assert round(qwen.parameters() / 1e9, 1) == 30.5 and 3.3 <= qwen.active_parameters() / 1e9 < 3.4
    oss = shape("gpt-oss-120b")
    assert round(oss.parameters() / 1e9, 1) == 116.8  # OpenAI's card: 117 B
    # Only the experts are MXFP4 (4.25 bits with their scales); attention, router, embeddings stay bf16.
    assert oss.quantized_parts == ("experts",) and oss.weight_bits == 4.25
    assert oss.expert_bytes() == pytest.approx(114.66e9 * 4.25 / 8, rel=0.01)


def test_deepseek_v3_counts_mla_shared_experts_and_dense_first_layers() -> None:
    deepseek = shape("deepseek-v3")
    assert deepseek.dense_layers == (0, 1, 2) and deepseek.shared_intermediate_size == 2048
    assert round(deepseek.parameters() / 1e9) == 671  # DeepSeek's card: 671 B without the MTP module
    # MLA caches one latent of 512 + 64 a layer, on every GPU whatever the tensor parallel size.
    assert deepseek.kv_bytes_per_token(1) == deepseek.kv_bytes_per_token(8) == 61 * 576 * 2
    plan = plan_engine(deepseek, "h200", 8)
    assert plan.tensor_parallel_size == 8 and plan.quantization.startswith("fp8")


def test_the_issues_stacks_fit_as_they_should() -> None:
    assert plan_engine(shape("qwen3-30b-a3b"), "h100").tensor_parallel_size == 1
    assert plan_engine(shape("qwen3-30b-a3b"), "a10g", 4).tensor_parallel_size == 4
    assert plan_engine(shape("gpt-oss-120b"), "h100").max_num_seqs > 100
    assert plan_engine(shape("gpt-oss-20b"), "a10g").max_num_seqs > 100
    fp8 = plan_engine(shape("llama-3.1-8b-instruct-fp8"), "a10g")
    assert fp8.weights_gib == pytest.approx(8.5, abs=0.1) and fp8.quantization.startswith("compressed-tensors: 8")


def test_a_70b_is_laid_out_for_tokens_per_second_not_the_smallest_tp() -> None:
    llama = shape("llama-3.1-70b-instruct")
    a100 = plan_engine(llama, "a100-40gb", 8)
    assert (a100.tensor_parallel_size, a100.engines_per_node) == (8, 1) and a100.max_num_seqs > 600
    assert a100.runner_up is not None and a100.runner_up.startswith("tp4 x 2")
    pinned = plan_engine(llama, "a100-40gb", 8, tensor_parallel_size=4)
    assert pinned.max_num_seqs < 60 and a100.output_tokens_per_s > 2 * pinned.output_tokens_per_s
    h100 = plan_engine(llama, "h100", 8)
    assert (h100.tensor_parallel_size, h100.engines_per_node) == (4, 2) and 700 <= h100.max_num_seqs <= 900
    assert h100.runner_up is not None and h100.runner_up.startswith("tp8 x 1")


@pytest.mark.parametrize("log", json.loads((DATA / "vllm_start_logs.json").read_text())["logs"])
def test_kv_cache_matches_vllms_start_up_logs(log: dict) -> None:
    """At the log's own settings (its step budget and sequences decide the profiled peak)."""
    model = shape(log["model"])
    kind = gpu_kind(log["gpu"])
    batched, seqs = log["max_num_batched_tokens"], log["max_num_seqs"]
    usable = kind.cuda_total_mib * MIB * log["gpu_memory_utilization"] - model.weight_bytes()
    tokens = (usable - reserve_bytes(model, batched, seqs, 1)) / model.kv_bytes_per_token(1)
    assert tokens == pytest.approx(log["kv_cache_tokens"], rel=log["tolerance"]), log["source"]
    assert "source" in log and "settings_source" in log


def test_vllms_base_is_cudas_total_not_nvidia_smis() -> None:
    for name, kind in gpu_kinds().kinds.items():
        assert 0.95 * kind.memory_mib < kind.cuda_total_mib < kind.memory_mib, name
    assert gpu_kind("a10g").cuda_total_mib * MIB / GIB == pytest.approx(22.0, abs=0.05)


def test_a_model_that_fits_nowhere_names_no_gpu() -> None:
    """DeepSeek-V3 in bf16 (1.3 TB): not 8 of any GPU this knows."""
    config = {**read_model_config(MODELS / "deepseek-v3")}
    del config["quantization_config"]
    bf16 = ModelShape.from_config(config, "deepseek-v3-bf16")
    for name in gpu_kinds().kinds:
        with pytest.raises(SizingError, match="cannot fit on 8 x") as caught:
            plan_engine(bf16, name, 8)
    assert "a larger GPU" not in str(caught.value) and "4-bit quantized build" in str(caught.value)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_method": "hqq"}, "quantization method 'hqq' is not one this can size"),
        ({"quant_method": "gguf"}, "quantization method 'gguf'"),
        ({"quant_method": "bitsandbytes"}, "without load_in_4bit or load_in_8bit"),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "no config_groups"),
    ],
)
def test_a_format_it_cannot_size_is_a_one_line_error(quantization: dict, message: str) -> None:
    config = read_model_config(MODELS / "llama-3.1-8b-instruct")
    with pytest.raises(SizingError, match=message) as caught:
        ModelShape.from_config({**config, "quantization_config": quantization}, "x")
    assert "\n" not in str(caught.value)


def test_quantised_formats_read_their_bits_and_unquantised_modules() -> None:
    config = read_model_config(MODELS / "llama-3.1-8b-instruct")
    dense = ModelShape.from_config(config, "8b").weight_bytes()

    def gib(quantization: dict) -> float:
        return ModelShape.from_config({**config, "quantization_config": quantization}, "q").weight_bytes() / GIB

    w4a16 = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
             "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}}}}  # fmt: skip
    assert gib(w4a16) == pytest.approx(gib({"quant_method": "awq", "bits": 4, "group_size": 128}), rel=0.01)
    assert gib({"quant_method": "bitsandbytes", "load_in_8bit": True}) == pytest.approx(
        gib({"quant_method": "fp8"}), rel=0.01
    )
    nf4 = gib({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True})
    assert 4.5 < nf4 < 5.5 < dense / GIB
    # Attention left unquantised, by regular expression or by substring: more bytes than all of it at 8 bits.
    fp8 = gib({"quant_method": "fp8"})
    assert gib({"quant_method": "fp8", "ignored_layers": ["re:.*self_attn.*"]}) > fp8
    assert gib({"quant_method": "fp8", "modules_to_not_convert": ["attn"]}) > fp8
    assert gib({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}) > fp8


def test_gpu_detection_maps_every_kind_it_names() -> None:
    names = {
        "NVIDIA A10G": "a10g",
        "NVIDIA L4": "l4",
        "NVIDIA A100-SXM4-40GB": "a100-40gb",
        "NVIDIA A100-SXM4-80GB": "a100-80gb",
        "NVIDIA H100 80GB HBM3": "h100",
        "NVIDIA H200": "h200",
        "NVIDIA L40S": None,
        "Tesla T4": None,
    }
    assert {name: kind_of_gpu_name(name) for name in names} == names
    assert set(gpu_kinds().kinds) <= set(names.values())


def test_the_engine_says_what_vllm_gets_inside_ray_data_llm() -> None:
    assert settled_summary({"max_model_len": 2048}).startswith(
        "max_num_seqs 128, max_num_batched_tokens vLLM's 2048 (left to it)"
    )


def test_engine_plan_prints_the_runner_up_and_a_one_line_format_error(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "workload", "engine-plan", "--gpu", "h100", "--gpus", "8"]
    done = subprocess.run(
        [*command, "--model", str(MODELS / "llama-3.1-70b-instruct")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["tensor_parallel_size"] == 4 and plan["runner_up"].startswith("tp8 x 1")
    config = {**read_model_config(MODELS / "llama-3.1-8b-instruct"), "quantization_config": {"quant_method": "hqq"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    bad = subprocess.run([*command, "--model", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'hqq'" in bad.stderr


def test_engine_calibration_reads_summaries_and_logs_and_proposes_the_edit(tmp_path: Path) -> None:
    """The engine's line as guard.py prints it, from a stand-in vllm_config (no GPU engine starts here): vLLM kept
    0.5 GiB more beside the cache than the plan, so the reserve constant moves up by 0.5 GiB."""
    from types import SimpleNamespace

    from workload.cli.engine_calibration import proposal, records, run
    from workload.contract.engine_sizing import GRAPHS_AND_NON_TORCH_GIB
    from workload.engine.auto_settings import CALIBRATION_LINE, calibration_record

    plan = plan_engine(shape("llama-3.1-8b-instruct"), "a10g")
    fewer = int(0.5 * GIB // plan.kv_bytes_per_token)
    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks=(plan.kv_cache_tokens - fewer) // 16, block_size=16),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=plan.max_num_seqs),
    )
    record = calibration_record(plan, vllm_config, "NVIDIA A10G")
    log = tmp_path / "run.log"
    log.write_text(f"noise\n(pid=1) {CALIBRATION_LINE}{json.dumps(record)}\n")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"rows_in": 1, "engine_calibration": [record]}))
    assert records([log]) == records([summary]) == [record]
    text = proposal([record])
    assert f"-GRAPHS_AND_NON_TORCH_GIB = {GRAPHS_AND_NON_TORCH_GIB}" in text
    assert f"+GRAPHS_AND_NON_TORCH_GIB = {round(GRAPHS_AND_NON_TORCH_GIB + 0.5, 2)}" in text
    assert '"kv_cache_tokens": ' in text and "llama-3.1-8b-instruct | a10g | 1 |" in text
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    assert run(argparse.Namespace(logs=[empty])) == 1


def test_qwen2_moe_shared_experts_and_sparse_steps() -> None:
    """Qwen1.5-MoE-A2.7B's fields (transformers' Qwen2MoeConfig defaults are that model's): 60 experts of 1408, a
    shared expert of 5632; Qwen's card: 14.3 B parameters. Every other layer dense with decoder_sparse_step 2."""
    config = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
              "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60,
              "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}  # fmt: skip
    qwen = ModelShape.from_config(config, "qwen1.5-moe-a2.7b")
    assert round(qwen.parameters() / 1e9, 1) == 14.3 and qwen.dense_layers == ()
    assert ModelShape.from_config({**config, "decoder_sparse_step": 2}, "x").dense_layers == tuple(range(0, 24, 2))
    assert ModelShape.from_config({**config, "mlp_only_layers": [0, 5]}, "x").dense_layers == (0, 5)
