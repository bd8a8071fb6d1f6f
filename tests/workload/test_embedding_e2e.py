"""Embedding jobs through the real job (Ray, Ray Data LLM, vLLM's pooling runner, the embedded model), judged by
clients nobody here wrote: every `/v1/embeddings` body parses as the official `openai` package's
CreateEmbeddingResponse, and vLLM's own batch runner (`vllm run_batch`) on the same input and model gives the same
custom_ids, statuses, vector sizes and usage, and vectors equal within VECTOR_TOLERANCE. The native format
(`task: embed`) runs with a poison row, is resumed, and refuses a task change and a model that cannot pool."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from openai.types import CreateEmbeddingResponse

from tests.workload.jobrun import ENGINE, run_job, write_config, write_jsonl
from workload.engine.tiny_model import TINY_MODEL_VERSION, ensure_tiny_model

pytestmark = pytest.mark.slow

# Largest difference per component between the job's vectors and vLLM run_batch's, for unit vectors of 64 float32
# components. The engines batch requests differently (the CPU kernels are not batch-invariant), so the float32 sums
# may round differently; a wrong pooler or a missed normalisation differs by orders of magnitude more.
VECTOR_TOLERANCE = 1e-4
VLLM_EXTENSIONS = {"id", "created"}  # vLLM's embedding body has these beyond OpenAI's object


def _embedding(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"model": "llm-batch", **body}}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _vectors(body: dict[str, Any]) -> list[np.ndarray]:
    """Each item's vector, decoding base64 the way the openai SDK does (openai/resources/embeddings.py)."""
    return [
        np.frombuffer(base64.b64decode(d["embedding"]), dtype="float32")
        if isinstance(d["embedding"], str)
        else np.asarray(d["embedding"], dtype=np.float32)
        for d in body["data"]
    ]


