"""The output's fence, on local files and on a real S3-speaking server (moto over HTTP): an attempt paused past its
lease's TTL changes nothing of its successor's when it wakes, whatever it was doing when it was paused.

The SIGSTOP test runs two real attempt processes (tests/workload/fence_attempt.py: the job's own lease, attempt,
recover, commit and summary code; only the engine is stood in for) with a 2 s lease. The other tests replay the
requests a paused attempt could still send, with no lease check in front of them at all: the worst case, a pause
between each check and its request.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.files import storage
from workload.files.storage import Location, list_files, locate, read_bytes
from workload.job import lease as lease_module
from workload.job.lease import OutputLease
from workload.job.output import OutputFencedError, OutputStore
from workload.job.summary import build_summary  # noqa: F401  (the helper process imports it too: fail early here)

ROWS = [{"id": f"r-{i:02d}", **({"prompt": f"p{i}"} if i % 4 else {})} for i in range(40)]  # every 4th: an error
IDS = sorted(r["id"] for r in ROWS)
TTL_S = 2.0
STATS = {"rows_ok": 1, "rows_failed": 0, "input_tokens": 0, "output_tokens": 0, "error_types": {}}


@dataclass
class Case:
    input_uri: str
    output: Location


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    body = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    if request.param == "local":
        (tmp_path / "in.jsonl").write_bytes(body)
        yield Case(str(tmp_path / "in.jsonl"), locate(str(tmp_path / "out")))
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"fence-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    boto3.client("s3").put_object(Bucket=bucket, Key="in/rows.jsonl", Body=body)
    yield Case(f"s3://{bucket}/in/rows.jsonl", locate(f"s3://{bucket}/out"))


def _attempt(case: Case, mode: str, pause_at: int | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.workload.fence_attempt", mode, case.input_uri, case.output.uri, str(TTL_S)]
    return subprocess.Popen(
        args + ([str(pause_at)] if pause_at else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=120)
    return process.returncode, output


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[-1].split()[0] == "T"


def _published_ids(root: Location) -> list[str]:
    ids = []
    for part in list_files(root.child("results")):
        ids += pq.read_table(io.BytesIO(read_bytes(part))).column("id").to_pylist()
    for part in list_files(root.child("errors")):
        ids += [json.loads(line)["id"] for line in read_bytes(part).decode().splitlines()]
    return sorted(ids)


def _named_by_markers(root: Location) -> set[str]:
    store = OutputStore(root.uri)
    store.read_manifest()
    return {name for commit in store.committed().values() for name in commit.files}


def test_a_restart_paused_past_its_lease_deletes_nothing_of_its_successor(case: Case) -> None:
    """Attempt A runs --restart over a finished output and is stopped (SIGSTOP) the third time its lease check
    passes: after retiring the manifest and deleting the old summary, just before its first part delete. Attempt B
    takes the expired lease and finishes the output. A is resumed: the delete it was about to send goes out (the
    pause fell between the check and the request), then its next check finds the lease lost. Every row is in B's
    output exactly once and every file B's markers name is there."""
    code, output = _finish(_attempt(case, "resume"))
    assert code == 0, output
    assert _published_ids(case.output) == IDS

    paused = _attempt(case, "restart", pause_at=3)
    deadline = time.monotonic() + 60
    while not _stopped(paused.pid):
        assert paused.poll() is None and time.monotonic() < deadline, "attempt A never reached its pause"
        time.sleep(0.05)
    try:
        code, output = _finish(_attempt(case, "resume"))  # waits out A's 2 s lease, then runs
        assert code == 0, output
        summary = json.loads(read_bytes(case.output.child("summary.json")))
        assert summary["rows_ok"] + summary["rows_failed"] == len(ROWS)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    code, output = _finish(paused)
    assert code == 5 and "lost" in output, output

    assert _published_ids(case.output) == IDS  # nothing of B's deleted, nothing of A's old output left
    named = _named_by_markers(case.output)
    present = {f.uri[len(case.output.uri) + 1 :] for f in list_files(case.output)}
    assert len(named) > 0 and named <= present
    assert json.loads(read_bytes(case.output.child("summary.json")))["rows_ok"] == summary["rows_ok"]


def _old_output(root: Location) -> OutputStore:
    """A finished generation-0 output: shards 0 and 1 committed by attempt 1."""
    store = OutputStore(root.uri)
    store.read_manifest()
    store.write_manifest({"attempts": [{"attempt": 1}]})
    for shard in (0, 1):
        store.commit_shard(shard, pa.table({"id": [f"old-{shard}"]}), [], STATS, attempt=1)
    return store


class _Paused(Exception):
    pass


