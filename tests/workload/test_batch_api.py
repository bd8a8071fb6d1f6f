"""The Batch API without the engine: the official openai client against the real app on a real uvicorn server,
for what needs no job to run (uploads, validation, errors, keys, pagination, tenancy), and the service's
expiry and retention on an injected clock. No batch is started here (no tick): the engine's part is
test_batch_api_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from openai.types import Batch, FileObject

from tests.workload.served_app import ServedApp
from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api.app import build_app
from workload.batch_api.executor import LocalJobExecutor, RunState
from workload.batch_api.objects import Limits
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore, StoreLocked

KEY_A, KEY_B = "sk-test-a-0123456789", "sk-test-b-0123456789"


def _line(custom_id: str, url: str = "/v1/chat/completions") -> str:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


CHAT_ENDPOINT = "/v1/chat/completions"  # the url of `_line`'s requests: a batch of them can run


class Clock:
    """The service's wall clock, moved by the test (expiry is 24 h, retention 30 days: no test waits for them)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Server:
    def __init__(self, tmp: Path, scope: str, limits: Limits) -> None:
        self.clock = Clock()
        self.store = LocalStore(tmp / "data")
        # The real local executor; these tests never tick, so it never starts a job.
        self.service = BatchService(self.store, LocalJobExecutor({}, tmp / "runs"), "llm-batch", limits, self.clock)
        keys = ApiKeys(KeySource(key=None, key_file=self._key_file(tmp)))
        self.served = ServedApp(build_app(self.service, keys, scope))  # type: ignore[arg-type]
        self.port = self.served.port

    @staticmethod
    def _key_file(tmp: Path) -> Path:
        path = tmp / "keys"
        path.write_text(f"# two keys: one per team\n{KEY_A}\n{KEY_B}\n")
        return path

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        return self.served.client(key)

    def stop(self) -> None:
        self.served.stop()
        self.store.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("batch-api"), "project", Limits(max_file_bytes=4096, max_requests=3))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("batch-api-key"), "key", Limits())
    yield running
    running.stop()


def _upload(client: openai.OpenAI, text: str, name: str = "in.jsonl") -> FileObject:
    return client.files.create(file=(name, text.encode()), purpose="batch")


def test_upload_read_list_download_delete(server: Server) -> None:
    client = server.client()
    created = _upload(client, _line("a") + _line("b"), "mine.jsonl")
    assert (created.filename, created.purpose, created.bytes) == ("mine.jsonl", "batch", len(_line("a") * 2))
    assert created.expires_at == created.created_at + 30 * 86400  # OpenAI's default for batch files
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).text == _line("a") + _line("b")
    assert created.id in [f.id for f in client.files.list()]
    deleted = client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError) as error:
        client.files.retrieve(created.id)
    assert error.value.body["message"] == f"No such File object: {created.id}"  # type: ignore[index]


