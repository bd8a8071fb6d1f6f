"""The output lease on local files and on a real S3-speaking server (moto over HTTP, with its conditional writes):
take, renew, expire, refuse, wait, lose; and an output store whose lease is lost writes nothing more."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from tests.lost_reply import LostReplyProxy, serving
from workload.files.storage import (
    Location,
    StorageError,
    list_files,
    locate,
    read_bytes,
    read_versioned,
    write_bytes_atomic,
)
from workload.job import lease as lease_module
from workload.job.lease import LEASE, LeaseHeldError, LeaseLostError, LeaseRecord, OutputLease, hold_lease
from workload.job.output import OutputStore


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path) -> Iterator[Location]:
    if request.param == "local":
        yield locate(str(tmp_path / "out"))
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield locate(f"s3://{bucket}/night/2026-11-30")


def _holder(root: Location) -> LeaseRecord:
    current = read_versioned(root.child(LEASE))
    assert current is not None, "no lease file"
    record = LeaseRecord.decode(current[0])
    assert record is not None
    return record


def test_take_then_a_second_attempt_is_refused_naming_the_holder(root: Location) -> None:
    first = OutputLease(root, ttl_s=30)
    first.acquire()
    record = _holder(root)
    assert record.token == first.token and record.ttl_s == 30

    with pytest.raises(LeaseHeldError) as refused:
        OutputLease(root, ttl_s=30).acquire()
    message = str(refused.value)
    assert "\n" not in message
    for part in (f"pid {record.pid}", record.host, record.started_at, record.expires_at):
        assert part in message
    assert _holder(root).token == first.token  # the refused attempt changed nothing

    first.release()
    assert read_versioned(root.child(LEASE)) is None
    OutputLease(root, ttl_s=30).acquire()  # free again


def test_renew_pushes_the_expiry_and_keeps_others_out(root: Location) -> None:
    lease = OutputLease(root, ttl_s=30)
    lease.acquire()
    before = _holder(root)
    time.sleep(0.05)
    lease.renew()
    after = _holder(root)
    assert after.token == before.token and after.expires() > before.expires()
    lease.check()
    with pytest.raises(LeaseHeldError):
        OutputLease(root, ttl_s=30).acquire()


def test_an_expired_lease_is_taken_over_and_its_old_holder_has_lost_it(root: Location) -> None:
    old = OutputLease(root, ttl_s=0.5, clock_skew_s=0.0)
    old.acquire()  # and never renewed: a dead attempt
    time.sleep(0.6)
    new = OutputLease(root, ttl_s=30, clock_skew_s=0.0)
    new.acquire()
    assert _holder(root).token == new.token

    with pytest.raises(LeaseLostError, match=f"pid {_holder(root).pid}"):
        old.renew()
    with pytest.raises(LeaseLostError):
        old.check()
    old.release()  # must not delete the new holder's lease
    assert _holder(root).token == new.token


def test_a_holder_killed_on_this_machine_frees_the_lease_at_once(root: Location) -> None:
    # A real attempt process takes the lease and dies without releasing it (as SIGKILL leaves it).
    script = (
        "import os, sys; from workload.job.lease import OutputLease; "
        "from workload.files.storage import locate; "
        "OutputLease(locate(sys.argv[1]), ttl_s=300).acquire(); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", script, root.uri], check=True, timeout=60)
    dead = _holder(root)
    assert dead.expires() > datetime.now(UTC) + timedelta(seconds=200), "the dead holder's lease is still live"
    written = read_bytes(root.child(LEASE))

    # Seen from another machine nobody can tell that the holder died: the lease holds until it expires.
    elsewhere = {**json.loads(written), "machine": "another-boot/pid:[4026531836]"}
    write_bytes_atomic(root.child(LEASE), json.dumps(elsewhere).encode())
    with pytest.raises(LeaseHeldError):
        OutputLease(root, ttl_s=30).acquire()

    write_bytes_atomic(root.child(LEASE), written)
    lease = OutputLease(root, ttl_s=30)
    lease.acquire()  # on the holder's own machine its process is gone: no wait for the expiry
    assert _holder(root).token == lease.token


def test_a_late_holder_renews_a_lease_still_its_own_and_stops_when_it_cannot(
    root: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = OutputLease(root, ttl_s=0.5, clock_skew_s=0.0)
    lease.acquire()
    lease.check()
    first = _holder(root).renewed_at
    time.sleep(0.6)  # past the TTL without a renewal (a laptop asleep); nobody took the lease meanwhile
    lease.check()  # still its own: renewed, not lost
    assert _holder(root).renewed_at != first and _holder(root).token == lease.token
    time.sleep(0.4)  # late again, and now the store cannot be reached: too close to expiry to start a write

    def unreachable(*args: object, **kwargs: object) -> str:
        raise StorageError("connection refused")

    monkeypatch.setattr(lease_module, "write_if", unreachable)
    with pytest.raises(LeaseLostError, match="not renewed"):
        lease.check()


def test_a_waiting_attempt_takes_the_lease_once_the_holder_releases_it(root: Location) -> None:
    holder = OutputLease(root, ttl_s=30)
    holder.acquire()
    threading.Timer(0.5, holder.release).start()
    waiter = OutputLease(root, ttl_s=30)
    started = time.monotonic()
    waiter.acquire(wait_s=20, poll_s=0.1)
    assert 0.45 < time.monotonic() - started < 10
    assert _holder(root).token == waiter.token

    with pytest.raises(LeaseHeldError, match=r"waited 0.5 s"):
        OutputLease(root, ttl_s=30).acquire(wait_s=0.5, poll_s=0.1)


def test_background_renewal_keeps_a_short_lease_alive(root: Location) -> None:
    with hold_lease(root, ttl_s=0.9) as lease:
        time.sleep(1.5)  # longer than the TTL: only the renewals keep it
        lease.check()
        with pytest.raises(LeaseHeldError):
            OutputLease(root, ttl_s=0.9, clock_skew_s=0.0).acquire()
    assert read_versioned(root.child(LEASE)) is None  # released on the way out


def test_renewal_survives_an_unexpected_error_and_keeps_the_lease(
    root: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that fails with an error nobody mapped to StorageError is retried, not the end of the renewals."""
    with hold_lease(root, ttl_s=0.9) as lease:
        upstream = lease.renew
        failures = []

        def flaky() -> None:
            if not failures:
                failures.append(1)
                raise RuntimeError("an odd error from the storage client")
            upstream()

        monkeypatch.setattr(lease, "renew", flaky)
        time.sleep(1.8)  # two TTLs: only renewals after the failed one keep it
        lease.check()
        assert failures == [1]
        with pytest.raises(LeaseHeldError):
            OutputLease(root, ttl_s=0.9, clock_skew_s=0.0).acquire()


