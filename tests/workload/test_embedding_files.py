"""Embedding jobs at module level (no engine): `/v1/embeddings` lines and native `task: embed` rows into the job's
rows, every refusal naming its parameter, vectors into Parquet as float32, and the output bodies judged by the
official `openai` package's CreateEmbeddingResponse. The same through the real job: test_embedding_e2e.py."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai.types import CreateEmbeddingResponse

from workload.contract.config import SamplingParams, build_config
from workload.files.embeddings import embedding_body, pack_vectors, unpack_vectors
from workload.files.openai_batch import (
    CHAT_URL,
    EMBED_KEY,
    EMBEDDINGS_URL,
    OPENAI_COLUMN,
    OpenAIDialect,
    RequestRefused,
    to_row,
)
from workload.files.results import ShardBuffer, classify_inference_error
from workload.files.rows import InputError, Origin, Record, RowError, ValidRow, validate_record
from workload.job.input_plan import input_task
from workload.job.openai_files import _error_line

EMBED = OpenAIDialect(EMBEDDINGS_URL, frozenset({"llm-batch", "text-embedding-3-small"}))


def _line(custom_id: str = "e1", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS_URL, "body": {"model": "llm-batch", **body}}


def _record(value: dict[str, Any], position: int = 0) -> Record:
    return Record(position, Origin("f", position, position + 1), json.dumps(value).encode())


def test_an_embeddings_line_carries_its_texts_dimensions_and_encoding() -> None:
    row = to_row(_line(input=["a", "b c"], dimensions=8, encoding_format="base64", user="u"), EMBED)
    assert row["id"] == "e1" and row[EMBED_KEY] == {"texts": ["a", "b c"], "dimensions": 8}
    assert json.loads(row[OPENAI_COLUMN]) == {
        "url": EMBEDDINGS_URL,
        "model": "llm-batch",
        "encoding_format": "base64",
        "user": "u",
    }
    one = validate_record(_record(_line(input="just one")), SamplingParams(), EMBED, task="embed")
    assert isinstance(one, ValidRow) and one.embed == {"texts": ["just one"], "dimensions": None}
    assert one.prompt == "just one" and set(one.passthrough) == {OPENAI_COLUMN}


@pytest.mark.parametrize(
    ("line", "param"),
    [
        (_line(input=[1, 2, 3]), "input"),  # token ids
        (_line(input=[]), "input"),
        (_line(input=["x", ""]), "input"),
        (_line(), "input"),
        (_line(input="x", encoding_format="int8"), "encoding_format"),
        (_line(input="x", dimensions=0), "dimensions"),
        (_line(input="x", dimensions="8"), "dimensions"),
        (_line(input="x", dimensions=True), "dimensions"),
        (_line(input="x", messages=[]), "messages"),
        (_line(input="x", model="gpt-5"), "model"),
    ],
)
def test_what_the_engine_cannot_embed_is_refused_naming_it(line: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        to_row(line, EMBED)
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("row", "kind"),
    [
        ({"id": "a", "input": "both", "prompt": "both"}, "ambiguous_prompt"),
        ({"id": "a", "messages": [{"role": "user", "content": "hi"}]}, "invalid_input"),
        ({"id": "a", "input": "x", "sampling_params": {"max_tokens": 3}}, "invalid_input"),
        ({"id": "a"}, "missing_prompt"),
        ({"id": "a", "input": "  "}, "missing_prompt"),
        ({"id": "a", "input": ["list"]}, "invalid_prompt"),
        ({"id": "a", "input": "x", "embedding": [1.0]}, "reserved_column"),
        ({"id": "a", "input": "x", EMBED_KEY: {"texts": ["smuggled"]}}, "reserved_column"),
    ],
)
def test_native_embed_rows_take_one_text(row: dict[str, Any], kind: str) -> None:
    result = validate_record(_record(row), SamplingParams(), None, task="embed")
    assert isinstance(result, RowError) and result.error_type == kind, result


def test_native_embed_rows_keep_their_other_columns() -> None:
    for key in ("input", "prompt"):
        row = validate_record(_record({"id": 7, key: "doc", "lang": "en"}), SamplingParams(), None, task="embed")
        assert isinstance(row, ValidRow) and row.id == "7" and row.embed == {"texts": ["doc"], "dimensions": None}
        assert row.passthrough == {"lang": "en"}
    # The same row under task generate: `input` is a pass-through column, and the row has nothing to answer.
    generated = validate_record(_record({"id": 7, "input": "doc"}), SamplingParams())
    assert isinstance(generated, RowError) and generated.error_type == "missing_prompt"


def test_the_input_decides_the_task_and_a_contradicting_config_is_refused() -> None:
    assert input_task("generate", EMBED, "in/") == "embed"
    assert input_task("embed", None, "in/") == "embed"
    assert input_task("generate", OpenAIDialect(CHAT_URL, frozenset()), "in/") == "generate"
    with pytest.raises(InputError, match="task is embed but the input is an OpenAI Batch file for /v1/chat"):
        input_task("embed", OpenAIDialect(CHAT_URL, frozenset()), "in/")


def test_the_task_is_in_the_config_hash_and_old_configs_keep_theirs() -> None:
    base = {"input": {"uri": "in.jsonl"}, "output": {"uri": "out"}}
    # Hashes of configs written before `task` existed (computed on the commit before it): outputs begun then resume.
    assert build_config(base).output_hash() == "2fd56e48393d1fe9"
    assert build_config(
        {**base, "sampling": {"n": 2}, "input": {"uri": "in.jsonl", "format": "openai"}}
    ).output_hash() == ("57d33ad373ecb5b2")
    embed = build_config({**base, "task": "embed"})
    assert embed.output_affecting()["task"] == "embed" and embed.output_hash() != build_config(base).output_hash()
    assert "task" not in build_config({**base, "task": "generate"}).output_affecting()


def _results(vectors: list[list[np.ndarray]]) -> list[dict[str, Any]]:
    return [
        {"_pos": i, "id": f"r{i}", "vectors": v, "num_input_tokens": 3 + i, "num_output_tokens": 0, "_passthrough": {}}
        for i, v in enumerate(vectors)
    ]


def _roundtrip(table: pa.Table) -> pa.Table:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return pq.read_table(io.BytesIO(sink.getvalue()))


def test_native_vectors_are_a_fixed_size_float32_column_that_survives_parquet() -> None:
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(64).astype(np.float32) for _ in range(3)]
    buffer = ShardBuffer(0, 3, layout="embed", results=_results([[v] for v in vectors]))
    table = _roundtrip(buffer.table({}))
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 64)
    matrix = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, 64)
    np.testing.assert_array_equal(matrix, np.stack(vectors))  # float32 in, the same float32 out
    assert table.column("num_input_tokens").to_pylist() == [3, 4, 5]
    mixed = ShardBuffer(0, 2, layout="embed", results=_results([[vectors[0]], [vectors[1][:8]]]))
    with pytest.raises(ValueError, match="size 8 beside ones of size 64"):
        mixed.table({})


def test_an_openai_lines_vectors_are_a_list_each() -> None:
    lines = [[np.ones(4, np.float32), np.zeros(4, np.float32)], [np.full(2, 0.5, np.float32)]]
    table = _roundtrip(ShardBuffer(0, 2, layout="embed_several", results=_results(lines)).table({}))
    assert table.schema.field("embeddings").type == pa.list_(pa.list_(pa.float32()))
    assert table.column("embeddings").to_pylist() == [[[1.0] * 4, [0.0] * 4], [[0.5, 0.5]]]


def test_vectors_cross_from_the_engine_as_float32_bytes() -> None:
    vectors = [np.array([0.1, -2.5], np.float32), np.array([3.25], np.float32)]
    back = unpack_vectors(pack_vectors(vectors), json.dumps([2, 1]))
    assert [v.tolist() for v in back] == [v.tolist() for v in vectors]
    with pytest.raises(ValueError, match="3 floats for vectors of sizes"):
        unpack_vectors(pack_vectors(vectors), json.dumps([2, 2]))


def _sdk_decoded(body: dict[str, Any]) -> dict[str, Any]:
    """What the openai SDK does to a base64 body before its type sees it (openai/resources/embeddings.py)."""
    data = [
        {**item, "embedding": np.frombuffer(base64.b64decode(item["embedding"]), dtype="float32").tolist()}
        if isinstance(item["embedding"], str)
        else item
        for item in body["data"]
    ]
    return {**body, "data": data}


def test_bodies_parse_as_the_sdks_create_embedding_response_in_both_encodings() -> None:
    vectors = [[0.25, -0.5, 0.125], [1.0, 0.0, -1.0]]
    row = {"id": "e1", "embeddings": vectors, "num_input_tokens": 9}
    plain = embedding_body(row, {"url": EMBEDDINGS_URL, "encoding_format": "float"}, "llm-batch")
    parsed = CreateEmbeddingResponse.model_validate(plain)
    assert [d.index for d in parsed.data] == [0, 1] and [d.embedding for d in parsed.data] == vectors
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 9 and parsed.model == "llm-batch"
    packed = embedding_body(row, {"url": EMBEDDINGS_URL, "encoding_format": "base64"}, "llm-batch")
    assert all(isinstance(d["embedding"], str) for d in packed["data"])
    assert [d.embedding for d in CreateEmbeddingResponse.model_validate(_sdk_decoded(packed)).data] == vectors


def test_dimensions_vllm_refuses_are_the_lines_400() -> None:
    message = "VLLMValidationError: Model 'm' does not support Matryoshka embeddings; dimensions must be unset"
    kind, text = classify_inference_error(message)
    assert kind == "invalid_request" and "dimensions" in text
    record = {
        "id": "d",
        "input_file": "f",
        "input_row": 0,
        "input_line": 1,
        "raw_input": "",
        "raw_input_encoding": "utf-8",
    }
    line = _error_line({**record, "error_type": kind, "error_message": text})
    assert line["response"]["status_code"] == 400 and "Matryoshka" in line["response"]["body"]["error"]["message"]
