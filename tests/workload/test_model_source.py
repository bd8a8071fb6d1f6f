"""Where the model comes from: the embedded tiny model, a local folder, an s3:// prefix, a hub id offline."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest

from workload.config import ModelConfig
from workload.model_source import ModelSourceError, resolve_model


def test_embedded_model_is_built_once_with_4096_positions(tmp_path) -> None:
    first = resolve_model(ModelConfig(cache_dir=str(tmp_path)))
    config = json.loads((tmp_path / "tiny-llama-v1" / "config.json").read_text())
    assert config["max_position_embeddings"] >= 4096
    assert config["hidden_size"] // config["num_attention_heads"] in {32, 64}  # what vLLM's CPU attention takes
    built = (tmp_path / "tiny-llama-v1" / "config.json").stat().st_mtime_ns
    assert resolve_model(ModelConfig(cache_dir=str(tmp_path))) == first
    assert (tmp_path / "tiny-llama-v1" / "config.json").stat().st_mtime_ns == built  # cached, not rebuilt


def test_s3_prefix_is_copied_into_the_cache(tmp_path, moto_endpoint) -> None:
    source = resolve_model(ModelConfig(cache_dir=str(tmp_path / "build")))
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in sorted(p for p in Path(source).iterdir() if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"tiny/{file.name}", Body=file.read_bytes())
    local = resolve_model(ModelConfig(source=f"s3://{bucket}/tiny", cache_dir=str(tmp_path / "cache")))
    assert (tmp_path / "cache") in Path(local).parents
    assert json.loads((Path(local) / "config.json").read_text())["architectures"]


def test_hub_id_without_network_fails_fast_and_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="hub id") as caught:
        resolve_model(ModelConfig(source="meta-llama/Llama-3.1-8B-Instruct", cache_dir=str(tmp_path)))
    assert "local path or s3://" in str(caught.value)


def test_missing_local_folder_is_named(tmp_path) -> None:
    with pytest.raises(ModelSourceError, match="no such local folder"):
        resolve_model(ModelConfig(source=str(tmp_path / "nope"), cache_dir=str(tmp_path)))
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(ModelConfig(source=str(tmp_path), cache_dir=str(tmp_path)))
