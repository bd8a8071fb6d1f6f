"""Retries of the Batch API's creates, as the official client sends them: `Idempotency-Key` on `POST /v1/batches`
and a repeated `POST /v1/uploads/{id}/complete` answer what the first request made. The real app on a real
uvicorn server over a LocalStore (the lost-reply cases over S3 are in test_lost_replies.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.workload.test_batch_api import _line
from tests.workload.test_batch_api_uploads import Front
from workload.batch_api.idempotency import CLAIM_TTL_S, IdempotencyClaim
from workload.batch_api.objects import Limits
from workload.batch_api.store import LocalStore


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    store = LocalStore(tmp_path / "data")
    running = Front(tmp_path, store, Limits())
    yield running
    running.stop()
    store.close()


def _input(client: openai.OpenAI) -> str:
    return client.files.create(file=("in.jsonl", _line("r1").encode()), purpose="batch").id


def test_a_create_retried_with_its_key_is_one_batch(front: Front) -> None:
    client = front.client()
    file_id = _input(client)
    key = {"Idempotency-Key": "night-2026-12-06"}
    first = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", extra_headers=key
    )
    again = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", extra_headers=key
    )
    assert again.id == first.id
    assert [b.id for b in client.batches.list()] == [first.id]
    with pytest.raises(openai.BadRequestError) as reused:  # the same key for another request
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h", extra_headers=key
        )
    error = reused.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "Idempotency-Key",
        "idempotency_key_reused",
    )
    assert "other parameters" in reused.value.message
    other = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
        extra_headers={"Idempotency-Key": "another"},
    )  # fmt: skip
    assert other.id != first.id
    # Without a key a retry is a new request: a second batch (docs/batch-api.md, "Retries").
    plain = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert plain.id not in (first.id, other.id)


def test_claims_are_swept_by_the_tick_after_a_day(front: Front) -> None:
    client = front.client()
    file_id = _input(client)
    key = {"Idempotency-Key": "k1"}
    first = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", extra_headers=key
    )
    client.batches.cancel(first.id)  # queued: cancelled at once, so the tick has nothing to run
    assert len(front.service.records.all(IdempotencyClaim)) == 1
    front.clock.now += CLAIM_TTL_S
    front.service.tick()
    assert front.service.records.all(IdempotencyClaim) == []
    with pytest.raises(openai.BadRequestError, match="Idempotency-Key header must be"):
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
            extra_headers={"Idempotency-Key": "x" * 256},
        )  # fmt: skip


def test_a_repeated_complete_answers_the_completed_upload(front: Front) -> None:
    client, body = front.client(), _line("r1").encode()
    upload = client.uploads.create(bytes=len(body), filename="in.jsonl", mime_type="application/jsonl", purpose="batch")
    part = client.uploads.parts.create(upload.id, data=body)
    done = client.uploads.complete(upload.id, part_ids=[part.id])
    again = client.uploads.complete(upload.id, part_ids=[part.id])
    assert again == done and done.file is not None
    assert client.files.content(done.file.id).content == body
    assert [f.id for f in client.files.list()] == [done.file.id]  # one file, not two
    with pytest.raises(openai.BadRequestError, match="is completed"):  # other parts: not a retry
        client.uploads.complete(upload.id, part_ids=[part.id, "part_other"])
