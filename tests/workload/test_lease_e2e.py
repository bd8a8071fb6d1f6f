"""Two attempts on one output at once, as a manual rerun or a Spot replacement starts them: the real job (Ray and
vLLM on the tiny model), once on a local folder and once on a real S3-speaking server.

While the first attempt holds the output's lease, a second `workload run` and a `--restart` are refused naming the
holder and change nothing; a third, configured to wait, waits, then resumes and finds nothing left to do. Every row
exactly once. The first attempt is frozen (SIGSTOP) while the others race it, so the race cannot be lost to the clock.
One engine start per output kind: the later attempts never need an engine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import yaml

from tests.workload.jobrun import job_command, run_job, write_config
from workload.files.storage import Location, list_files, locate, read_bytes, read_versioned
from workload.job.lease import LEASE, LeaseRecord

pytestmark = pytest.mark.slow

EXIT_LEASE_HELD = 4
INVALID = [{"id": f"bad-{i}"} for i in range(8)]  # no prompt: shard 0 commits without waiting for the engine
VALID = [{"id": f"r-{i:02d}", "prompt": f"Lease test prompt {i}"} for i in range(16)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass
class Case:
    input_uri: str
    output: Location


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    body = _jsonl(INVALID + VALID)
    if request.param == "local":
        (tmp_path / "in.jsonl").write_bytes(body)
        return Case(str(tmp_path / "in.jsonl"), locate(str(tmp_path / "out")))
    request.getfixturevalue("moto_endpoint")
    bucket = f"lease-e2e-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="in/rows.jsonl", Body=body)
    return Case(f"s3://{bucket}/in/", locate(f"s3://{bucket}/out"))


def _files(root: Location, folder: str) -> dict[str, bytes]:
    return {f.uri: read_bytes(f) for f in list_files(root.child(folder))}


def _committed_state(root: Location) -> dict[str, bytes]:
    return {k: v for folder in ("_commits", "results", "errors") for k, v in _files(root, folder).items()}


def _ids(root: Location) -> list[str]:
    ids = []
    for data in _files(root, "results").values():
        ids += pq.read_table(io.BytesIO(data)).column("id").to_pylist()
    for data in _files(root, "errors").values():
        ids += [json.loads(line)["id"] for line in data.decode().splitlines()]
    return ids


def _holder_pid(root: Location) -> int | None:
    current = read_versioned(root.child(LEASE))
    record = LeaseRecord.decode(current[0]) if current else None
    return record.pid if record else None


def _start_logged(args: list[str], log: Path) -> subprocess.Popen[str]:
    """Like start_job, with the output in a file the test can read while the process still runs."""
    with log.open("w") as handle:
        return subprocess.Popen(
            job_command(*args), stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )


def _wait_for(log: Path, text: str, process: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert text in log.read_text(), log.read_text()


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stopped or not; Ray and the engine share the driver's group


def _finish(process: subprocess.Popen[str], log: Path, timeout: float) -> tuple[int, str]:
    try:
        code = process.wait(timeout=timeout)
    finally:
        _kill_group(process)  # leave no Ray or engine process holding memory
    return code, log.read_text()


def test_a_second_attempt_is_refused_or_waits_while_the_first_runs(
    case: Case, tmp_path: Path, model_cache: Path
) -> None:
    # Answers long enough that the first attempt is still at work some seconds after shard 0 commits.
    sampling = {"max_tokens": 128, "ignore_eos": True}
    config = write_config(tmp_path / "job.yaml", case.input_uri, case.output.uri, model_cache, sampling=sampling)
    waiting = write_config(
        tmp_path / "wait.yaml",
        case.input_uri,
        case.output.uri,
        model_cache,
        sampling=sampling,
        resume={"lease_wait_s": 600},
    )
    shard_rows = yaml.safe_load(config.read_text())["output"]["shard_rows"]
    shards = -(-len(INVALID + VALID) // shard_rows)

    first_log, wait_log = tmp_path / "first.log", tmp_path / "waiter.log"
    first = _start_logged(["run", "--config", str(config)], first_log)
    waiter: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 180
        while not _files(case.output, "_commits") and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert _files(case.output, "_commits"), "shard 0 (only invalid rows) was not committed"
        # Freeze the first attempt, Ray and engine included, as a stalled host would: alive and holding its lease
        # (live for at least 2/3 of resume.lease_ttl_s after its last renewal), however soon its rows would finish.
        # Without this the race was lost to the clock: with the input streamed, shard 0 commits anywhere from well
        # before the engine's first answer to with it (seen 2026-12-01 on S3: at 99 s, and the first attempt
        # released its lease 2 s of running later), so the second `run` or the `--restart` found the lease free
        # and rightly went on. The lease itself held: renewed every 40 s, and every attempt that met it live was
        # refused.
        with contextlib.suppress(ProcessLookupError):  # then it ended: said just below
            os.killpg(first.pid, signal.SIGSTOP)
        assert first.poll() is None, "the first attempt ended before a second could race it"
        assert _holder_pid(case.output) == first.pid, "the first attempt no longer holds the lease"
        before = _committed_state(case.output)

        for flags in ([], ["--restart"]):
            code, log = run_job(["run", "--config", str(config), *flags], timeout=120)
            assert code == EXIT_LEASE_HELD, log
            refusal = [line for line in log.splitlines() if "held by another live attempt" in line]
            assert len(refusal) == 1 and f"pid {first.pid} on " in refusal[0] and "expires" in refusal[0], log
        after = _committed_state(case.output)
        assert {k: after.get(k) for k in before} == before, "a refused attempt deleted or changed committed files"
        assert not list_files(case.output.child("_failed.json")), "a refused attempt left a failure note"

        waiter = _start_logged(["run", "--config", str(waiting)], wait_log)
        _wait_for(wait_log, f"waiting up to 600 s for the output lease held by pid {first.pid}", waiter, 120)
        os.killpg(first.pid, signal.SIGCONT)
        code, log = _finish(first, first_log, timeout=600)
        assert code == 0, log
        code, log = _finish(waiter, wait_log, timeout=120)
        assert code == 0, log
        assert f"{shards}/{shards} shards already committed" in log, log  # it resumed after the first: nothing to redo
    finally:
        for process in (first, waiter):
            if process is not None:
                _kill_group(process)

    expected = [r["id"] for r in INVALID + VALID]
    assert sorted(_ids(case.output)) == sorted(expected), "a row was lost or doubled"
    summary = json.loads(read_bytes(case.output.child("summary.json")))
    assert (summary["rows_in"], summary["rows_ok"], summary["rows_failed"]) == (len(expected), len(VALID), len(INVALID))
    assert summary["shards"] == shards
    assert summary["attempts"] == 2  # the first and the waiter; the refused ones recorded nothing
    assert not list_files(case.output.child("_lease.json")), "the lease was not released"


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")