def test_wrong_or_missing_key_is_401_with_openais_body(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as error:
        server.client("sk-wrong").files.list()
    assert error.value.code == "invalid_api_key"
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as none:  # no key at all (the client itself refuses to send none)
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/batches")
    assert none.value.code == 401 and "didn't provide an API key" in json.load(none.value)["error"]["message"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health") as health:  # the probe needs no key
        assert json.load(health) == {"status": "ok"}


def test_create_refuses_a_missing_file_a_wrong_endpoint_and_a_wrong_purpose(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.create(input_file_id="file-nothere", endpoint="/v1/chat/completions", completion_window="24h")
    assert missing.value.param == "input_file_id"
    good = _upload(client, _line("a"))
    with pytest.raises(openai.BadRequestError) as endpoint:
        client.batches.create(input_file_id=good.id, endpoint="/v1/moderations", completion_window="24h")
    assert endpoint.value.param == "endpoint" and "/v1/embeddings" in endpoint.value.message
    with pytest.raises(openai.BadRequestError) as window:
        client.batches.create(input_file_id=good.id, endpoint="/v1/completions", completion_window="48h")  # type: ignore[arg-type]
    assert window.value.param == "completion_window"
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert purpose.value.param == "purpose"
    with pytest.raises(openai.BadRequestError) as metadata:
        client.batches.create(
            input_file_id=good.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{i}": "v" for i in range(17)},
        )
    assert metadata.value.param == "metadata"


def _embedding_line(custom_id: str) -> str:
    body = {"model": "llm-batch", "input": ["first text", "second text"], "encoding_format": "base64"}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n"


def test_an_embeddings_batch_is_taken_and_its_lines_checked_against_its_endpoint(server: Server) -> None:
    """The job answers embeddings files (issue 55): the Batch API takes their batches as it takes chat ones."""
    _assert_taken_and_chat_lines_refused(server, "/v1/embeddings", _embedding_line("e1") + _embedding_line("e2"))


def _assert_taken_and_chat_lines_refused(
    server: Server, endpoint: Literal["/v1/embeddings", "/v1/responses"], two_lines: str
) -> None:
    """A batch of `two_lines` for `endpoint` is taken (and cancelled while queued); one of chat lines for the same
    endpoint fails at create, naming the lines' url."""
    client = server.client()
    batch = client.batches.create(
        input_file_id=_upload(client, two_lines).id,
        endpoint=endpoint,
        completion_window="24h",
    )
    assert (batch.status, batch.endpoint, batch.request_counts.total) == ("validating", endpoint, 2)  # type: ignore[union-attr]
    assert client.batches.cancel(batch.id).status == "cancelled"  # queued: nothing ran
    chat_lines = _upload(client, _line("c1"))
    wrong = client.batches.create(input_file_id=chat_lines.id, endpoint=endpoint, completion_window="24h")
    assert wrong.status == "failed" and wrong.errors is not None and wrong.errors.data is not None
    assert (wrong.errors.data[0].code, wrong.errors.data[0].param) == ("invalid_url", "url")


def test_upload_and_request_limits(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.APIStatusError) as large:
        _upload(client, _line("x") * 40)  # over the server's 4096-byte limit
    assert large.value.status_code == 413 and "4096" in large.value.message
    too_many = _upload(client, "".join(_line(f"r{i}") for i in range(4)))  # the server takes 3 per batch
    batch = client.batches.create(input_file_id=too_many.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at == batch.created_at
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].code == "too_many_requests" and "at most 3" in (batch.errors.data[0].message or "")
    empty = _upload(client, "\n\n")
    failed = client.batches.create(input_file_id=empty.id, endpoint="/v1/completions", completion_window="24h")
    assert failed.status == "failed" and failed.errors.data[0].code == "empty_file"  # type: ignore[union-attr,index]


def test_a_queued_batch_and_its_cancel(server: Server) -> None:
    client = server.client()
    source = _upload(client, _line("a") + _line("b", "/v1/completions"))  # the other url is the job's error line
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"team": "ml"}
    )
    assert (batch.status, batch.request_counts.total, batch.metadata) == ("validating", 2, {"team": "ml"})  # type: ignore[union-attr]
    assert batch.expires_at == batch.created_at + 24 * 3600 and batch.model == "llm-batch"
    assert client.batches.retrieve(batch.id) == batch
    cancelled = client.batches.cancel(batch.id)  # queued: nothing runs, so it is cancelled at once
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.output_file_id is None and cancelled.error_file_id is None
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nothere")


def test_batch_list_pages_newest_first_with_the_sdks_own_paging(server: Server) -> None:
    client = server.client()
    source = _upload(client, _line("a"))
    made = []
    for _ in range(5):
        server.clock.now += 1
        made.append(client.batches.create(input_file_id=source.id, endpoint=CHAT_ENDPOINT, completion_window="24h"))
        client.batches.cancel(made[-1].id)
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == [made[4].id, made[3].id] and first.has_more
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in second.data] == [made[2].id, made[1].id]
    everything = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after` page by page
    assert everything[:5] == [b.id for b in reversed(made)] and len(everything) == len(set(everything))
    assert all(isinstance(b, Batch) for b in client.batches.list(limit=100))
    with pytest.raises(openai.BadRequestError):
        client.batches.list(limit=101)
    ascending = client.files.list(order="asc", limit=1)
    assert ascending.has_more and len(ascending.data) == 1


def test_project_scope_every_key_sees_every_object(server: Server) -> None:
    mine = _upload(server.client(KEY_A), _line("a"))
    assert server.client(KEY_B).files.retrieve(mine.id).id == mine.id


def test_key_scope_a_key_sees_only_its_own(tenants: Server) -> None:
    team_a, team_b = tenants.client(KEY_A), tenants.client(KEY_B)
    theirs = _upload(team_a, _line("a"))
    batch = team_a.batches.create(input_file_id=theirs.id, endpoint=CHAT_ENDPOINT, completion_window="24h")
    # Another tenant's id answers as an unknown one: 404 with the same wording, so ids cannot be probed.
    for call in (
        lambda: team_b.files.retrieve(theirs.id),
        lambda: team_b.files.content(theirs.id),
        lambda: team_b.files.delete(theirs.id),
        lambda: team_b.batches.retrieve(batch.id),
        lambda: team_b.batches.cancel(batch.id),
        lambda: team_b.batches.create(input_file_id=theirs.id, endpoint="/v1/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert [f.id for f in team_b.files.list()] == [] and [b.id for b in team_b.batches.list()] == []
    assert [b.id for b in team_a.batches.list()] == [batch.id]
    team_a.batches.cancel(batch.id)


class Recorder:
    """Stands in for the job runner (LocalJobExecutor, exercised with the engine in test_batch_api_e2e.py) where
    the test checks only the clock's rules: it records what it is told and reports a run as running until it is
    told to stop, then as stopped, as the job reports itself after a SIGTERM."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: set[str] = set()

    def start(self, run: Any) -> None:
        self.started.append(run.batch_id)

    def state(self, batch_id: str) -> RunState:
        return RunState("stopped" if batch_id in self.stopped else "running")

    def occupied(self) -> bool:
        return False

    def stop(self, batch_id: str) -> None:
        self.stopped.add(batch_id)

    def close(self) -> None:
        pass

    def chain(self) -> None:
        return None  # every run is one the scheduler starts


def test_expiry_and_retention_on_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    store = LocalStore(tmp_path / "data")
    with pytest.raises(StoreLocked):
        LocalStore(tmp_path / "data")  # one server per folder
    executor = Recorder()
    service = BatchService(store, executor, "llm-batch", Limits(retention_s=7 * 86400), clock)
    short = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()], expires_after_s=3600)
    kept = service.upload_file("p", "b.jsonl", "batch", [_line("b").encode()])
    assert kept["expires_at"] == kept["created_at"] + 7 * 86400  # the server's retention caps every file
    first = service.create_batch("p", kept["id"], "/v1/chat/completions", "24h")
    second = service.create_batch("p", kept["id"], "/v1/chat/completions", "24h")
    service.tick()  # the oldest starts; the other waits its turn, in `validating`
    assert executor.started == [first["id"]]
    assert service.get_batch("p", first["id"])["status"] == "in_progress"
    assert service.get_batch("p", second["id"])["status"] == "validating"
    clock.now += 24 * 3600
    service.tick()  # both windows are over: the running one is stopped, the queued one never ran
    assert first["id"] in executor.stopped
    for batch in (first, second):
        expired = service.get_batch("p", batch["id"])
        assert expired["status"] == "expired" and expired["expired_at"] == int(clock.now), expired
    assert executor.started == [first["id"]]
    # The run answered nothing: its one request is in its error file as OpenAI's `batch_expired` (unfinished.py).
    ran = service.get_batch("p", first["id"])
    assert ran["output_file_id"] is None and ran["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    unrun = [json.loads(line) for line in b"".join(service.file_content("p", ran["error_file_id"])).splitlines()]
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in unrun] == [("b", None, "batch_expired")]
    files = [f["id"] for f in service.list_files("p", None, 100, "asc", None)["data"]]
    assert sorted(files) == sorted([kept["id"], ran["error_file_id"]])
    assert store.blob_size(f"files/{short['id']}.jsonl") is None  # the body went with the record
    clock.now += 7 * 86400
    service.tick()
    assert service.list_files("p", None, 100, "asc", None)["data"] == []
    store.close()


def test_a_bom_only_line_and_blank_lines_count_alike_at_create_in_the_job_and_at_close(tmp_path: Path) -> None:
    """Issue 59: a file opening with a line that holds only a byte order mark, with blank and whitespace lines
    between its requests, holds as many requests at create time as rows in the job's id pass and as unanswered
    lines when the batch expires (workload/contract/jsonl_lines.py is the one rule)."""
    from tests.workload.test_input_plan import _id_pass_counts
    from workload.contract.config import InputConfig
    from workload.job.input_plan import plan_input

    body = b"\xef\xbb\xbf\n" + _line("a").encode() + b"\n  \r\n" + _line("b").encode().replace(b"\n", b"\r\n") + b"\t\n"
    clock, store, executor = Clock(), LocalStore(tmp_path / "data"), Recorder()
    service = BatchService(store, executor, "llm-batch", Limits(), clock)
    source = service.upload_file("p", "in.jsonl", "batch", [body[i : i + 2] for i in range(0, len(body), 2)])
    batch = service.create_batch("p", source["id"], CHAT_ENDPOINT, "24h")
    (tmp_path / "job-in").mkdir()
    (tmp_path / "job-in" / "in.jsonl").write_bytes(body)
    job_rows = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path / "job-in")))).rows_in
    assert (batch["request_counts"]["total"], job_rows) == (2, 2)
    service.tick()
    clock.now += 24 * 3600
    service.tick()  # expired unanswered: each request is one `batch_expired` line, and nothing else is
    closed = service.get_batch("p", batch["id"])
    assert closed["request_counts"] == {"total": 2, "completed": 0, "failed": 2}, closed
    unrun = [json.loads(line) for line in b"".join(service.file_content("p", closed["error_file_id"])).splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in unrun] == [("a", "batch_expired"), ("b", "batch_expired")]
    store.close()


def test_the_app_imports_no_engine() -> None:
    """The AWS front imports the app where Ray, vLLM and torch are not installed."""
    blocker = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('ray', 'vllm', 'torch', 'transformers', 'pyarrow'):\n"
        "            raise ImportError('the Batch API imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import workload.batch_api.app, workload.batch_api.scheduler, workload.batch_api.cli\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


def _responses_line(custom_id: str, **body: Any) -> str:
    body = {"model": "llm-batch", "input": "Is it ok?", "instructions": "Answer yes or no.", **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}) + "\n"


def test_a_responses_batch_is_taken_and_its_lines_checked_against_its_endpoint(server: Server) -> None:
    """OpenAI's Batch API takes `/v1/responses` (the SDK's `endpoint` literal); so does this one (issue 56), with
    one url per batch as for the other endpoints."""
    lines = _responses_line("r1", max_output_tokens=16) + _responses_line("r2")
    _assert_taken_and_chat_lines_refused(server, "/v1/responses", lines)
