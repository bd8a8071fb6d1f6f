"""What the Batch API refuses or answers before any job starts, through the official client on the real app:
an input no line of which could run fails at create (OpenAI's batch errors, no job), a listing goes on past a
file deleted under its cursor, and an id of any shape is a 404 in OpenAI's error body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.workload.test_batch_api import KEY_A, _line
from tests.workload.test_batch_api_uploads import Front
from workload.batch_api.objects import Limits
from workload.batch_api.store import LocalStore


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    store = LocalStore(tmp_path / "data")
    running = Front(tmp_path, store, Limits())
    yield running
    running.stop()
    store.close()


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"id,prompt\n1,hello\n2,world\n", "invalid_json_line", None),  # a CSV
        (_line("a", "/v1/embeddings").encode() * 2, "invalid_url", "url"),  # every line another url
        (_line("a", "/v1/completions").encode(), "invalid_url", "url"),  # another endpoint's lines
    ],
)
def test_an_input_no_line_of_which_can_run_fails_at_create(
    front: Front, body: bytes, code: str, param: str | None
) -> None:
    client = front.client()
    source = client.files.create(file=("in.jsonl", body), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    error = batch.errors.data[0]
    assert (error.code, error.param, error.line) == (code, param, 1)
    assert "no job was started" in (error.message or "")
    front.service.tick()  # a failed batch is never handed to the executor
    assert not (front.service.executor.runs / batch.id).exists()  # type: ignore[attr-defined]


def test_a_file_with_some_runnable_lines_runs_and_its_bad_lines_are_the_jobs(front: Front) -> None:
    client = front.client()
    body = (_line("bad", "/v1/completions") + "not json\n" + _line("good")).encode()
    source = client.files.create(file=("in.jsonl", body), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert (batch.status, batch.request_counts and batch.request_counts.total) == ("validating", 3)


def test_listing_goes_on_past_a_file_deleted_under_its_cursor(front: Front) -> None:
    client = front.client()
    made = [client.files.create(file=(f"{i}.jsonl", _line(str(i)).encode()), purpose="batch").id for i in range(5)]
    seen: list[str] = []
    for file in client.files.list(limit=2):  # the SDK's auto-pagination, deleting as it goes
        seen.append(file.id)
        client.files.delete(file.id)
    assert seen == made[::-1]  # newest first, none skipped, none twice
    assert client.files.list().data == []
    with pytest.raises(openai.BadRequestError, match="no object"):
        client.files.list(after="file-nothere")


@pytest.mark.parametrize("bad_id", ["x" * 300, "file-..", "file-a.b..c", "%2e%2e"])
def test_any_malformed_id_is_a_404_in_openais_shape(front: Front, bad_id: str) -> None:
    client = front.client()
    source = client.files.create(file=("in.jsonl", _line("a").encode()), purpose="batch")  # the records exist
    client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(bad_id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(bad_id)
    answer = httpx.get(f"{front.base}/uploads/{bad_id}/cancel", headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code in (404, 405) and "error" in answer.json()
    answer = httpx.post(f"{front.base}/uploads/{bad_id}/cancel", headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "upload_id"
