"""LoRA adapters (issue 57) without an engine: the config and its refusals, vLLM's LoRA engine settings, the tiny
adapter's PEFT files, fetching an adapter (local folder, and an s3:// prefix on a moto server), the OpenAI reader's
routing and `model_not_found`, engine-plan's sizing, and GET /v1/models through the official client. The lines run
on an adapter by the real engine, judged against `vllm run-batch --lora-modules`, are in
tests/workload/test_openai_batch_e2e.py (one engine start shared with the chat test)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from openai.types import Model
from safetensors.numpy import load_file

from tests.workload.served_app import ServedApp
from workload.batch_api.app import build_app
from workload.batch_api.executor import LocalJobExecutor
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore
from workload.contract.adapter_config import lora_bytes, lora_engine_kwargs, served_names, slot_rank
from workload.contract.config import ConfigError, ModelConfig, build_config
from workload.contract.engine_sizing import plan_engine, read_model_config
from workload.contract.model_shape import ModelShape
from workload.contract.serve_config import build_serve_config
from workload.engine.adapters import AdapterRoutes, adapter_folders, check_adapters
from workload.engine.model_source import ModelSourceError
from workload.engine.pipeline import engine_kwargs
from workload.engine.tiny_adapter import TARGET_MODULES, ensure_tiny_adapter
from workload.engine.tiny_model import LAYERS
from workload.engine.tiny_vlm import TINY_VLM_VERSION
from workload.files.openai_batch import (
    ADAPTER_COLUMN,
    CHAT_URL,
    EMBEDDINGS_URL,
    OPENAI_COLUMN,
    OpenAIDialect,
    RequestRefused,
    adapter_of,
    to_row,
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "data" / "model_configs"


def _config(adapters: dict[str, Any], **model: Any) -> Any:
    return build_config({"input": {"uri": "/in"}, "output": {"uri": "/out"}, "model": {"adapters": adapters, **model}})


def test_adapters_are_named_and_ranked_and_never_shadow_the_model() -> None:
    config = _config({"support": {"source": "/a", "rank": 8}, "legal": {"source": "s3://b/legal", "rank": 64}})
    assert config.model.adapter_names() == {"support", "legal"}
    assert served_names(config.model) == ("llm-batch", "legal", "support")
    with pytest.raises(ConfigError, match="adapter name 'gpt-4o-mini' is also the model's name or an alias"):
        _config({"gpt-4o-mini": {"source": "/a", "rank": 8}}, aliases=["gpt-4o-mini"])
    with pytest.raises(ConfigError, match="adapter name 'a b' must be"):
        _config({"a b": {"source": "/a", "rank": 8}})
    with pytest.raises(ConfigError, match=r"model.adapters.x.rank"):
        _config({"x": {"source": "/a", "rank": 1024}})
    with pytest.raises(ConfigError, match="an adapter's source is empty"):
        _config({"x": {"source": " ", "rank": 8}})
    with pytest.raises(ConfigError, match=r"model.adapters.x.rnak"):
        _config({"x": {"source": "/a", "rnak": 8}})


def test_adapters_change_the_output_hash_and_no_adapters_keep_it() -> None:
    plain = build_config({"input": {"uri": "/in"}, "output": {"uri": "/out"}})
    assert _config({}).output_hash() == plain.output_hash()  # an output begun before adapters still resumes
    assert _config({"a": {"source": "/a", "rank": 8}}).output_hash() != plain.output_hash()


def test_engine_settings_give_one_slot_per_adapter_and_a_spare_on_the_cpu() -> None:
    adapters = {"a": {"source": "/a", "rank": 4}, "b": {"source": "/b", "rank": 16}}
    cpu = engine_kwargs(_config(adapters))
    assert (cpu["enable_lora"], cpu["max_loras"], cpu["max_cpu_loras"], cpu["max_lora_rank"]) == (True, 3, 3, 16)
    gpu = lora_engine_kwargs(_config(adapters).model.adapters, "gpu")
    assert gpu["max_loras"] == 2
    assert "enable_lora" not in engine_kwargs(_config({}))
    assert [slot_rank([r]) for r in (1, 2, 8, 9, 300, 320, 500)] == [1, 8, 8, 16, 320, 320, 512]


def test_the_tiny_adapter_is_in_pefts_format_with_a_nonzero_b(tmp_path: Path) -> None:
    folder = ensure_tiny_adapter(tmp_path, rank=8)
    assert ensure_tiny_adapter(tmp_path, rank=8) == folder  # written once
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["target_modules"]) == ("LORA", 8, list(TARGET_MODULES))
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == LAYERS * len(TARGET_MODULES) * 2
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert a.shape[0] == 8 and b.shape[1] == 8 and np.abs(b).sum() > 0


def test_the_tiny_vlms_adapter_targets_its_language_model(tmp_path: Path) -> None:
    """The adapter test_job_images serves on the tiny VLM: PEFT's names for transformers' Idefics3, whose Llama sits
    under model.text_model (vLLM's Idefics3 puts its LoRA layers there); a folder of its own beside the text one."""
    folder = ensure_tiny_adapter(tmp_path, rank=8, base=TINY_VLM_VERSION)
    assert folder != ensure_tiny_adapter(tmp_path, rank=8)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == TINY_VLM_VERSION
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == LAYERS * len(TARGET_MODULES) * 2
    assert all(name.startswith("base_model.model.model.text_model.layers.") for name in tensors)
    model = ModelConfig(cache_dir=str(tmp_path / "cache"), adapters={"a": {"source": str(folder), "rank": 8}})
    assert adapter_folders(model) == {"a": str(folder.resolve())}  # its weights read and their ranks checked
    with pytest.raises(ValueError, match="no tiny adapter recipe"):
        ensure_tiny_adapter(tmp_path, base="tiny-gpt-v0")


def test_an_adapter_folder_is_checked_by_file_and_rank(tmp_path: Path) -> None:
    folder = ensure_tiny_adapter(tmp_path / "adapters", rank=8)
    model = ModelConfig(cache_dir=str(tmp_path / "cache"), adapters={"a": {"source": str(folder), "rank": 8}})
    assert adapter_folders(model) == {"a": str(folder.resolve())}
    check_adapters(model)
    wrong = ModelConfig(adapters={"a": {"source": str(folder), "rank": 16}})
    with pytest.raises(ModelSourceError, match=r"adapter_config.json says rank \(r\) 8, the config says 16"):
        adapter_folders(wrong)
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
    (torn / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelSourceError, match=r"adapter_model\.safetensors cannot be read"):
        adapter_folders(ModelConfig(adapters={"t": {"source": str(torn), "rank": 8}}))
    (torn / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelSourceError, match=r"no adapter_model\.safetensors \(PEFT's weights file\)"):
        adapter_folders(ModelConfig(adapters={"t": {"source": str(torn), "rank": 8}}))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match=r"model\.adapters\.b\.source .*empty: the folder has no adapter_config"):
        check_adapters(ModelConfig(adapters={"b": {"source": str(empty), "rank": 8}}))
    with pytest.raises(ModelSourceError, match=r"model\.adapters\.c\.source /nowhere: no such local folder"):
        adapter_folders(ModelConfig(adapters={"c": {"source": "/nowhere", "rank": 8}}))


