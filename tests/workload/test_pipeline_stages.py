"""The pipeline's own pieces without starting Ray: engine arguments, and the chat-template stage on a real
tokenizer (the tiny model's, re-saved with a template and a BOS rule of a real model's kind)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from tests.workload.bad_text import STRICT_TEMPLATE
from workload.contract.config import ModelConfig, build_config
from workload.engine.pipeline import ApplyChatTemplate, engine_kwargs
from workload.engine.tiny_model import ensure_tiny_model

BASE = {"input": {"uri": "in.jsonl"}, "output": {"uri": "out"}}


def test_a_seed_on_the_cpu_turns_chunked_prefill_off() -> None:
    plain = engine_kwargs(build_config(BASE))
    assert plain["enable_chunked_prefill"] is True and "max_num_batched_tokens" not in plain
    seeded = engine_kwargs(build_config({**BASE, "sampling": {"seed": 7}, "engine": {"max_model_len": 1024}}))
    assert seeded["enable_chunked_prefill"] is False and seeded["max_num_batched_tokens"] == 1024
    # A row's own seed counts as much as the config's.
    assert engine_kwargs(build_config(BASE), seeded=True)["enable_chunked_prefill"] is False
    gpu = engine_kwargs(build_config({**BASE, "device": "gpu", "sampling": {"seed": 7}}))
    assert gpu["enable_chunked_prefill"] is True


@pytest.fixture(scope="module")
def strict_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tiny = ensure_tiny_model(tmp_path_factory.mktemp("models"))
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    # Like Llama's tokenizers: plain text gets a BOS when encoded.
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    tokenizer.chat_template = STRICT_TEMPLATE
    target = tmp_path_factory.mktemp("strict")
    tokenizer.save_pretrained(target)
    shutil.copy(tiny / "config.json", target / "config.json")  # a model folder, as model.source must name
    return target


def _stage(folder: Path) -> ApplyChatTemplate:
    """The stage as the pipeline builds it: it gets the model's config and finds the model itself."""
    return ApplyChatTemplate(ModelConfig(source=str(folder)).model_dump(mode="json"))


def _render(stage: ApplyChatTemplate, rows: list[dict]) -> list[dict]:
    table = pa.table(
        {
            "_pos": list(range(len(rows))),
            "prompt": [r.get("prompt") for r in rows],
            "messages_json": [json.dumps(r["messages"]) if "messages" in r else None for r in rows],
        }
    )
    return stage(table).to_pylist()


def test_template_failures_are_row_errors_and_chat_rows_get_one_bos(strict_model: Path) -> None:
    from transformers import AutoTokenizer

    stage = _stage(strict_model)
    out = _render(
        stage,
        [
            {"messages": [{"role": "user", "content": "hi"}]},
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
            {"prompt": "plain text"},
        ],
    )
    assert [o["_pos"] for o in out] == [0, 1, 2, 3]
    assert out[0]["__inference_error__"] == "" and out[3]["prompt"] == "plain text"
    assert out[1]["prompt"] is None and out[1]["__inference_error__"].startswith("chat_template: TemplateError")
    assert "Conversation roles must alternate" in out[1]["__inference_error__"]
    assert "System role not supported" in out[2]["__inference_error__"]

    # What Ray's tokenize stage does next (special tokens on): exactly one BOS.
    tokenizer = AutoTokenizer.from_pretrained(strict_model)
    ids = tokenizer(out[0]["prompt"]).input_ids
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


def test_a_model_without_a_chat_template_fails_chat_rows_only(tmp_path: Path, strict_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(strict_model)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    shutil.copy(strict_model / "config.json", tmp_path / "config.json")
    config = tmp_path / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    out = _render(_stage(tmp_path), [{"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "p"}])
    assert "chat_template" in out[0]["__inference_error__"] and out[0]["prompt"] is None
    assert out[1]["__inference_error__"] == "" and out[1]["prompt"] == "p"


def test_actors_may_reach_the_hub_only_for_a_hub_model() -> None:
    """Each actor fetches the model itself: a hub id needs the hub; a folder or s3:// copy is loaded offline."""
    from workload.engine.pipeline import engine_env

    assert engine_env(build_config(BASE))["HF_HUB_OFFLINE"] == "1"
    assert engine_env(build_config({**BASE, "model": {"source": "s3://b/models/x"}}))["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in engine_env(build_config({**BASE, "model": {"source": "org/model"}}))


def test_the_cpu_engine_runs_its_model_in_the_engine_core_process() -> None:
    """The CPU layout matches one GPU's (no separate worker process); a GPU engine keeps vLLM's own choice. The
    real run of this layout is every job test (e.g. test_job_e2e) and the benchmark."""
    from workload.engine.pipeline import CPU_ONE_PROCESS_ENGINE, engine_env

    assert CPU_ONE_PROCESS_ENGINE.items() <= engine_env(build_config({**BASE, "device": "cpu"})).items()
    assert not CPU_ONE_PROCESS_ENGINE.keys() & engine_env(build_config({**BASE, "device": "gpu"})).keys()


def test_a_row_rejected_by_validation_keeps_its_error_and_is_not_rendered(strict_model: Path) -> None:
    table = pa.table(
        {
            "_pos": [0, 1],
            "prompt": [None, None],
            "messages_json": [None, json.dumps([{"role": "user", "content": "hi"}])],
            "__inference_error__": ["rejected: line is not valid JSON", ""],
        }
    )
    out = _stage(strict_model)(table).to_pylist()
    assert out[0]["__inference_error__"] == "rejected: line is not valid JSON" and out[0]["prompt"] is None
    assert out[1]["__inference_error__"] == "" and "hi" in out[1]["prompt"]


def test_the_operators_before_the_engine_ask_the_cpu_stages_share() -> None:
    """The job's own operators in front of the engine, read from the logical plan Ray Data plans their tasks from
    (their `ray_remote_args`): each asks the CPU stages' `num_cpus`. Ray Data's default for a task that names none
    is a whole CPU: the repartition's did, and on a 2-CPU node beside the engine it starved the stages around it
    (docs/benchmark.md, "Against `vllm run-batch`"). The input is an empty dataset made from Ray Data's own plan
    classes, as its read functions make one, but without their look at the cluster (`ray.data.range` starts Ray:
    20 s)."""
    import ray.data
    from ray.data._internal.logical.interfaces import LogicalPlan
    from ray.data._internal.logical.operators import InputData
    from ray.data._internal.stats import DatasetStats
    from ray.data.context import DataContext

    from workload.engine.pipeline import engine_batches

    config = build_config({**BASE, "batch_size": 16, "stages": {"num_cpus": 0.25}})
    context = DataContext.get_current().copy()
    empty = ray.data.Dataset(
        LogicalPlan(InputData(input_data=[]), context), context, DatasetStats(metadata={}, parent=None)
    )
    dataset = engine_batches(empty, config, config.model.model_dump(mode="json"), chat_template=True)
    asks = {}
    operator = dataset._logical_plan.dag
    while operator.input_dependencies:
        asks[operator.name] = operator.ray_remote_args.get("num_cpus")
        (operator,) = operator.input_dependencies
    assert operator.name == "InputData" and not ray.is_initialized()
    assert asks == {
        "StreamingRepartition[num_rows_per_block=16,strict=False]": 0.25,
        "MapBatches(ApplyChatTemplate)": 0.25,
    }