def test_a_broken_lease_is_noticed_by_the_renewals_and_the_store_writes_nothing_more(root: Location) -> None:
    with hold_lease(root, ttl_s=0.9) as lease:
        store = OutputStore(root.uri, guard=lease.check)
        store.write_manifest({"attempts": []})
        stray = root.child("_pending", "results", "part-000001.parquet")  # recover() would delete it
        write_bytes_atomic(stray, b"a killed attempt's part")
        # Someone breaks the lease (an operator, or an attempt whose clock ran ahead) and writes their own.
        intruder = json.loads(read_bytes(root.child(LEASE)))
        intruder.update(token="someone-else", host="other-host", pid=4242)
        write_bytes_atomic(root.child(LEASE), json.dumps(intruder).encode())
        time.sleep(0.6)  # more than one renewal interval (ttl / 3)
        with pytest.raises(LeaseLostError, match="pid 4242 on other-host"):
            lease.check()
        before = sorted(f.uri for f in list_files(root))
        with pytest.raises(LeaseLostError):
            store.commit_shard(0, None, [{"id": "a", "error_type": "x"}], _STATS, attempt=1)
        with pytest.raises(LeaseLostError):
            store.recover()
        with pytest.raises(LeaseLostError):
            store.reset({"attempts": []})
        assert sorted(f.uri for f in list_files(root)) == before
    assert _holder(root).token == "someone-else"  # the lost holder did not delete the new lease


_STATS = {"rows_ok": 0, "rows_failed": 1, "input_tokens": 0, "output_tokens": 0, "error_types": {"x": 1}}


@pytest.fixture
def lossy(root: Location) -> Iterator[LostReplyProxy | None]:
    """Local: None (the lost reply is stood in for in the test). S3: the suite's lost-reply proxy
    (tests/lost_reply.py), and boto3 pointed at it."""
    if not root.is_s3:
        yield None
        return
    import os

    with serving(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        yield proxy


def _lose_next_reply(lossy: LostReplyProxy | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if lossy is not None:
        lossy.lose("PUT", LEASE)
        return
    # A local write has no reply to lose: the next conditional write is applied, then answered as the retried
    # request would be (WriteConflict, the condition no longer holding). The S3 case loses a real reply.
    from workload.files.storage import WriteConflict

    upstream = lease_module.write_if

    def applied_then_conflict(location: Location, data: bytes, version: str | None) -> str:
        monkeypatch.setattr(lease_module, "write_if", upstream)
        upstream(location, data, version)
        raise WriteConflict(f"{location.uri} changed under a conditional write (412 on the retry)")

    monkeypatch.setattr(lease_module, "write_if", applied_then_conflict)


def test_a_lease_write_whose_reply_was_lost_is_recognised_as_its_own(
    root: Location, lossy: LostReplyProxy | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = OutputLease(root, ttl_s=30)
    _lose_next_reply(lossy, monkeypatch)
    lease.acquire()  # not refused naming its own pid
    assert _holder(root).token == lease.token

    before = _holder(root)
    time.sleep(0.01)
    _lose_next_reply(lossy, monkeypatch)
    lease.renew()  # not "lost: now held by" itself
    lease.check()
    assert _holder(root).token == lease.token and _holder(root).renewed_at > before.renewed_at
    lease.renew()  # and its version is the one now stored: the next renewal succeeds too
    if lossy is not None:
        assert len(lossy.dropped) == 2 and lossy.armed() == 0
    lease.release()
    assert read_versioned(root.child(LEASE)) is None
