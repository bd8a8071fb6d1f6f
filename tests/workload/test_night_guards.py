"""Rows and configs that used to hang or end a night, at module level (no engine): every sampling field keeps its
type on the way to vLLM, parser failures and oversized records become error rows, and an output inside its input
is refused before any work. The same rows through the real job: test_engine_hang.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.contract.config import ConfigError, InputConfig, SamplingParams, build_config
from workload.contract.jsonl_lines import jsonl_records
from workload.files.rows import Origin, Record, RowError, iter_records, validate_record
from workload.job.input_plan import plan_input

# Scalar integer fields (a list of ints, stop_token_ids, comes back from numpy as a list of ints: tolist()).
INT_FIELDS = [
    name
    for name, field in SamplingParams.model_fields.items()
    if "int" in str(field.annotation) and "list" not in str(field.annotation)
]


def test_every_integer_sampling_field_set_in_some_rows_only_reaches_vllm_as_an_int() -> None:
    """Through Arrow and pandas, as Ray Data hands rows to the engine stage: an int column with nulls is floats."""
    assert set(INT_FIELDS) >= {"max_tokens", "min_tokens", "top_k", "seed"}
    defaults = SamplingParams().for_engine()
    rows = [{**defaults, "seed": None}] + [{**defaults, name: 3} for name in INT_FIELDS]
    column = pa.array(rows)
    frame = pa.table({"sampling_params": column}).to_pandas()
    for name in INT_FIELDS:
        # the reproduction: one row sets the field, the next leaves it null, and pandas makes it a float
        mixed = pa.table({"s": pa.array([{name: 3}, {name: None}])}).to_pandas()["s"][0][name]
        assert isinstance(mixed, float) or name != "seed", (name, mixed)
    for record in frame["sampling_params"]:
        typed = SamplingParams.restore_types(record)
        for name in INT_FIELDS:
            value = typed[name]
            assert value is None or type(value) is int, (name, value)
    floated = SamplingParams.restore_types(
        {"seed": np.float64(3.0), "max_tokens": 16.0, "stop": np.array(["x"]), "stop_token_ids": np.array([7])}
    )
    assert floated == {"seed": 3, "max_tokens": 16, "stop": ["x"], "stop_token_ids": [7]}
    assert type(floated["seed"]) is int and type(floated["stop_token_ids"][0]) is int
    assert SamplingParams.restore_types({"seed": math.nan}) == {"seed": None}
    with pytest.raises(TypeError, match=r"sampling_params\.max_tokens must be an integer"):
        SamplingParams.restore_types({"max_tokens": 16.5})


def _record(raw: bytes, position: int = 0) -> Record:
    return Record(position, Origin("file:///in.jsonl", position, position + 1), raw)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"id": "deep", "prompt": "x", "meta": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested deeper"),
        (b'{"id": ' + b"9" * 5000 + b', "prompt": "x"}', "cannot read"),
        (b'{"id": "big", "prompt": "x", "n": ' + b"1" * 5000 + b"}", "cannot read"),
    ],
    ids=["deep-nesting", "huge-int-id", "huge-int-passthrough"],
)
def test_parser_failures_are_malformed_json_rows(raw: bytes, why: str) -> None:
    result = validate_record(_record(raw), SamplingParams())
    assert isinstance(result, RowError) and result.error_type == "malformed_json", result
    assert why in result.error_message
    json.dumps(result.as_record())  # the error record itself is writable


def test_a_line_over_the_cap_is_one_error_row_and_never_held_whole(tmp_path: Path) -> None:
    big = b'{"id": "big", "prompt": "' + b"a" * 300_000 + b'"}'
    data = b'{"id": "a", "prompt": "x"}\n' + big + b'\n\n{"id": "c", "prompt": "y"}\n'
    chunked = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    records = list(jsonl_records(chunked, max_record_bytes=65536))
    assert [number for number, _ in records] == [1, 2, 4]  # the same positions as without a cap
    assert [n for n, _ in jsonl_records(chunked)] == [1, 2, 4]
    assert max(len(raw) for _, raw in records) < 2048  # the big line travels as a marker with its first bytes
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.jsonl").write_bytes(data)
    config = InputConfig(uri=str(tmp_path / "in"), max_record_bytes=65536)
    assert plan_input(config).rows_in is None  # the plan only lists; the id pass counts (issue 50)
    results = [validate_record(r, SamplingParams()) for r in iter_records(config)]
    assert len(results) == 3  # the big line is one row, the blank line none
    errors = [r for r in results if isinstance(r, RowError)]
    assert [(e.error_type, e.id) for e in errors] == [("record_too_large", None)]
    assert f"record of {len(big)} bytes is over input.max_record_bytes" in errors[0].error_message
    assert errors[0].raw_input.startswith('{"id": "big"')


def test_a_parquet_row_over_the_cap_is_a_record_too_large_row(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    table = pa.table({"id": ["a", "b"], "prompt": ["short", "p" * 200_000]})
    pq.write_table(table, tmp_path / "in" / "rows.parquet")
    config = InputConfig(uri=str(tmp_path / "in"), max_record_bytes=65536)
    kinds = [getattr(validate_record(r, SamplingParams()), "error_type", "ok") for r in iter_records(config)]
    assert kinds == ["ok", "record_too_large"]


@pytest.mark.parametrize(
    ("input_uri", "output_uri", "inside"),
    [
        ("{tmp}/in", "{tmp}/in/out", "output.uri"),
        ("{tmp}/in/rows.jsonl", "{tmp}/in", "input.uri"),
        ("{tmp}/in", "{tmp}/in/../in/", "output.uri"),
        ("s3://b/nights/2026-12-01/", "s3://b/nights/2026-12-01/out", "output.uri"),
        ("s3://b/nights//2026-12-01/in", "s3://b/nights/", "input.uri"),
    ],
)
def test_an_output_inside_its_input_or_the_reverse_is_refused(
    input_uri: str, output_uri: str, inside: str, tmp_path: Path
) -> None:
    overrides: dict[str, Any] = {
        "input.uri": input_uri.format(tmp=tmp_path),
        "output.uri": output_uri.format(tmp=tmp_path),
    }
    with pytest.raises(ConfigError, match=f"{inside} .* is inside"):
        build_config({}, overrides)


def test_folders_side_by_side_are_accepted(tmp_path: Path) -> None:
    build_config({}, {"input.uri": str(tmp_path / "in"), "output.uri": str(tmp_path / "input-out")})
    build_config({}, {"input.uri": "s3://b/input/2026-12-01/", "output.uri": "s3://b/output/2026-12-01/"})
