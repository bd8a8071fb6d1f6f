"""The job config: defaults, overrides, and errors that name the field, all without Ray or vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workload.contract.config import ConfigError, JobConfig, build_config, load_config, render_config

BASE = {"input": {"uri": "in.jsonl"}, "output": {"uri": "out"}}


def test_minimal_config_gets_documented_defaults() -> None:
    config = build_config(BASE)
    assert config.device == "cpu"
    assert config.model.source is None
    assert config.sampling.max_tokens == 64
    assert config.metrics.sink == "none"  # the demo never calls AWS
    assert config.resume.mode == "resume"


def test_importing_the_config_loads_neither_ray_nor_vllm() -> None:
    # infra renders this model inside a Pulumi run, where the job's heavy dependencies must not load. A fresh
    # interpreter, since this one holds whatever the tests run before this one imported.
    probe = "import sys, workload.contract.config; print(sorted({'ray', 'vllm', 'torch'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stdout


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({**BASE, "engine": {"max_num_seqs": 0}}, "engine.max_num_seqs"),
        ({**BASE, "engine": {"max_num_seqs": "many"}}, "engine.max_num_seqs"),
        ({**BASE, "sampling": {"temperature": -1}}, "sampling.temperature"),
        ({**BASE, "sampling": {"max_tokens": 4, "min_tokens": 8}}, "sampling"),
        ({**BASE, "engien": {}}, "engien"),
        ({"output": {"uri": "out"}}, "input"),
        ({**BASE, "device": "tpu"}, "device"),
        ({**BASE, "replicas": 4, "max_replicas": 2}, "max_replicas"),
        ({**BASE, "engine": {"tensor_parallel_size": 2}}, "tensor_parallel_size"),
        ({**BASE, "input": {"uri": "  "}}, "input.uri"),
    ],
)
def test_bad_config_names_the_field(data: dict, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(data)
    assert named in str(caught.value)


def test_overrides_win_and_never_touch_the_callers_dict() -> None:
    data = {**BASE, "model": {"source": "from-file"}}
    config = build_config(data, {"model.source": "/models/x", "output.uri": "s3://b/p", "input.format": None})
    assert config.model.source == "/models/x"
    assert config.output.uri == "s3://b/p"
    assert data["model"]["source"] == "from-file"


def test_rendered_config_loads_back_equal(tmp_path) -> None:
    config = build_config({**BASE, "engine": {"extra": {"kv_cache_dtype": "fp8"}}, "device": "gpu"})
    path = tmp_path / "job.yaml"
    path.write_text(render_config(config))
    assert load_config(path) == config


def test_output_hash_tracks_what_changes_results_only() -> None:
    base = build_config(BASE)
    assert build_config({**BASE, "replicas": 3}).output_hash() == base.output_hash()
    assert build_config({**BASE, "batch_size": 7}).output_hash() == base.output_hash()
    assert build_config({**BASE, "sampling": {"max_tokens": 9}}).output_hash() != base.output_hash()
    assert build_config({**BASE, "model": {"source": "/m"}}).output_hash() != base.output_hash()


def test_config_file_problems_are_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listing)


def test_models_are_frozen() -> None:
    config = JobConfig.model_validate(BASE)
    with pytest.raises(ValueError):
        config.device = "gpu"  # type: ignore[misc]


def test_seeded_cpu_runs_refuse_engine_settings_that_chunk_prefills() -> None:
    seeded = {**BASE, "sampling": {"seed": 7}}
    with pytest.raises(ConfigError, match=r"enable_chunked_prefill.*Remove engine\.enable_chunked_prefill"):
        build_config({**seeded, "engine": {"enable_chunked_prefill": True}})
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(256\) is less than engine\.max_model_len"):
        build_config({**seeded, "engine": {"max_num_batched_tokens": 256}})
    build_config(seeded)  # left unset, the job chooses settings that work
    build_config({**seeded, "device": "gpu", "engine": {"enable_chunked_prefill": True}})  # the GPU is unaffected
    build_config({**BASE, "engine": {"enable_chunked_prefill": True}})  # no seed, no problem


@pytest.mark.parametrize(
    ("device", "setting", "separate"),
    [("gpu", None, True), ("cpu", None, False), ("cpu", True, True), ("gpu", False, False)],
)
def test_tokenizer_stages_follow_the_device_unless_set(device: str, setting: bool | None, separate: bool) -> None:
    """On a GPU the engine only decodes; on the CPU the engine tokenizes itself (two fewer actors on its cores)."""
    stages = {} if setting is None else {"tokenize_on_cpu": setting}
    config = build_config({**BASE, "device": device, "stages": stages})
    assert config.tokenizer_stages is separate