def test_an_s3_adapter_is_fetched_into_the_node_cache(tmp_path: Path, moto_endpoint: str) -> None:
    folder = ensure_tiny_adapter(tmp_path / "adapters", rank=8)
    bucket = f"adapters-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in folder.iterdir():
        s3.put_object(Bucket=bucket, Key=f"lora/support/{file.name}", Body=file.read_bytes())
    s3.put_object(Bucket=bucket, Key="lora/nothing/README", Body=b"not an adapter")
    cache = tmp_path / "cache"
    model = ModelConfig(
        cache_dir=str(cache), adapters={"support": {"source": f"s3://{bucket}/lora/support", "rank": 8}}
    )
    check_adapters(model)  # one LIST, nothing downloaded
    assert not cache.exists() or not any(cache.rglob("adapter_model.safetensors"))
    local = Path(adapter_folders(model)["support"])
    assert cache in local.parents and (local / "adapter_model.safetensors").is_file()
    bad = ModelConfig(adapters={"n": {"source": f"s3://{bucket}/lora/nothing", "rank": 8}})
    with pytest.raises(ModelSourceError, match=r"adapters\.n\.source .*no adapter_config\.json under that prefix"):
        check_adapters(bad)


def test_the_engine_routes_a_row_by_its_adapter_column(tmp_path: Path) -> None:
    folder = str(ensure_tiny_adapter(tmp_path, rank=8))
    routes = AdapterRoutes({"support": folder, "legal": folder})
    assert routes.request_for({"id": "1"}) is None and routes.request_for({ADAPTER_COLUMN: None}) is None
    request = routes.request_for({ADAPTER_COLUMN: "support"})
    assert (request.lora_name, request.lora_int_id, request.lora_path) == ("support", 2, folder)
    with pytest.raises(ValueError, match="model 'other' is not an adapter of this engine"):
        routes.request_for({ADAPTER_COLUMN: "other"})


