"""The benchmark's pure parts: the seeded workload, the profiles and what the GPU profile would run.

The GPU profile cannot run here (no GPU with vLLM in this workplace), so these tests check what it would run:
its engine arguments as vLLM parses them, its model folder, its job config and its workload.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from workload.bench.cli import add_arguments, profile_from_args
from workload.bench.engine_args import engine_kwargs
from workload.bench.generator import TokenRange, WorkloadSpec, generate
from workload.bench.profiles import (
    LLAMA_3_1_8B_SHAPE,
    PROFILES,
    TOKENS_PER_WORD_BOUND,
    get_profile,
    materialise_model,
)
from workload.bench.worker import WorkerTask
from workload.engine.pipeline import engine_kwargs as job_engine_kwargs

SPEC = WorkloadSpec(
    num_requests=200,
    seed=7,
    long_fraction=0.3,
    short_tokens=TokenRange(min=30, max=70),
    long_tokens=TokenRange(min=100, max=2000),
)


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    assert generate(SPEC) == generate(SPEC)
    assert generate(SPEC) != generate(SPEC.model_copy(update={"seed": 8}))


def test_decode_lengths_are_bimodal_in_their_ranges() -> None:
    requests = generate(SPEC)
    longs = [r for r in requests if r.kind == "long"]
    shorts = [r for r in requests if r.kind == "short"]
    assert len(longs) == 60 and len(shorts) == 140
    assert all(100 <= r.max_tokens <= 2000 for r in longs)
    assert all(30 <= r.max_tokens <= 70 for r in shorts)
    assert len({r.max_tokens for r in longs}) > 30  # drawn, not one value
    assert [r.bench_id for r in requests] == list(range(200))
    # Interleaved as in real traffic: neither kind all at the front.
    assert {r.kind for r in requests[:20]} == {"short", "long"}


def test_prompt_lengths_follow_a_distribution_within_bounds() -> None:
    words = [len(r.prompt.split()) - 2 for r in generate(SPEC)]  # minus the "Request N:" prefix
    assert min(words) >= 1 and max(words) <= SPEC.prompt_words_max
    assert len(set(words)) > 10


def test_sampling_params_fix_the_length_with_ignore_eos() -> None:
    request = generate(SPEC)[0]
    params = request.sampling_params()
    assert params["max_tokens"] == params["min_tokens"] == request.max_tokens
    assert params["ignore_eos"] is True and params["temperature"] == 0.0
    assert "detokenize" not in params
    assert request.sampling_params(detokenize=False)["detokenize"] is False


def test_sweep_point_fixes_the_long_length() -> None:
    point = SPEC.with_long(512)
    assert {r.max_tokens for r in generate(point) if r.kind == "long"} == {512}


def test_bad_ranges_are_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match=r"min \(9\) is more than max \(3\)"):
        TokenRange(min=9, max=3)
    with pytest.raises(ValidationError, match="long_fraction"):
        SPEC.model_validate({**SPEC.model_dump(), "long_fraction": 1.5})


def test_unknown_profile_names_the_choices() -> None:
    choices = "cpu, gpu, gpu-15min, scale, smoke"
    with pytest.raises(ValueError, match=f"unknown benchmark profile 'tpu'; choose one of: {choices}"):
        get_profile("tpu")


def test_a_profile_whose_requests_cannot_fit_the_context_is_refused() -> None:
    data = PROFILES["cpu"].model_dump()
    data["sweep_long_tokens"] = [4000]
    with pytest.raises(ValidationError, match=r"exceeds engine.max_model_len \(2048\)"):
        type(PROFILES["cpu"]).model_validate(data)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_mode_gets_the_same_engine_arguments(name: str, tmp_path: Path) -> None:
    profile = PROFILES[name]
    config = profile.job_config("/models/m", tmp_path)
    kwargs = engine_kwargs(config, "/models/m")
    job = job_engine_kwargs(config)
    # The engine modes add only the model and per-request stats (which the job's async engine has on).
    assert {k: v for k, v in kwargs.items() if k not in ("model", "disable_log_stats")} == job
    assert kwargs["disable_log_stats"] is False
    assert kwargs["max_num_seqs"] == profile.engine.max_num_seqs
    assert profile.chunk_size == profile.engine.max_num_seqs


def test_gpu_profile_runs_a_real_architecture_with_dummy_weights(tmp_path: Path) -> None:
    profile = get_profile("gpu")
    config = profile.job_config("/models/m", tmp_path)
    assert config.device == "gpu" and config.model.load_format == "dummy"
    kwargs = engine_kwargs(config, "/models/m")
    assert kwargs["load_format"] == "dummy"
    assert kwargs["gpu_memory_utilization"] == 0.90
    assert kwargs["enforce_eager"] is False  # CUDA graphs on: the GPU's real speed
    # Dummy weights with the tiny tokenizer: generated ids exceed its vocabulary, so no detokenizing.
    assert all(
        r.sampling_params(profile.workload.detokenize).get("detokenize") is False
        for r in generate(profile.workload.model_copy(update={"num_requests": 5}))
    )
    assert profile.workload.short_tokens.min <= 50 <= profile.workload.short_tokens.max
    assert profile.workload.long_tokens == TokenRange(min=100, max=2000)


def test_vllm_parses_every_profiles_engine_arguments(tmp_path: Path) -> None:
    """vLLM's own EngineArgs takes each profile's arguments (a misspelt or removed argument fails here)."""
    vllm = pytest.importorskip("vllm")
    for profile in PROFILES.values():
        kwargs = engine_kwargs(profile.job_config("/models/m", tmp_path), "/models/m")
        args = vllm.EngineArgs(**kwargs)
        assert args.max_num_seqs == profile.engine.max_num_seqs
        assert args.disable_log_stats is False


def test_shape_model_folder_has_the_architecture_and_a_tokenizer(tmp_path: Path) -> None:
    folder = materialise_model(get_profile("gpu").model, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config == LLAMA_3_1_8B_SHAPE
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert not list(folder.glob("*.safetensors"))  # nothing to download or load: dummy weights


def test_prompt_token_bound_holds_for_the_tiny_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(materialise_model(get_profile("cpu").model, tmp_path))
    for request in generate(SPEC.model_copy(update={"num_requests": 50})):
        words = len(request.prompt.split())
        assert len(tokenizer(request.prompt)["input_ids"]) <= words * TOKENS_PER_WORD_BOUND + 16


def test_cli_overrides_are_revalidated() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    profile = profile_from_args(parser.parse_args(["--out", "x", "--requests", "12", "--sweep", "64,128"]))
    assert profile.workload.num_requests == 12 and profile.sweep_long_tokens == [64, 128]
    assert [label for label, _ in profile.points()] == ["bimodal", "long=64", "long=128"]
    assert profile_from_args(parser.parse_args(["--out", "x", "--sweep", ""])).sweep_long_tokens == []
    with pytest.raises(ValidationError, match="max_model_len"):
        profile_from_args(parser.parse_args(["--out", "x", "--sweep", "9000"]))
    with pytest.raises(SystemExit, match="comma-separated"):
        profile_from_args(parser.parse_args(["--out", "x", "--sweep", "long"]))


def test_worker_task_round_trips_through_json(tmp_path: Path) -> None:
    profile = get_profile("gpu")
    task = WorkerTask(group="job", profile=profile, model_path="/m", run_dir=str(tmp_path), points=profile.points())
    again = WorkerTask.model_validate_json(task.model_dump_json())
    assert again == task
    assert [generate(spec) for _, spec in again.points] == [generate(spec) for _, spec in task.points]


def test_set_overrides_any_profile_field_for_tuning() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--out", "x", "--set", "engine.max_num_seqs=64", "--set", "job.batch_size=16", "--set", "sync_chunk=16"]
    )
    profile = profile_from_args(args)
    assert profile.engine.max_num_seqs == 64 and profile.job.batch_size == 16 and profile.chunk_size == 16
    for bad, message in (
        ("engine.max_num_seq=64", "the profile has no field 'engine.max_num_seq'"),
        ("engine", "--set takes KEY=VALUE"),
        ("name.x=1", "'name' is not a section"),
    ):
        with pytest.raises(SystemExit, match=message):
            profile_from_args(parser.parse_args(["--out", "x", "--set", bad]))
    with pytest.raises(ValidationError, match="max_num_seqs"):
        profile_from_args(parser.parse_args(["--out", "x", "--set", "engine.max_num_seqs=0"]))
