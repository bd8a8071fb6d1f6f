"""The job end to end with real Ray Data LLM and real vLLM on the tiny model: local files and S3, every kind of
bad row, the exact output columns. Each test starts one engine (about a minute on 2 cores)."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import run_job, write_config, write_jsonl

pytestmark = pytest.mark.slow

RESULT_COLUMNS = ["id", "generated_text", "num_input_tokens", "num_output_tokens", "finish_reason"]


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def _good_rows(count: int, prefix: str) -> list[dict]:
    rows: list[dict] = []
    for i in range(count):
        row: dict = {"id": f"{prefix}-{i:03d}", "lang": "en", "priority": i}
        if i % 2:
            row["messages"] = [{"role": "user", "content": f"Question {i}: why batch?"}]
        else:
            row["prompt"] = f"Prompt number {i} about spot instances"
        rows.append(row)
    return rows


def test_local_folder_of_jsonl_and_parquet_every_bad_row_recorded(tmp_path: Path, model_cache: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    bad = [
        '{"id": "broken", "prompt": ',
        '"just a string"',
        {"id": "empty", "prompt": ""},
        {"id": "typed", "prompt": ["a", "list"]},
        {"id": "bad-sp", "prompt": "x", "sampling_params": {"top_p": 7}},
        {"id": "too-long", "prompt": "word " * 2000},
        {"id": "a-000", "prompt": "duplicate of the first row"},
    ]
    exact = {"id": "exact", "prompt": "count", "sampling_params": {"max_tokens": 3, "ignore_eos": True}}
    write_jsonl(inputs / "a.jsonl", [*_good_rows(12, "a"), *bad, exact])
    with open(inputs / "a.jsonl", "ab") as handle:
        handle.write(b'{"id": "utf", "prompt": "caf\xe9"}\n')
    pq.write_table(pa.table({"id": ["p-0", "p-1"], "prompt": ["parquet one", "parquet two"]}), inputs / "b.parquet")
    out = tmp_path / "out"
    config = write_config(tmp_path / "job.yaml", str(inputs), str(out), model_cache)

    code, log = run_job(["run", "--config", str(config)])
    assert code == 0, log

    results = pq.read_table(out / "results")
    assert results.column_names == [*RESULT_COLUMNS, "lang", "priority"]
    errors = [json.loads(line) for f in sorted((out / "errors").glob("*.jsonl")) for line in f.read_text().splitlines()]
    ids = results.column("id").to_pylist() + [e["id"] for e in errors]
    expected = [f"a-{i:03d}" for i in range(12)] + ["p-0", "p-1", "exact", "empty", "typed", "bad-sp", "too-long"]
    expected += ["a-000", None, None, None]  # the duplicate, and three rows with no readable id
    assert sorted(ids, key=str) == sorted(expected, key=str)
    by_type = {e["error_type"] for e in errors}
    assert by_type == {
        "malformed_json",
        "not_an_object",
        "missing_prompt",
        "invalid_prompt",
        "invalid_sampling_params",
        "prompt_too_long",
        "duplicate_id",
        "invalid_utf8",
    }
    too_long = next(e for e in errors if e["id"] == "too-long")
    assert too_long["input_line"] == 18 and "maximum context length" in too_long["error_message"]

    rows = {r["id"]: r for r in results.to_pylist()}
    assert rows["exact"]["num_output_tokens"] == 3 and rows["exact"]["finish_reason"] == "length"
    assert all(0 < r["num_output_tokens"] <= 8 and r["num_input_tokens"] > 0 for r in rows.values())
    assert rows["a-003"]["lang"] == "en" and rows["a-003"]["priority"] == 3
    assert rows["p-1"]["lang"] is None

    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows_in"] == 23 and summary["rows_ok"] == 15 and summary["rows_failed"] == 8
    assert summary["output_tokens"] == sum(r["num_output_tokens"] for r in rows.values())
    assert summary["input_tokens"] == sum(r["num_input_tokens"] for r in rows.values())
    assert summary["attempts"] == 1 and summary["output_tok_per_s"] > 0
    for key in ("wall_s", "started_at", "finished_at", "model", "config_hash"):
        assert summary[key]
    assert "llm-batch: 15/23 rows answered" in log


def test_s3_in_and_out_through_a_real_s3_server(tmp_path: Path, model_cache: Path, moto_endpoint: str) -> None:
    bucket = f"data-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    rows = [*_good_rows(10, "s"), '{"id": "half']
    s3.put_object(Bucket=bucket, Key="input/2026-11-29/part-0.jsonl", Body="\n".join(map(json.dumps, rows[:-1])))
    s3.put_object(Bucket=bucket, Key="input/2026-11-29/part-1.jsonl", Body=rows[-1])
    config = write_config(tmp_path / "job.yaml", "unused", "unused", model_cache)

    code, log = run_job(
        [
            "run",
            "--config",
            str(config),
            "--input",
            f"s3://{bucket}/input/2026-11-29/",
            "--output",
            f"s3://{bucket}/output/2026-11-29",
        ]
    )
    assert code == 0, log

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="output/")["Contents"])
    result_keys = [k for k in keys if k.startswith("output/2026-11-29/results/")]
    assert result_keys and not [k for k in keys if "/_pending/" in k]
    tables = [pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=k)["Body"].read())) for k in result_keys]
    ids = sorted(i for t in tables for i in t.column("id").to_pylist())
    assert ids == [f"s-{i:03d}" for i in range(10)]
    summary = json.loads(s3.get_object(Bucket=bucket, Key="output/2026-11-29/summary.json")["Body"].read())
    assert summary["rows_in"] == 11 and summary["rows_ok"] == 10 and summary["errors_by_type"] == {"malformed_json": 1}
