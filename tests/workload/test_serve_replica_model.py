"""The endpoint's model on each replica's node: the app builder names the model and fetches nothing; the replica's
callback fetches it with the batch job's own code (workload.engine.model_source) and points its engine there.

Ray Serve LLM's real LLMConfig, engine config and downloader; the S3 source on a moto server. No Ray or engine is
started: the end-to-end check (an endpoint serving an s3:// model from moto) is tests/workload/test_serve_endpoint.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import boto3
import pytest

from workload.contract.config import ModelConfig
from workload.contract.serve_config import build_serve_config
from workload.engine import model_source
from workload.engine.model_source import ModelSourceError, check_model_source, resolve_model


@pytest.mark.parametrize(
    ("source", "label"),
    [
        ("s3://weights/models/qwen", "{cache}/s3/weights/models/qwen"),
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
    ],
)
def test_the_app_builder_passes_a_label_not_a_local_path(tmp_path: Path, source: str, label: str) -> None:
    from ray.serve.llm import LLMConfig

    from workload.serve.app import llm_config_fields

    cache = tmp_path / "head"
    config = build_serve_config({"model": {"source": source, "cache_dir": str(cache)}})
    fields = llm_config_fields(config)
    assert fields["model_loading_config"]["model_source"] == label.format(cache=cache)
    assert fields["callback_config"] == {
        "callback_class": "workload.serve.replica_model:FetchModelOnNode",
        "callback_kwargs": {"model_config": config.model.model_dump(mode="json")},
    }
    # Ray Serve LLM takes the label as what its engine loads and has no cloud mirror of its own to download from.
    engine = LLMConfig(**fields).get_engine_config()
    assert engine.actual_hf_model_id == label.format(cache=cache) and engine.mirror_config is None
    assert not cache.exists()  # nothing fetched where the app was built


@pytest.fixture
def s3_tiny(tmp_path: Path, moto_endpoint: str) -> str:
    built = Path(resolve_model(ModelConfig(cache_dir=str(tmp_path / "build"))))
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in sorted(p for p in built.iterdir() if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"tiny/{file.name}", Body=file.read_bytes())
    return f"s3://{bucket}/tiny"


@pytest.mark.parametrize("kind", ["embedded", "s3"])
def test_the_replica_fetches_the_model_on_its_node_and_its_engine_loads_that_folder(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """The callback as Ray Serve LLM runs it in the replica (`VLLMEngine.start`): `on_before_node_init`, then Ray's
    node initialisation on each node of the placement group (our per-node hook, then Ray's own downloader)."""
    from ray.llm._internal.common.utils.download_utils import NodeModelDownloadable, download_model_files
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.serve.llm import LLMConfig

    from workload.serve.app import llm_config_fields

    source = request.getfixturevalue("s3_tiny") if kind == "s3" else None
    node = tmp_path / "node"
    config = build_serve_config({"model": {"source": source, "cache_dir": str(node)}})
    fields = llm_config_fields(config)
    llm_config = LLMConfig(**fields)
    callback = load_class(fields["callback_config"]["callback_class"])(
        llm_config=llm_config, **fields["callback_config"]["callback_kwargs"]
    )
    asyncio.run(callback.run_callback("on_before_node_init"))
    engine = llm_config.get_engine_config()
    local = Path(engine.actual_hf_model_id)
    assert node in local.parents and (local / "config.json").is_file()
    assert str(local) == fields["model_loading_config"]["model_source"]  # the label was this node's folder
    if kind == "s3":
        assert (local / model_source.COMPLETE_MARKER).is_file()  # whole, fetched through the transfer manager
    # Each node of the replica's placement group: the hook finds the folder whole; Ray's downloader fetches nothing.
    fetched = download_model_files(
        model_id=engine.actual_hf_model_id,
        mirror_config=engine.mirror_config,
        download_model=NodeModelDownloadable.MODEL_AND_TOKENIZER,
        callback=callback,
    )
    assert fetched == str(local)
    if kind == "s3":
        assert [p.name for p in local.parent.iterdir()] == [local.name]  # no second copy, nothing half-made


def test_a_bad_source_fails_the_replica_naming_the_source(tmp_path: Path, s3_tiny: str) -> None:
    from ray.serve.llm import LLMConfig

    from workload.serve.app import llm_config_fields
    from workload.serve.replica_model import FetchModelOnNode

    missing = s3_tiny.rsplit("/", 1)[0] + "/nothing"
    config = build_serve_config({"model": {"source": missing, "cache_dir": str(tmp_path)}})
    fields = llm_config_fields(config)
    callback = FetchModelOnNode(llm_config=LLMConfig(**fields), **fields["callback_config"]["callback_kwargs"])
    with pytest.raises(Exception, match=re.escape(f"model.source {missing}: no files under that prefix")):
        asyncio.run(callback.run_callback("on_before_node_init"))


def test_the_local_endpoint_checks_the_source_without_fetching_it(tmp_path: Path, s3_tiny: str) -> None:
    cache = tmp_path / "cache"
    check_model_source(ModelConfig(source=s3_tiny, cache_dir=str(cache)))
    check_model_source(ModelConfig(source="Qwen/Qwen3-0.6B", cache_dir=str(cache)))
    assert not cache.exists()
    boto3.client("s3").put_object(Bucket=s3_tiny.split("/")[2], Key="notes/readme.txt", Body=b"x")
    with pytest.raises(ModelSourceError, match=r"no config\.json under that prefix"):
        check_model_source(ModelConfig(source=s3_tiny.rsplit("/", 1)[0] + "/notes", cache_dir=str(cache)))
    with pytest.raises(ModelSourceError, match="no such local folder"):
        check_model_source(ModelConfig(source=str(tmp_path / "nope"), cache_dir=str(cache)))
    with pytest.raises(ModelSourceError, match=r"has no config\.json"):
        check_model_source(ModelConfig(source=str(tmp_path), cache_dir=str(cache)))
