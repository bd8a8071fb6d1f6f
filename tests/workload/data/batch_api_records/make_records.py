"""Writes the records of this folder with the Batch API as of commit 1e5a373, before its records were typed.

Run once, at that commit (`git worktree add /tmp/old 1e5a373 && cd /tmp/old && python
/path/to/this/make_records.py OUT`), and the records under OUT/records/ were copied here: every kind the service
stores (file, batch, upload, night) in every state the old code could leave it in, so
tests/workload/test_batch_api_records.py can load them with today's code. It imports the old modules (lifecycle,
nights, uploads as free functions), which is why it is not run by the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from workload.batch_api import lifecycle, nights, uploads  # type: ignore[attr-defined]
from workload.batch_api.executor import RunState
from workload.batch_api.objects import Limits
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore


class Scripted:
    def __init__(self) -> None:
        self.states: dict[str, RunState] = {}

    def start(self, run: Any) -> None:
        self.states.setdefault(run.batch_id, RunState("running"))

    def state(self, batch_id: str) -> RunState:
        return self.states.get(batch_id, RunState("absent"))

    def occupied(self) -> bool:
        return False

    def stop(self, batch_id: str) -> None:
        self.states[batch_id] = RunState("stopped")

    def close(self) -> None:
        pass


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def line(custom_id: str) -> bytes:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return (
        json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
    ).encode()


def main(out: Path) -> None:
    store, clock, executor = LocalStore(out), Clock(), Scripted()
    service = BatchService(store, executor, "llm-batch", Limits(retention_s=7 * 86400), clock)
    two = service.upload_file("p", "two.jsonl", "batch", [line("a") + line("b")], expires_after_s=6 * 86400)["id"]
    empty = service.upload_file("p", "empty.jsonl", "batch", [b"\n"])["id"]
    service.create_batch("p", empty, "/v1/chat/completions", "24h")  # failed: empty_file
    done = service.create_batch("p", two, "/v1/chat/completions", "24h", {"team": "ml"})["id"]
    lifecycle.tick(service)  # done: in_progress
    output = f"batches/{done}/output"
    store.write_blob(f"{output}/_commits/0.json", [json.dumps({"shard": 0, "rows_ok": 1, "rows_failed": 1}).encode()])
    store.write_blob(f"{output}/output.jsonl", [b'{"custom_id": "a"}\n'])
    store.write_blob(f"{output}/errors.jsonl", [b'{"custom_id": "b"}\n'])
    summary = {"rows_in": 2, "input_tokens": 20, "output_tokens": 8, "wall_s": 81.5, "cost_usd": 0.02}
    lifecycle.tick(service)  # finalizing from the markers
    store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])
    executor.states[done] = RunState("succeeded")
    lifecycle.tick(service)  # completed, with its output and error files
    clock.now += 60
    broken = service.create_batch("p", two, "/v1/completions", "24h")["id"]
    lifecycle.tick(service)
    executor.states[broken] = RunState("failed", "llm-batch: CUDA out of memory")
    lifecycle.tick(service)  # failed: job_failed
    clock.now += 60
    service.cancel_batch("p", service.create_batch("p", two, "/v1/chat/completions", "24h")["id"])  # cancelled
    clock.now += 60
    stopping = service.create_batch("p", two, "/v1/chat/completions", "24h")["id"]
    lifecycle.tick(service)
    executor.states[stopping] = RunState("running")
    service.cancel_batch("p", stopping)  # cancelling, with its stop
    clock.now += 60
    service.create_batch("p", two, "/v1/chat/completions", "24h")  # validating, queued behind it
    nights.enqueue(service, "2026-11-28T01:00:00Z")  # queued
    nights.enqueue(service, "2026-11-29T01:00:00Z")
    nights.claim(service, "night-2026-11-29", None)
    nights.started_by(service, "night-2026-11-29", "arn:aws:states:us-east-1:123456789012:execution:m:night-1")
    pending = uploads.create_upload(
        service, "p", {"bytes": 10, "filename": "p.jsonl", "mime_type": "x", "purpose": "batch"}
    )
    uploads.add_part(service, "p", pending["id"], [b"0123456789"])
    made = uploads.create_upload(
        service,
        "p",
        {
            "bytes": 10,
            "filename": "m.jsonl",
            "mime_type": "x",
            "purpose": "batch",
            "expires_after": {"anchor": "created_at", "seconds": 7200},
        },
    )
    part = uploads.add_part(service, "p", made["id"], [b"0123456789"])
    uploads.complete_upload(service, "p", made["id"], [part["id"]], None)
    dropped = uploads.create_upload(
        service, "p", {"bytes": 5, "filename": "d.jsonl", "mime_type": "x", "purpose": "batch"}
    )
    uploads.cancel_upload(service, "p", dropped["id"])
    store.close()
    # An old batch past its retention: its output deleted and marked so (`_output_deleted`).
    old_store = LocalStore(out / "swept")
    old = BatchService(old_store, Scripted(), "llm-batch", Limits(retention_s=3600), clock)
    source = old.upload_file("p", "one.jsonl", "batch", [line("a")])["id"]
    old.cancel_batch("p", old.create_batch("p", source, "/v1/chat/completions", "24h")["id"])
    clock.now += 3600
    lifecycle.tick(old)  # the file expires, the batch's output goes
    old_store.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
