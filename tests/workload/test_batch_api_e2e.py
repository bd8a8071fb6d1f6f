"""The Batch API end to end: `python -m workload batch-api` as a user starts it, the official openai client
(unchanged but for base_url and api_key), and the real job on the real local engine (Ray, vLLM, the tiny model).

One module, four engine starts in all, several batches sharing each run after the first (issue 62,
workload/batch_api/pools.py): the large batch L runs alone while S (small), C and E are submitted behind it, and
is interrupted by a server restart (while the job starts its engine); the next server resumes L in one run with
the three newcomers, and S, submitted after L started, closes `completed` while L is still running (the figure
printed: L's rows committed when S's first were). C is cancelled after its first shards have committed and closes
`cancelled` with those lines in its output file; the run stops whole and starts again without it, and E, pushed
past its completion window the same way, closes `expired`; L completes with every line once across the restart and
both stops. C and E are one-token answers, whose shards of 4 commit one after another as the engine answers them,
then long answers still running when the stop lands; every request a run did not answer is in the error file with
OpenAI's `batch_cancelled` or `batch_expired`.
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

KEY = "sk-e2e-batch-api-key-" + "0" * 16  # the Batch API takes keys of at least 32 characters
QUICK, LONG = 64, 128  # C's and E's lines: one-token answers first (their shards commit at once), then long ones
LARGE = 48  # L's lines, each a long answer
CHAT = "/v1/chat/completions"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _line(custom_id: str, url: str = CHAT, max_tokens: int = 48) -> str:
    messages = [{"role": "user", "content": f"Say {custom_id}"}]
    body = {"model": "llm-batch", "messages": messages, "max_tokens": max_tokens}
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


def _push_past_window(data: Path, batch_id: str) -> None:
    """What the clock passing `expires_at` does, done to the batch's record in the server's folder: no server
    setting moves a window or the clock (one that could would let an operator expire every tenant's batches early,
    and a test-only flag is a surface nobody uses), and editing the folder needs the rights that already own every
    batch in it. Rewritten until the server's tick has taken it (`_stop` set), since a compare-and-swap of the
    server's (the counts it writes every tick) may land on the old record in between."""
    path = data / "records" / "batch" / f"{batch_id}.json"
    deadline = time.monotonic() + 60
    while (record := json.loads(path.read_text())).get("_stop") is None and record["status"] == "in_progress":
        assert time.monotonic() < deadline, record
        record["expires_at"] = int(time.time()) - 1
        temporary = path.with_name(f".{path.name}.push")
        temporary.write_text(json.dumps(record, sort_keys=True))
        os.replace(temporary, path)  # whole, as the store writes
        time.sleep(1.5)  # three ticks


def _stopped_files(client: openai.OpenAI, batch: Batch, ids: list[str], code: str) -> tuple[list[dict], list[dict]]:
    """A batch stopped mid-run: what committed is in its output file, what never ran in its error file with `code`;
    each request once across the two, and the counts are what the files say (issue 58, finding 6)."""
    answers, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    counts = batch.request_counts
    assert counts is not None and counts.total == len(ids), counts
    assert (counts.completed, counts.failed) == (len(answers), len(errors)), counts
    assert 8 <= counts.completed < len(ids), counts  # the stop landed mid-run, after shards committed
    assert sorted([a["custom_id"] for a in answers] + [e["custom_id"] for e in errors]) == sorted(ids)
    assert all(ChatCompletion.model_validate(a["response"]["body"]).choices for a in answers)
    assert errors and all(e["response"] is None and e["error"]["code"] == code for e in errors), errors[:2]
    return answers, errors


