"""Writes the records of this folder with the Batch API as of commit 1e5a373, before its records were typed.

Run once, at that commit (`git archive 1e5a373 workload tests | tar -x -C /tmp/old && cd /tmp/old &&
PYTHONPATH=. python /path/to/this/make_records.py OUT`), and the records under OUT/records/ and
OUT/swept/records/ were copied here: every kind the service
stores (file, batch, upload, night) in every state the old code could leave it in, so
tests/workload/test_batch_api_records.py can load them with today's code. It imports the old modules (lifecycle,
nights, uploads as free functions), which is why it is not run by the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_metrics import Scripted
from workload.batch_api import lifecycle, nights, uploads  # type: ignore[attr-defined]
from workload.batch_api.executor import RunState
from workload.batch_api.objects import Limits
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore


def main(out: Path) -> None:
    store, clock, executor = LocalStore(out), Clock(), Scripted()
    service = BatchService(store, executor, "llm-batch", Limits(retention_s=7 * 86400), clock)
    body = (_line("a") + _line("b")).encode()
    two = service.upload_file("p", "two.jsonl", "batch", [body], expires_after_s=6 * 86400)["id"]
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
    # The lines' own endpoint: a batch no line of which can run is refused at create since issue 58.
    broken = service.create_batch("p", two, "/v1/chat/completions", "24h")["id"]
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
    source = old.upload_file("p", "one.jsonl", "batch", [_line("a").encode()])["id"]
    old.cancel_batch("p", old.create_batch("p", source, "/v1/chat/completions", "24h")["id"])
    clock.now += 3600
    lifecycle.tick(old)  # the file expires, the batch's output goes
    old_store.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
