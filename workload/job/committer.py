"""Rows coming back from the engine, routed to shard buffers, each shard committed the moment its last row arrives.

The committer is where "every row exactly once" is decided on the driver: a row redelivered by Ray (a lost node's
batch rerun) is dropped and counted, a row of a shard no longer pending belongs to a shard already committed, and
a shard is committed only once it has received as many rows as it holds.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from workload.contract.config import JobConfig
from workload.engine.choices import CACHED_COLUMN, CHOICES_COLUMN, FINISH_COLUMN
from workload.files.embeddings import SIZES_COLUMN, VECTORS_COLUMN, unpack_vectors
from workload.files.results import (
    ENGINE_CALIBRATION_COLUMN,
    ENGINE_FIRST_REQUEST_COLUMN,
    ENGINE_RESTARTS_COLUMN,
    ShardBuffer,
    classify_inference_error,
    finish_reason,
)
from workload.job.input_plan import REJECTED_PREFIX, passthrough_of, row_error
from workload.job.output import OutputStore, ShardCommit
from workload.telemetry.metrics import BatchReport, RunMetrics

NOTE_INTERVAL_S = 30.0  # how stale a killed attempt's recorded wall time may be, at most (one manifest write)


class ShardCommitter:
    """Routes the pipeline's output to shard buffers and commits each shard the moment its last row arrives.

    Every input row of a pending shard comes back exactly once (answered, failed in the engine, or rejected by
    the validation stage), so a shard is complete when it has received as many rows as it holds. Buffers exist
    only for shards with rows in flight."""

    def __init__(
        self,
        store: OutputStore,
        config: JobConfig,
        rows_in: int,
        pending: set[int],
        types: dict[str, Any],
        attempt: int,
        metrics: RunMetrics,
        note_attempt: Callable[[], None],
    ) -> None:
        self.store, self.config, self.attempt, self.metrics = store, config, attempt, metrics
        self.note_attempt = note_attempt
        self.rows_in, self.pending, self.types = rows_in, set(pending), types
        self.buffers: dict[int, ShardBuffer] = {}
        self.commits: list[ShardCommit] = []
        self.engine_restarts = 0
        self.engine_calibration: set[str] = set()  # distinct engines' vLLM-vs-plan records (JSON)
        # A batch whose node was lost is rerun by Ray; rows it had already handed on can arrive twice. The first
        # answer is kept, so every row is written once, and the repeats are counted. Positions are kept per shard
        # in flight only: a row of a shard no longer pending belongs to a shard already committed.
        self.seen: dict[int, set[int]] = defaultdict(set)
        self.rows_redelivered = 0
        self.noted_at = time.monotonic()
        self.first_request_at: float | None = None
        # Raises when an input file of the shard changed since the plan (input_plan.verify_unchanged).
        self.verify_input: Callable[[int], None] = lambda shard: None
        # What a result row holds (ShardBuffer.layout): an embedding input's vectors, one per row (native) or a
        # list per line (OpenAI); the attempt sets it from the plan.
        self.layout = "generate" if config.task == "generate" else "embed"

    def _buffer(self, shard: int) -> ShardBuffer:
        buffer = self.buffers.get(shard)
        if buffer is None:
            shard_rows = self.config.output.shard_rows
            size = min(shard_rows, self.rows_in - shard * shard_rows)
            buffer = self.buffers[shard] = ShardBuffer(shard, size, layout=self.layout)
        return buffer

    def _redelivered(self, shard: int, position: int) -> bool:
        seen = self.seen[shard] if shard in self.pending else None
        if seen is None or position in seen:
            self.rows_redelivered += 1
            return True
        seen.add(position)
        return False

    def commit_ready(self) -> None:
        # The attempt's time is noted after each commit, and at least every NOTE_INTERVAL_S while rows arrive.
        for shard in sorted(s for s, b in self.buffers.items() if b.complete):
            self.verify_input(shard)  # every row of the shard was read: the files must still be the planned ones
            buffer = self.buffers.pop(shard)
            self.seen.pop(shard, None)
            table = buffer.table(self.types) if buffer.results else None
            self.commits.append(
                self.store.commit_shard(shard, table, buffer.error_records(), buffer.stats(), self.attempt)
            )
            self.pending.discard(shard)
            self.note()
        if time.monotonic() - self.noted_at > NOTE_INTERVAL_S:
            self.note()

    def note(self) -> None:
        self.noted_at = time.monotonic()
        self.note_attempt()

    def take(self, batch: pa.Table) -> tuple[int, int, int, int]:
        """Route one batch of pipeline output; returns (rows ok, rows failed in the engine, rows rejected by
        validation, output tokens)."""
        shard_rows, max_model_len = self.config.output.shard_rows, self.config.engine.max_model_len
        ok = failed = rejected = out_tokens = 0
        engine_batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for item in batch.to_pylist():
            restarts = int(item.get(ENGINE_RESTARTS_COLUMN) or 0)
            if item.get(ENGINE_CALIBRATION_COLUMN):
                self.engine_calibration.add(str(item[ENGINE_CALIBRATION_COLUMN]))
            if restarts:
                self.engine_restarts += restarts
                print(
                    f"[llm-batch] the engine died and was rebuilt {restarts} time(s) while answering a batch "
                    f"({self.engine_restarts} this attempt)",
                    file=sys.stderr,
                )
            position = int(item["_pos"])
            shard = position // shard_rows
            if self._redelivered(shard, position):
                continue
            buffer = self._buffer(shard)
            buffer.received += 1
            message = item.get("__inference_error__") or ""
            if message.startswith(REJECTED_PREFIX):  # failed validation: never reached an engine
                buffer.errors.append(row_error(item, item["_error_type"], message.removeprefix(REJECTED_PREFIX)))
                rejected += 1
                continue
            engine_batches[item.get("batch_uuid") or ""].append(item)
            if message:
                buffer.errors.append(row_error(item, *classify_inference_error(message)))
                failed += 1
                continue
            if self.layout != "generate":
                buffer.results.append(_embedded(item, position))
                ok += 1
                continue
            num_in, num_out = int(item["num_input_tokens"]), int(item["num_generated_tokens"])
            choices = item.get(CHOICES_COLUMN)
            samples = json.loads(choices) if choices else []
            if samples:  # several samples: every one's tokens count, as OpenAI's usage does
                num_out = sum(int(c["num_tokens"]) for c in samples)
            buffer.results.append(
                {
                    "_pos": position,
                    "id": item["id"],
                    "generated_text": item["generated_text"],
                    "num_input_tokens": num_in,
                    "num_output_tokens": num_out,
                    "num_cached_tokens": _cached_tokens(item),
                    # vLLM's own reason where the engine stage kept it; else told from the limits, as before
                    "finish_reason": item.get(FINISH_COLUMN)
                    or finish_reason(num_in, num_out, int(item["_max_tokens"]), max_model_len),
                    "choices": choices,
                    # Of num_out, the thinking a reasoning parser read apart (the batch's usage sums them)
                    "_reasoning_tokens": sum(int(c.get("reasoning_tokens") or 0) for c in samples),
                    "_passthrough": passthrough_of(item.get("_passthrough")),
                }
            )
            ok += 1
            out_tokens += num_out
        for items in engine_batches.values():
            report = _batch_report(items)
            if report.rows_ok and self.first_request_at is None:
                self.first_request_at = _first_request_at(items, report)
            self.metrics.batch_complete(report)
        if rejected:
            self.metrics.rows_rejected(rejected)
        self.commit_ready()
        return ok, failed, rejected, out_tokens


def _cached_tokens(item: dict[str, Any]) -> int | None:
    """vLLM's prefix-cache hits of the row's prompt; None where the engine stage kept no count (an upstream path
    that bypasses the guarded stage), so the output says "unknown" rather than 0."""
    value = item.get(CACHED_COLUMN)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _embedded(item: dict[str, Any], position: int) -> dict[str, Any]:
    return {
        "_pos": position,
        "id": item["id"],
        "vectors": unpack_vectors(item[VECTORS_COLUMN], item[SIZES_COLUMN]),
        "num_input_tokens": int(item["num_input_tokens"]),
        "num_output_tokens": 0,
        "_passthrough": passthrough_of(item.get("_passthrough")),
    }


def _first_request_at(items: list[dict[str, Any]], report: BatchReport) -> float:
    """When the engine that answered this batch took its first one, on this process's monotonic clock. Rows that
    carry no stamp: the batch's arrival less its time in the engine (an estimate that runs late when batches share
    the engine, as the first one to arrive need not be the first one sent)."""
    stamps = [float(i[ENGINE_FIRST_REQUEST_COLUMN]) for i in items if i.get(ENGINE_FIRST_REQUEST_COLUMN)]
    if stamps:
        return time.monotonic() - max(0.0, time.time() - min(stamps))
    return time.monotonic() - report.duration_s


def _batch_report(items: list[dict[str, Any]]) -> BatchReport:
    """One engine batch as received: its latency is its slowest row's time in the engine."""
    succeeded = [i for i in items if not i.get("__inference_error__")]
    return BatchReport(
        duration_s=max((float(i.get("time_taken_llm") or 0.0) for i in succeeded), default=0.0),
        rows_ok=len(succeeded),
        rows_failed=len(items) - len(succeeded),
        input_tokens=sum(int(i["num_input_tokens"] or 0) for i in succeeded),
        output_tokens=sum(int(i["num_generated_tokens"] or 0) for i in succeeded),
    )
