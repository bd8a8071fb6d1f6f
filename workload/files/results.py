"""Shaping engine output into result rows and error records, shard by shard."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from workload.files.embeddings import result_columns
from workload.files.rows import RowError

RESULT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("generated_text", pa.string()),
        ("num_input_tokens", pa.int64()),
        ("num_output_tokens", pa.int64()),
        # Of num_input_tokens, those vLLM's prefix cache held (issue 55); null where the engine kept no count.
        ("num_cached_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        # Every sample as JSON (index, text, num_tokens, finish_reason, logprobs) where the row asked for n > 1 or
        # logprobs, or a reasoning parser read a chat row (then `text` is the answer, beside `reasoning` and
        # `reasoning_tokens`); null otherwise. generated_text is always the first sample's text (its answer).
        ("choices", pa.string()),
    ]
)
JSON_TYPE = "json"  # the type of a pass-through column whose values share no Arrow type (kept as JSON text)
# Stages of ours mark the errors they record, so the driver can name their kind (`classify_inference_error`).
ENGINE_CRASH_PREFIX = "engine_crash: "  # the row killed the engine on its own (workload/engine/guard.py)
ENGINE_HANG_PREFIX = "engine_hang: "  # the row stalled the engine on its own (workload/engine/guard.py)
CHAT_TEMPLATE_PREFIX = "chat_template: "  # the model's chat template rejected the row's messages
# The image stage's error: "image: <error_type>: <message>" (workload/engine/image_stage.py).
IMAGE_ERROR_PREFIX = "image: "
ENGINE_RESTARTS_COLUMN = "engine_restarts"  # engine rebuilds a batch needed (on its first row; 0 on the others)
# When the answering engine actor took its first batch (Unix time, on every row): the job's time to first engine
# request, measured where the request happens rather than estimated at the driver from when answers arrive.
ENGINE_FIRST_REQUEST_COLUMN = "engine_first_request_at"
# vLLM's KV-cache tokens beside the plan's, as the answering engine logged them at start (a JSON object; "" where
# no GPU sized the engine), on every row so the column is always a string: the run summary keeps the distinct ones.
ENGINE_CALIBRATION_COLUMN = "engine_calibration"


class EngineCrashLoopError(RuntimeError):
    """The engine kept dying and no row could be blamed (workload/engine/guard.py): the run fails, with the reason
    in _failed.json, rather than restarting the engine forever."""

    exit_code = 1  # the run failed; the command's input was fine (workload/contract/cli_errors.py reads this)


def finish_reason(num_input: int, num_output: int, max_tokens: int, max_model_len: int) -> str:
    # Ray Data LLM does not carry vLLM's finish_reason; both ways to hit a limit are "length", as in vLLM.
    if num_output >= max_tokens or num_input + num_output >= max_model_len:
        return "length"
    return "stop"


def classify_inference_error(message: str) -> tuple[str, str]:
    """(error_type, message) of an error the pipeline recorded for a row."""
    if message.startswith(ENGINE_CRASH_PREFIX):
        return "engine_crash", message.removeprefix(ENGINE_CRASH_PREFIX)
    if message.startswith(ENGINE_HANG_PREFIX):
        return "engine_hang", message.removeprefix(ENGINE_HANG_PREFIX)
    if message.startswith(CHAT_TEMPLATE_PREFIX):
        return "chat_template_error", message.removeprefix(CHAT_TEMPLATE_PREFIX)
    if message.startswith(IMAGE_ERROR_PREFIX):
        kind, _, text = message.removeprefix(IMAGE_ERROR_PREFIX).partition(": ")
        return kind, text
    # vLLM's wording has changed between releases; both forms name the context limit.
    if "maximum context length" in message or "maximum model length" in message:
        return "prompt_too_long", message
    if message.startswith("VLLMValidationError: "):  # vLLM refused the request's parameters (e.g. `dimensions`)
        return "invalid_request", message.removeprefix("VLLMValidationError: ")
    return "inference_error", message


@dataclass
class ShardBuffer:
    """What one shard has received so far; complete when every valid row has come back from the engine."""

    shard: int
    expected: int  # the shard's input rows: every one comes back from the pipeline, answered or as an error
    errors: list[RowError] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    received: int = 0
    # What a result row holds: generated text, or (task embed) vectors, one per row or (an OpenAI input, whose
    # lines may carry several inputs) a list of them (workload/files/embeddings.py).
    layout: str = "generate"  # generate | embed | embed_several

    @property
    def complete(self) -> bool:
        return self.received >= self.expected

    def table(self, types: dict[str, pa.DataType | str]) -> pa.Table:
        """The shard's results in input order; `types`: one Arrow type per pass-through column, decided over the
        whole input (workload/job/input_stream.py's id pass), so every shard has one schema."""
        ordered = sorted(self.results, key=lambda r: r["_pos"])
        if self.layout == "generate":
            columns: dict[str, pa.Array] = {
                name: pa.array([r.get(name) for r in ordered], type=RESULT_SCHEMA.field(name).type)
                for name in RESULT_SCHEMA.names
            }
        else:
            columns = result_columns(ordered, several=self.layout == "embed_several")
        for column, kind in sorted(types.items()):
            values = [r["_passthrough"].get(column) for r in ordered]
            if kind == JSON_TYPE:
                columns[column] = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
            else:
                columns[column] = pa.array(values, type=kind)
        return pa.table(columns)

    def stats(self) -> dict[str, Any]:
        return {
            "rows_ok": len(self.results),
            "rows_failed": len(self.errors),
            "input_tokens": sum(r["num_input_tokens"] for r in self.results),
            "output_tokens": sum(r["num_output_tokens"] for r in self.results),
            "cached_tokens": sum(r.get("num_cached_tokens") or 0 for r in self.results),
            "reasoning_tokens": sum(r.get("_reasoning_tokens", 0) for r in self.results),
            "error_types": dict(Counter(e.error_type for e in self.errors)),
        }

    def error_records(self) -> list[dict[str, Any]]:
        return [e.as_record() for e in sorted(self.errors, key=lambda e: e.position)]
