"""vLLM's own request fields on OpenAI Batch lines (issue 55): every field the pinned vLLM's request models take on
chat, completions and embeddings is classified (workload/files/vllm_fields.py), answered fields reach a real
`vllm.SamplingParams` as vLLM's server would pass them, refused fields are the line's error naming the field and the
reason, and docs/job.md's table is the classification's. No engine: vLLM's pydantic models and its SamplingParams
are plain objects. The same lines through the real job and `vllm run-batch`: test_openai_batch_e2e.py."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from vllm import SamplingParams as VllmSamplingParams
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
from vllm.sampling_params import StructuredOutputsParams

from workload.contract.config import JSON_SAMPLING_FIELDS, SamplingParams
from workload.files import vllm_fields
from workload.files.openai_batch import (
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    OpenAIDialect,
    RequestRefused,
    to_row,
)
from workload.files.rows import Origin, Record, RowError, ValidRow, validate_record

ROOT = Path(__file__).resolve().parents[2]
URLS = {vllm_fields.CHAT: CHAT_URL, vllm_fields.COMPLETIONS: COMPLETIONS_URL, vllm_fields.EMBEDDINGS: EMBEDDINGS_URL}


def _models(endpoint: str) -> list[type[Any]]:
    """The pydantic models vLLM validates a line's body with on this endpoint (run_batch.BatchRequestInput and the
    server's completions route); embeddings is a union of several request shapes."""
    if endpoint == vllm_fields.CHAT:
        return [ChatCompletionRequest]
    if endpoint == vllm_fields.COMPLETIONS:
        return [CompletionRequest]
    union = typing.get_args(EmbeddingRequest)[0]  # Annotated[A | B | ..., validator]
    return list(typing.get_args(union))


def _vllm_fields(endpoint: str) -> dict[str, Any]:
    """Every field name of the endpoint's models with vLLM's default (the first model's, where several have it)."""
    fields: dict[str, Any] = {}
    for model in _models(endpoint):
        for name, info in model.model_fields.items():
            default = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
            fields.setdefault(name, default)
    return fields


@pytest.mark.parametrize("endpoint", vllm_fields.ENDPOINTS)
def test_every_field_vllm_takes_is_classified_and_no_other(endpoint: str) -> None:
    theirs, ours = set(_vllm_fields(endpoint)), set(vllm_fields.FIELDS[endpoint])
    assert theirs - ours == set(), f"vLLM's {endpoint} request takes fields nobody classified in vllm_fields.py"
    assert ours - theirs == set(), f"vllm_fields.py classifies {endpoint} fields vLLM no longer takes"


@pytest.mark.parametrize("endpoint", vllm_fields.ENDPOINTS)
def test_a_refused_fields_accepted_values_start_with_vllms_default(endpoint: str) -> None:
    defaults = _vllm_fields(endpoint)
    for name, verdict in vllm_fields.FIELDS[endpoint].items():
        if verdict.accepts:
            assert verdict.accepts[0] == defaults[name], (endpoint, name, defaults[name])


