"""Before deploy: the stack's model on the GPUs its run may launch, from the model's config.json (real models'
files in tests/workload/data/model_configs; a hub id found in a Hugging Face cache laid out as the hub client
writes it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra.ops.checks_engine_fit import cached_model_folder, check_engine_fit
from infra.ops.plan import _engine_fit
from infra.ops.stacks import offline_config
from infra.pricing.table import load_prices

MODELS = Path(__file__).resolve().parents[1] / "workload" / "data" / "model_configs"
PRICES = load_prices()


def test_a_model_that_fits_the_tiers_gpu_passes_with_its_settings() -> None:
    overrides = {"job.model_source": str(MODELS / "llama-3.1-8b-instruct"), "job.model_weights_gib": 15.0}
    fit = check_engine_fit(offline_config("large", overrides), PRICES)
    assert fit.ok and "g5.xlarge: 1 engine(s) x tp1, max_num_seqs 46" in fit.line
    assert "g5.2xlarge: 1 engine(s) x tp1" in fit.line  # Karpenter's other types are checked too


def test_a_stated_weight_size_below_the_models_own_is_refused() -> None:
    """Llama-3.1-8B's config.json counts 15.0 GiB of weights: a stack stating 8 would size its volume too small."""
    overrides = {"job.model_source": str(MODELS / "llama-3.1-8b-instruct"), "job.model_weights_gib": 8}
    fit = check_engine_fit(offline_config("medium", overrides), PRICES)
    assert not fit.ok and "job.model_weights_gib (8) is less than the 15.0 GiB of weights" in fit.line


def test_a_model_that_cannot_fit_fails_the_plan_naming_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    overrides = {"job.model_source": str(MODELS / "llama-3.1-70b-instruct")}
    fit = check_engine_fit(offline_config("small", overrides), PRICES)
    assert not fit.ok and "on g5.xlarge" in fit.line and "tensor parallel over 8 a10g GPUs" in fit.line
    assert _engine_fit("small", overrides) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_a_hub_id_is_read_from_the_hub_cache_and_an_s3_model_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "0e9e39f"
    snapshot.mkdir(parents=True)
    shutil.copy(MODELS / "llama-3.1-8b-instruct" / "config.json", snapshot / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert cached_model_folder("meta-llama/Llama-3.1-8B-Instruct") == snapshot
    assert cached_model_folder("meta-llama/Llama-3.1-70B-Instruct") is None
    s3 = check_engine_fit(offline_config("small", {"job.model_source": "s3://models/llama/"}), PRICES)
    assert s3.ok and "not checked" in s3.line
