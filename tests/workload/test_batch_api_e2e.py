"""The Batch API end to end: `python -m workload batch-api` as a user starts it, the official openai client
(unchanged but for base_url and api_key), and the real job on the real local engine (Ray, vLLM, the tiny model).

One module, three engine starts in all: batch A is interrupted by a server restart and resumed by the next
server to `completed`; batch B, queued behind it, is cancelled once its job runs and keeps what finished. Both
stops land while the job starts its engine: a 16-line file is one read block of the job, whose shards commit
together, so a later stop would find all of them done (docs/batch-api.md, Statuses).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import yaml
from openai.types import Batch
from openai.types.chat import ChatCompletion

from tests.workload.jobrun import ENGINE

pytestmark = pytest.mark.slow

KEY = "sk-e2e-batch-api-key"
CHAT = "/v1/chat/completions"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _line(custom_id: str, url: str = CHAT) -> str:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": f"Say {custom_id}"}], "max_tokens": 48}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


class ApiServer:
    def __init__(self, data: Path, config: Path, log: Path) -> None:
        self.port = _port()
        self.log = log.open("ab")
        command = [sys.executable, "-m", "workload", "batch-api", "--port", str(self.port), "--data", str(data)]
        self.process = subprocess.Popen(
            [*command, "--config", str(config), "--tick-s", "0.5"],
            env={**os.environ, "LLM_BATCH_API_KEY": KEY},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.batches.list(limit=1)
                return
            except openai.APIConnectionError:
                assert self.process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        self.log.close()
        return code


def _wait(client: openai.OpenAI, batch_id: str, done: Callable[[Batch], bool], timeout: float = 300) -> Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} stuck: {batch}"
        time.sleep(0.3)


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


def test_submit_restart_resume_complete_then_cancel(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"cache_dir": str(tmp_path / "models")},
                "engine": ENGINE,
                # Shards of 4 and long answers, one batch in flight: shards commit one after another, so a stop
                # lands mid-run with some committed and some not.
                "output": {"shard_rows": 4},
                "sampling": {"ignore_eos": True},
                "batch_size": 4,
                "max_concurrent_batches": 1,
                "stages": {"batch_size": 4},
            }
        )
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    server = ApiServer(data, config, log)
    client = server.client
    ids_a = [f"a-{i:02d}" for i in range(15)]
    upload_a = client.files.create(
        file=("a.jsonl", ("".join(_line(i) for i in ids_a) + _line("a-wrong-url", "/v1/completions")).encode()),
        purpose="batch",
    )
    batch_a = client.batches.create(
        input_file_id=upload_a.id, endpoint=CHAT, completion_window="24h", metadata={"night": "1"}
    )
    upload_b = client.files.create(
        file=("b.jsonl", "".join(_line(f"b-{i:02d}") for i in range(16)).encode()), purpose="batch"
    )
    batch_b = client.batches.create(input_file_id=upload_b.id, endpoint=CHAT, completion_window="24h")
    assert (batch_a.status, batch_b.status) == ("validating", "validating")
    assert batch_a.request_counts.total == 16  # type: ignore[union-attr]

    running = _wait(client, batch_a.id, lambda b: b.status != "validating")
    time.sleep(15)  # the job is starting Ray and the engine: the restart lands mid-run
    assert client.batches.retrieve(batch_b.id).status == "validating"  # one at a time, oldest first
    print(f"at the restart: {running.status} {running.request_counts}")
    assert server.stop() == 0, log.read_text()[-3000:]  # the server stops the job, which commits what finished

    server = ApiServer(data, config, log)  # the same folder: batch A resumes where it stopped
    client = server.client
    done = _wait(client, batch_a.id, lambda b: b.status in ("completed", "failed"))
    assert done.status == "completed", (done, log.read_text()[-3000:])
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.metadata == {"night": "1"}
    assert done.request_counts.model_dump() == {"total": 16, "completed": 15, "failed": 1}  # type: ignore[union-attr]
    assert done.usage is not None and done.usage.output_tokens >= 15
    share = (done.model_extra or {})["llm_batch"]  # the job's summary, through the official client's Batch
    assert share["job_wall_s"] > 0 and share["cost_usd"] == 0.0, share  # no price is set locally
    answers, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert [a["custom_id"] for a in answers] == ids_a  # each once, in input order, across the restart
    assert all(ChatCompletion.model_validate(a["response"]["body"]).choices for a in answers)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("a-wrong-url", 400)]
    output_file = client.files.retrieve(done.output_file_id)  # type: ignore[arg-type]
    assert output_file.purpose == "batch_output" and output_file.bytes > 0
    assert "resuming" in (data / "runs" / batch_a.id / "job.log").read_text() or running.request_counts.completed == 0  # type: ignore[union-attr]

    in_b = _wait(client, batch_b.id, lambda b: b.status != "validating")
    cancelling = client.batches.cancel(batch_b.id)
    assert cancelling.status in ("cancelling", "cancelled"), (in_b, cancelling)
    cancelled = _wait(client, batch_b.id, lambda b: b.status == "cancelled")
    assert cancelled.cancelling_at and cancelled.cancelled_at
    partial = _lines(client, cancelled.output_file_id)
    counts = cancelled.request_counts
    # What finished is kept: the lines in the file are what the counts say. A file of 16 lines is one read block
    # of the job (1024 rows), so its shards commit together and the cancel finds none or all of them committed.
    assert counts is not None and counts.completed == len(partial) and counts.total == 16
    assert all(ChatCompletion.model_validate(a["response"]["body"]).choices for a in partial)
    print(f"cancelled with {len(partial)} of 16 answered")

    page = client.batches.list(limit=1)
    assert [b.id for b in page.data] == [batch_b.id] and page.has_more
    assert [b.id for b in client.batches.list(limit=1, after=batch_b.id).data] == [batch_a.id]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="sk-wrong", max_retries=0).files.list()
    assert server.stop() == 0