def test_structured_output_kinds_are_vllms() -> None:
    names = {f.name for f in dataclasses.fields(StructuredOutputsParams) if not f.name.startswith("_")}
    whitespace = {"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}
    assert names - whitespace == vllm_fields.STRUCTURED_KINDS


def _line(endpoint: str, **body: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "llm-batch"}
    base.update(
        {
            vllm_fields.CHAT: {"messages": [{"role": "user", "content": "Hi"}]},
            vllm_fields.COMPLETIONS: {"prompt": "Once"},
            vllm_fields.EMBEDDINGS: {"input": "Once"},
        }[endpoint]
    )
    return {"custom_id": "r1", "method": "POST", "url": URLS[endpoint], "body": {**base, **body}}


def _dialect(endpoint: str) -> OpenAIDialect:
    return OpenAIDialect(URLS[endpoint], frozenset({"llm-batch"}))


REFUSED = [
    (endpoint, name, verdict.why)
    for endpoint in vllm_fields.ENDPOINTS
    for name, verdict in sorted(vllm_fields.FIELDS[endpoint].items())
    if not verdict.answered
]


@pytest.mark.parametrize(("endpoint", "name", "why"), REFUSED)
def test_a_refused_field_is_the_lines_error_naming_it_and_why(endpoint: str, name: str, why: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        to_row(_line(endpoint, **{name: "asked"}), _dialect(endpoint))
    assert refused.value.param == name and why in refused.value.message


def test_a_refused_field_at_a_value_that_asks_nothing_passes() -> None:
    row = to_row(_line(vllm_fields.CHAT, stream=False, priority=0, echo=False, tool_choice="none"), _dialect("chat"))
    assert row["id"] == "r1"
    with pytest.raises(RequestRefused) as refused:  # True == 1, but a bool is not a priority
        to_row(_line(vllm_fields.CHAT, priority=True), _dialect("chat"))
    assert refused.value.param == "priority"
    assert to_row(_line(vllm_fields.EMBEDDINGS, embed_dtype="float32", endianness="little"), _dialect("embeddings"))


def _engine_params(row: dict[str, Any]) -> VllmSamplingParams:
    """The row's sampling as the engine stage builds vLLM's SamplingParams from it (Ray Data LLM's vLLM stage pops
    `structured_outputs` into StructuredOutputsParams and passes the rest as keyword arguments)."""
    record = Record(0, Origin("f", 0, 1), json.dumps(row).encode())
    valid = validate_record(record, SamplingParams())
    assert isinstance(valid, ValidRow), valid
    typed = SamplingParams.restore_types(valid.sampling)
    for name, restore in JSON_SAMPLING_FIELDS.items():
        typed[name] = restore(json.dumps(typed[name]) if isinstance(typed[name], dict) else typed[name])
    structured = typed.pop("structured_outputs")
    return VllmSamplingParams(
        **typed, structured_outputs=None if structured is None else StructuredOutputsParams(**structured)
    )


@pytest.mark.parametrize("endpoint", [vllm_fields.CHAT, vllm_fields.COMPLETIONS])
def test_vllms_sampling_fields_reach_vllms_sampling_params(endpoint: str) -> None:
    asked = {
        "top_k": 5,
        "min_p": 0.05,
        "min_tokens": 2,
        "repetition_penalty": 1.3,
        "ignore_eos": True,
        "stop_token_ids": [7, 9],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "structured_outputs": {"choice": ["yes", "no"]},
        "max_tokens": 8,
        "temperature": 0.7,  # vLLM turns top_k and min_p off for greedy sampling
    }
    params = _engine_params(to_row(_line(endpoint, **asked), _dialect(endpoint)))
    for name, value in asked.items():
        if name != "structured_outputs":
            assert getattr(params, name) == value, name
    assert params.structured_outputs is not None and params.structured_outputs.choice == ["yes", "no"]


def test_completions_take_response_format_as_chat_does() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    params = _engine_params(to_row(_line(vllm_fields.COMPLETIONS, **body), _dialect("completions")))
    assert params.structured_outputs is not None and params.structured_outputs.json == schema


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"structured_outputs": "regex"}, "structured_outputs", "must be an object"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one kind"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "is not one of"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
            "not both",
        ),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "tokenize"),
    ],
)
def test_a_bad_vllm_field_value_is_refused_naming_it(body: dict[str, Any], param: str, fragment: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        to_row(_line(vllm_fields.CHAT, **body), _dialect("chat"))
    assert refused.value.param == param and fragment in refused.value.message


def test_a_bad_sampling_value_names_the_field() -> None:
    record = Record(0, Origin("f", 0, 1), json.dumps(_line(vllm_fields.CHAT, min_p=3)).encode())
    error = validate_record(record, SamplingParams(), _dialect("chat"))
    assert isinstance(error, RowError) and error.error_type == "invalid_sampling_params"
    assert error.error_message.startswith("min_p:")


def test_docs_job_md_holds_the_classification_table() -> None:
    doc = (ROOT / "docs" / "job.md").read_text()
    assert vllm_fields.table() in doc, "docs/job.md's vLLM field table is stale: python -m workload.files.vllm_fields"