def test_a_reset_that_runs_on_unchecked_after_its_successor_took_over_deletes_none_of_its_files(
    case: Case,
) -> None:
    """The worst case of a pause between check and request: the stalled reset retired the manifest and stopped,
    the successor runs a whole attempt, then every delete of the stalled one's listing goes out unchecked."""
    _old_output(case.output)
    old_files = [f for folder in ("results", "_commits") for f in list_files(case.output.child(folder))]
    checks: list[int] = []

    def paused_after_retiring() -> None:  # the stalled reset's first request (the manifest) goes out, then it stops
        checks.append(1)
        if len(checks) > 1:
            raise _Paused

    stalled = OutputStore(case.output.uri, guard=paused_after_retiring)
    stalled.read_manifest()
    with pytest.raises(_Paused):
        stalled.reset({"attempts": []})

    successor = OutputStore(case.output.uri)
    manifest = successor.read_manifest()
    assert manifest is not None and manifest["generation"] == 1
    successor.write_manifest({**manifest, "attempts": [{"attempt": 1}]})
    assert successor.recover() == {}  # nothing of generation 0 is trusted
    for shard in (0, 1):
        successor.commit_shard(shard, pa.table({"id": [f"new-{shard}"]}), [], STATS, attempt=1)
    ours = {name for commit in successor.committed().values() for name in commit.files}

    for file in old_files:  # the stalled reset's listing, sent without any check
        storage.delete_file(file)
    stalled._guard = lambda: None  # as if its next check had passed too
    with pytest.raises(OutputFencedError):  # and its next manifest write is refused
        stalled.write_manifest({"attempts": [{"attempt": 1}]})

    assert _named_by_markers(case.output) == ours
    assert _published_ids(case.output) == ["new-0", "new-1"]


def test_a_stalled_attempts_late_commit_neither_replaces_nor_joins_its_successors(case: Case) -> None:
    """A stalled attempt (1) wakes after its successor (2) committed shard 0 and writes its own commit of the same
    shard without a check: its files get names of their own and its marker loses to the later attempt's."""
    store = OutputStore(case.output.uri)
    store.read_manifest()
    store.write_manifest({"attempts": [{"attempt": 1}]})
    stalled = OutputStore(case.output.uri)
    stalled.read_manifest()

    successor = OutputStore(case.output.uri)
    manifest = successor.read_manifest()
    assert manifest is not None
    successor.write_manifest({**manifest, "attempts": [{"attempt": 1}, {"attempt": 2}]})
    successor.recover()
    successor.commit_shard(0, pa.table({"id": ["from-2"]}), [], STATS, attempt=2)
    successor.write_summary({"rows_in": 1, "by": 2})

    stalled.commit_shard(0, pa.table({"id": ["from-1"]}), [], STATS, attempt=1)  # unchecked: no guard
    with pytest.raises(OutputFencedError):
        stalled.write_summary({"rows_in": 1, "by": 1})
    with pytest.raises(OutputFencedError):
        stalled.write_manifest({"attempts": [{"attempt": 1}]})
    assert json.loads(read_bytes(case.output.child("summary.json")))["by"] == 2

    later = OutputStore(case.output.uri)
    later.read_manifest()
    commits = later.recover()
    assert commits[0].attempt == 2
    assert _published_ids(case.output) == ["from-2"]


def test_the_lease_counts_time_on_the_clock_that_runs_through_suspend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLOCK_BOOTTIME, not CLOCK_MONOTONIC (which stops while the machine is suspended): a host that slept past
    its lease wakes knowing it may have lost it, and renews it if it is still its own or stops if it is not. The
    clock is stood in for (no test can suspend this machine)."""
    now = {time.CLOCK_BOOTTIME: 1000.0}
    asked: list[int] = []

    def clock_gettime(clock: int) -> float:
        asked.append(clock)
        return now[clock] if clock in now else time.monotonic()

    monkeypatch.setattr(lease_module.time, "clock_gettime", clock_gettime)
    lease = OutputLease(locate(str(tmp_path / "out")), ttl_s=30)
    lease.acquire()
    lease.check()
    assert asked and set(asked) == {time.CLOCK_BOOTTIME}
    now[time.CLOCK_BOOTTIME] += 23  # asleep for 23 s of a 30 s lease: less than a quarter-TTL left
    lease.check()  # nobody took it meanwhile: renewed on waking, not declared lost
    location = locate(str(tmp_path / "out" / lease_module.LEASE))
    taken = json.loads(storage.read_bytes(location))
    taken.update(token="successor", host="other-host", pid=4242)  # asleep again, and taken over meanwhile
    storage.write_bytes_atomic(location, json.dumps(taken).encode())
    now[time.CLOCK_BOOTTIME] += 23
    with pytest.raises(lease_module.LeaseLostError, match="pid 4242 on other-host"):
        lease.check()


def test_every_s3_call_ends_inside_the_default_leases_safety_margin() -> None:
    config = storage.s3_client_config()
    assert config.connect_timeout == storage.S3_CONNECT_TIMEOUT_S and config.read_timeout == storage.S3_READ_TIMEOUT_S
    assert config.retries == {"total_max_attempts": storage.S3_MAX_ATTEMPTS, "mode": "standard"}
    worst = config.retries["total_max_attempts"] * (config.connect_timeout + config.read_timeout) + 1.0 + 2.0
    assert worst == storage.S3_CALL_BOUND_S <= 120.0 / 4  # the default resume.lease_ttl_s, its last quarter
    client_config = storage.s3_client.__wrapped__().meta.config  # what the client really uses
    assert (client_config.connect_timeout, client_config.read_timeout) == (2.0, 6.0)