def _reference(model: Path, source: Path, target: Path) -> subprocess.Popen[str]:
    """vLLM's own batch runner, started beside the job (it needs only the model folder): the two engine starts
    overlap instead of adding up."""
    command = [sys.executable, "-m", "workload.serve.vllm_cli", "run-batch", "-i", str(source), "-o", str(target)]
    command += ["--model", str(model), "--served-model-name", "llm-batch", "--max-model-len", "512"]
    command += ["--enforce-eager", "--runner", "pooling", "--convert", "embed"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def test_embeddings_batch_in_openai_files_out_matching_vllms_own_runner(tmp_path: Path) -> None:
    served = [
        _embedding("one", input="Spot instances are reclaimed at night."),
        _embedding("alias-free", input=["first passage", "a second, longer passage about batches", "third"]),
        _embedding("b64", input="encode me as base64", encoding_format="base64"),
        _embedding("dims", input="short vector please", dimensions=8),  # the tiny model has no Matryoshka training
    ]
    ours_only = [
        _embedding("alias", input="Spot instances are reclaimed at night.", model="text-embedding-3-small"),
        _embedding("tokens", input=[[1, 2, 3]]),
        _embedding("wrong-model", input="x", model="gpt-5"),
        _embedding("one", input="repeated custom_id"),
        '{"custom_id": "torn", "body": {',
    ]
    models = tmp_path / "models"
    model = ensure_tiny_model(models)  # the job finds it cached; vLLM's runner loads the same folder
    assert model.name == TINY_MODEL_VERSION
    reference_in, reference_out = tmp_path / "reference.jsonl", tmp_path / "reference-out.jsonl"
    write_jsonl(reference_in, served)
    reference = _reference(model, reference_in, reference_out)
    try:
        source = tmp_path / "in" / "batch.jsonl"
        source.parent.mkdir()
        write_jsonl(source, served + ours_only)
        out = tmp_path / "out"
        config = write_config(
            tmp_path / "job.yaml",
            str(source.parent),
            str(out),
            models,
            model={"cache_dir": str(models), "aliases": ["text-embedding-3-small"]},
            engine=ENGINE,
        )
        code, log = run_job(["run", "--config", str(config)], timeout=420)
        assert code == 0, log
        _, stderr = reference.communicate(timeout=300)
    finally:
        if reference.poll() is None:
            reference.kill()
    assert reference.returncode == 0, stderr[-3000:]

    answers, errors = _lines(out / "output.jsonl"), _lines(out / "errors.jsonl")
    assert [a["custom_id"] for a in answers] == ["one", "alias-free", "b64", "alias"]  # input order
    bodies = {a["custom_id"]: a["response"]["body"] for a in answers}
    for custom_id, body in bodies.items():
        decoded = {
            **body,
            "data": [{**d, "embedding": v.tolist()} for d, v in zip(body["data"], _vectors(body), strict=True)],
        }
        parsed = CreateEmbeddingResponse.model_validate(decoded)
        assert parsed.model == "llm-batch" and parsed.object == "list", custom_id
        assert [d.index for d in parsed.data] == list(range(len(parsed.data))), custom_id
        assert parsed.usage.prompt_tokens == parsed.usage.total_tokens > 0, custom_id
    sizes = {len(v) for body in bodies.values() for v in _vectors(body)}
    assert sizes == {64}  # vectors of one model have one size
    assert isinstance(bodies["b64"]["data"][0]["embedding"], str)
    np.testing.assert_array_equal(_vectors(bodies["alias"])[0], _vectors(bodies["one"])[0])  # same text, same vector
    statuses = {e["custom_id"]: (e["response"] or {}).get("status_code") for e in errors}
    assert statuses == {"dims": 400, "tokens": 400, "wrong-model": 400, "one": 400, "torn": None}
    dims = next(e for e in errors if e["custom_id"] == "dims")["response"]["body"]["error"]
    assert dims["code"] == "invalid_request" and "dimensions" in dims["message"]

    theirs = {line["custom_id"]: line for line in _lines(reference_out)}
    assert set(theirs) == {line["custom_id"] for line in served}
    ours = {a["custom_id"]: a for a in answers} | {e["custom_id"]: e for e in errors if e["custom_id"] == "dims"}
    worst = 0.0
    for custom_id, reference_line in theirs.items():
        mine = ours[custom_id]
        assert mine["response"]["status_code"] == reference_line["response"]["status_code"], custom_id
        if reference_line["response"]["status_code"] != 200:
            continue
        body, reference_body = mine["response"]["body"], reference_line["response"]["body"]
        assert set(reference_body) - set(body) <= VLLM_EXTENSIONS and set(body) <= set(reference_body), custom_id
        assert body["usage"]["prompt_tokens"] == reference_body["usage"]["prompt_tokens"], custom_id
        mine_vectors, their_vectors = _vectors(body), _vectors(reference_body)
        assert [len(v) for v in mine_vectors] == [len(v) for v in their_vectors], custom_id
        for a, b in zip(mine_vectors, their_vectors, strict=True):
            worst = max(worst, float(np.abs(a - b).max()))
    print(f"largest difference from vllm run_batch's vectors: {worst:.2e}")
    assert worst <= VECTOR_TOLERANCE


def test_native_embed_task_with_a_poison_row_resumes_and_refuses_what_would_mix(tmp_path: Path) -> None:
    rows: list[Any] = [
        {"id": f"doc-{i}", "input": f"Document {i} about nightly batch jobs.", "lang": "en"} for i in range(9)
    ]
    rows[4] = {"id": "doc-4", "prompt": "A row may give its text as prompt too."}
    rows.insert(6, {"id": "poison", "input": "The engine dies on this row."})
    rows += [{"id": "chat", "messages": [{"role": "user", "content": "hi"}]}, {"id": "doc-0", "input": "again"}, "{"]
    source = write_jsonl(tmp_path / "docs.jsonl", rows)
    out, models = tmp_path / "out", tmp_path / "models"
    config = write_config(
        tmp_path / "job.yaml",
        str(source),
        str(out),
        models,
        task="embed",
        batch_size=2,
        engine={**ENGINE, "crash_retries": 0},  # the bisection alone finds the poison row
    )
    poison = {"LLM_BATCH_FAILPOINT": "engine_crash_on_row:poison"}
    code, log = run_job(["run", "--config", str(config)], env=poison, timeout=420)
    assert code == 0, log

    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "embed" and summary["rows_in"] == len(rows)
    assert summary["errors_by_type"] == {
        "engine_crash": 1,
        "invalid_input": 1,
        "duplicate_id": 1,
        "malformed_json": 1,
    }, summary
    assert summary["rows_ok"] == 9 and summary["engine_restarts"] >= 1
    table = pq.read_table(out / "results")
    assert table.schema.field("embedding").type.list_size == 64
    assert str(table.schema.field("embedding").type.value_type) == "float"  # float32
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(f"doc-{i}" for i in range(9))  # every row once
    matrix = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, 64)
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)  # vLLM normalises
    assert set(table.column("lang").to_pylist()) == {"en", None}  # pass-through columns kept
    errors = [
        json.loads(line) for path in sorted((out / "errors").glob("*.jsonl")) for line in path.read_text().splitlines()
    ]
    assert next(e for e in errors if e["id"] == "poison")["error_type"] == "engine_crash"

    # Resume: every shard is committed, so the rerun starts no engine and changes nothing.
    before = {p.name: p.read_bytes() for p in (out / "results").iterdir()}
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == 0, log
    assert {p.name: p.read_bytes() for p in (out / "results").iterdir()} == before

    # The same output with the task changed is refused: the task is part of the config hash.
    code, log = run_job(["run", "--config", str(config), "--task", "generate"], timeout=120)
    assert code == 3 and "task changed" in log, log

    # A model vLLM cannot pool is refused before any work: one line naming the model and the fix, no output.
    unpoolable = tmp_path / "not-a-pooler"
    unpoolable.mkdir()
    tiny_config = json.loads((models / TINY_MODEL_VERSION / "config.json").read_text())
    (unpoolable / "config.json").write_text(json.dumps({**tiny_config, "architectures": ["NoSuchArchForCausalLM"]}))
    other_out = tmp_path / "other-out"
    code, log = run_job(
        ["run", "--config", str(config), "--output", str(other_out), "--model", str(unpoolable)], timeout=120
    )
    lines = [line for line in log.splitlines() if "cannot embed" in line]
    assert code == 2 and len(lines) == 1, log
    assert str(unpoolable) in lines[0] and "task: generate" in lines[0]
    assert not (other_out / "_manifest.json").exists() and not (other_out / "results").exists()