def _line(model: str, url: str = CHAT_URL) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    body.update({"input": "x"} if url == EMBEDDINGS_URL else {"messages": [{"role": "user", "content": "hi"}]})
    return {"custom_id": "c", "method": "POST", "url": url, "body": body}


def test_a_line_naming_an_adapter_runs_on_it_and_an_unknown_name_is_model_not_found() -> None:
    dialect = OpenAIDialect(CHAT_URL, frozenset({"llm-batch", "gpt-4o-mini"}), adapters=frozenset({"support"}))
    row = to_row(_line("support"), dialect)
    assert adapter_of(row) == "support" and json.loads(row[OPENAI_COLUMN])["model"] == "support"
    assert adapter_of(to_row(_line("gpt-4o-mini"), dialect)) is None
    with pytest.raises(RequestRefused) as refused:
        to_row(_line("legal"), dialect)
    assert refused.value.error_type == "model_not_found" and refused.value.param == "model"
    assert "(served: gpt-4o-mini, llm-batch, support)" in refused.value.message
    embeddings = OpenAIDialect(EMBEDDINGS_URL, frozenset({"llm-batch"}), adapters=frozenset({"support"}))
    with pytest.raises(RequestRefused, match="'support' is a LoRA adapter: adapters answer generation only"):
        to_row(_line("support", EMBEDDINGS_URL), embeddings)


def test_engine_plan_sizes_the_adapters_memory() -> None:
    """Llama 3.1 8B, 4 slots of rank 16: 32 layers x (qkv, o, gate_up, down) A and B in bf16, about 0.31 GiB,
    which comes out of the KV cache (about 2,600 tokens of 128 KiB)."""
    llama = ModelShape.from_config(read_model_config(MODELS / "llama-3.1-8b-instruct"), "llama")
    assert lora_bytes(llama, 1, 16) == 32 * 2 * 16 * (3 * 4096 + 128 * 48 + 8192 + 2 * 4096 + 2 * 14336 + 18432)
    plain, served = plan_engine(llama, "a10g"), plan_engine(llama, "a10g", lora=(4, 16))
    assert served.lora_gib == pytest.approx(0.31, abs=0.01) and plain.lora_gib == 0
    assert 2_000 <= plain.kv_cache_tokens - served.kv_cache_tokens <= 3_000


def test_engine_plan_cli_takes_adapters() -> None:
    model = str(MODELS / "llama-3.1-8b-instruct")
    command = [sys.executable, "-m", "workload", "engine-plan", "--model", model, "--gpu", "a10g"]
    done = subprocess.run([*command, "--adapters", "4", "--adapter-rank", "12"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lora_gib"] == pytest.approx(0.31, abs=0.01)  # rank 12 sits in a rank-16 slot
    bad = subprocess.run([*command, "--adapters", "2", "--adapter-rank", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--adapter-rank 1 to 512" in bad.stderr


def test_models_list_names_the_model_aliases_and_adapters(tmp_path: Path) -> None:
    """The official client's `models.list()` over GET /v1/models, each entry parsed as its `Model`."""
    store = LocalStore(tmp_path / "data")
    served = ("llm-batch", "gpt-4o-mini", "support")
    service = BatchService(store, LocalJobExecutor({}, tmp_path / "runs"), "llm-batch", served_models=served)
    app = ServedApp(build_app(service, None, "project"))  # type: ignore[arg-type]
    try:
        listed = list(app.client("unused").models.list())
    finally:
        app.stop()
        store.close()
    assert [model.id for model in listed] == list(served)
    assert all(isinstance(model, Model) and model.owned_by == "llm-batch" for model in listed)


def test_the_online_endpoint_refuses_adapters_rather_than_ignore_them() -> None:
    with pytest.raises(ConfigError, match=r"model\.adapters: the online endpoint serves the base model only"):
        build_serve_config({"model": {"adapters": {"a": {"source": "/a", "rank": 8}}}})