def test_shared_runs_restart_join_cancel_expire(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"cache_dir": str(tmp_path / "models")},
                "engine": ENGINE,
                # Shards of 4 and long answers, one engine batch in flight: shards commit one after another, so
                # a stop lands mid-run with some committed and some not.
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
    # L, the large batch, runs first and alone; S (small), C and E are submitted while it runs.
    # L, C and E name their lines alike (request-000, ...): a shared run keeps batches apart by their own folders.
    ids_l = [f"request-{i:03d}" for i in range(LARGE)]
    upload_l = client.files.create(file=("l.jsonl", "".join(_line(i) for i in ids_l).encode()), purpose="batch")
    batch_l = client.batches.create(input_file_id=upload_l.id, endpoint=CHAT, completion_window="24h")
    running = _wait(client, batch_l.id, lambda b: b.status != "validating")
    ids_s = [f"s-{i:02d}" for i in range(15)]
    upload_s = client.files.create(
        file=("s.jsonl", ("".join(_line(i) for i in ids_s) + _line("s-wrong-url", "/v1/completions")).encode()),
        purpose="batch",
    )
    batch_s = client.batches.create(
        input_file_id=upload_s.id, endpoint=CHAT, completion_window="24h", metadata={"night": "1"}
    )
    # C and E: one-token answers first (their shards commit at once), then long ones still running at the stop.
    stopped_ids = {name: [f"request-{i:03d}" for i in range(QUICK + LONG)] for name in "ce"}
    stopped: dict[str, Batch] = {}
    for name, ids in stopped_ids.items():
        lines = [_line(i, max_tokens=1 if n < QUICK else 48) for n, i in enumerate(ids)]
        upload = client.files.create(file=(f"{name}.jsonl", "".join(lines).encode()), purpose="batch")
        stopped[name] = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    assert batch_s.request_counts.total == 16  # type: ignore[union-attr]

    # A batch arriving while a run holds the engine joins at the next run: here, the next server's (the join's
    # own stop comes after --pool-join-after-s, 300 s by default).
    time.sleep(15)  # the job is starting Ray and the engine: the restart lands mid-run
    assert {client.batches.retrieve(b).status for b in (batch_s.id, stopped["c"].id)} == {"validating"}
    print(f"at the restart: {running.status} {running.request_counts}")
    assert server.stop() == 0, log.read_text()[-3000:]  # the server stops the job, which commits what finished

    server = ApiServer(data, config, log)  # the same folder: L resumes where it stopped, S, C and E beside it
    client = server.client
    first_s = _wait(client, batch_s.id, lambda b: b.request_counts is not None and b.request_counts.completed > 0)
    large_then = client.batches.retrieve(batch_l.id)
    print(f"S's first rows committed with {large_then.request_counts} of L's")  # the wait, in L's rows
    assert large_then.status == "in_progress", (first_s, large_then)
    assert large_then.request_counts.completed < LARGE  # type: ignore[union-attr]
    done = _wait(client, batch_s.id, lambda b: b.status in ("completed", "failed"))
    assert done.status == "completed", (done, log.read_text()[-3000:])
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.metadata == {"night": "1"}
    assert done.request_counts.model_dump() == {"total": 16, "completed": 15, "failed": 1}  # type: ignore[union-attr]
    assert done.usage is not None and done.usage.output_tokens >= 15
    share = (done.model_extra or {})["llm_batch"]  # its share of the run, through the official client's Batch
    assert share["job_wall_s"] > 0 and share["cost_usd"] == 0.0, share  # no price is set locally
    answers, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert [a["custom_id"] for a in answers] == ids_s  # each once, in input order
    assert all(ChatCompletion.model_validate(a["response"]["body"]).choices for a in answers)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("s-wrong-url", 400)]
    output_file = client.files.retrieve(done.output_file_id)  # type: ignore[arg-type]
    assert output_file.purpose == "batch_output" and output_file.bytes > 0

    # C is cancelled once two of its shards have committed: the shared run stops whole, C closes `cancelled` with
    # what it committed, and the others start again without it.
    in_c = _wait(client, stopped["c"].id, lambda b: b.request_counts is not None and b.request_counts.completed >= 8)
    cancelling = client.batches.cancel(stopped["c"].id)
    assert cancelling.status == "cancelling", (in_c, cancelling)
    cancelled = _wait(client, stopped["c"].id, lambda b: b.status in ("cancelled", "completed", "failed"))
    assert cancelled.status == "cancelled" and cancelled.cancelling_at and cancelled.cancelled_at, cancelled
    # What committed is kept (issue 58, finding 6: a second SIGTERM from a later tick threw it away).
    partial, _ = _stopped_files(client, cancelled, stopped_ids["c"], "batch_cancelled")
    print(f"cancelled with {len(partial)} of {len(stopped_ids['c'])} answered")

    # E is pushed past its window once two of its shards have committed: it closes `expired`, the same way.
    _wait(client, stopped["e"].id, lambda b: b.request_counts is not None and b.request_counts.completed >= 8)
    _push_past_window(data, stopped["e"].id)
    expired = _wait(client, stopped["e"].id, lambda b: b.status in ("expired", "completed", "failed"))
    assert expired.status == "expired" and expired.expired_at and not expired.cancelled_at, expired
    answered_e, _ = _stopped_files(client, expired, stopped_ids["e"], "batch_expired")
    print(f"expired with {len(answered_e)} of {len(stopped_ids['e'])} answered")

    # L shared its runs with all three and completes with every line once, across the restart and both stops.
    large = _wait(client, batch_l.id, lambda b: b.status in ("completed", "failed"))
    assert large.status == "completed", (large, log.read_text()[-3000:])
    assert [a["custom_id"] for a in _lines(client, large.output_file_id)] == ids_l
    assert large.request_counts.model_dump() == {"total": LARGE, "completed": LARGE, "failed": 0}  # type: ignore[union-attr]
    assert any("resuming" in job_log.read_text() for job_log in (data / "runs").glob("*/job.log"))

    page = client.batches.list(limit=1)
    assert [b.id for b in page.data] == [stopped["e"].id] and page.has_more
    assert [b.id for b in client.batches.list(limit=1, after=stopped["e"].id).data] == [stopped["c"].id]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="sk-wrong", max_retries=0).files.list()
    assert server.stop() == 0
