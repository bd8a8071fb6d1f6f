"""One attempt at a time per output: a lease beside the results, taken before any work and renewed while it lives.

Protocol (`_lease.json` under the output URI; local and S3 alike, through storage's compare-and-swap):
- take: create the file only if absent (S3 If-None-Match: *, locally an exclusive link); if it exists and its
  `expires_at` has passed (plus a clock-skew allowance), replace it only if unchanged since read (If-Match);
- live holder found: refuse at once naming host, pid, start and expiry, or wait for it (`resume.lease_wait_s`);
  a holder on this same machine and pid namespace whose process is gone (killed) counts as expired at once;
- renew: every third of the TTL, replace the file only if it is still the version this attempt wrote;
- lose: a renewal that finds another version, or no renewal for so long that the expiry is near, marks the lease
  lost; `check()` (called before every write or delete of the output) then raises and nothing more is written;
- release: delete the file only if it is still this attempt's version.

The holder judges its own expiry by CLOCK_BOOTTIME from the moment it sent the write (a monotonic clock that, unlike
CLOCK_MONOTONIC, keeps counting while the machine is suspended: a laptop lid closed or a VM frozen past the TTL
wakes up knowing its lease is gone), and stops writing a quarter-TTL before it; every S3 call ends within
storage.S3_CALL_BOUND_S, inside that quarter at the default TTL. A taker judges by its wall clock against
`expires_at`, plus CLOCK_SKEW_S. What a holder paused between its check and its request can still send is made
harmless by the output's own fence (workload/job/output.py).

A conditional write whose reply is lost (the PUT was applied, the connection dropped) is retried by boto3 with the
same condition and answered 412: before reading that as someone else's lease, the attempt compares the record it
finds with its own (token and renewal time), and a match is its own write.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from workload.files.storage import (
    S3_CALL_BOUND_S,
    Location,
    StorageError,
    WriteConflict,
    delete_if,
    read_versioned,
    write_if,
)

LEASE = "_lease.json"


def _clock() -> float:
    """Seconds on a clock that never goes back and counts through suspend (CLOCK_BOOTTIME; monotonic elsewhere)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


CLOCK_SKEW_S = 5.0  # how far two hosts' clocks may disagree (NTP keeps EC2 within milliseconds)


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _machine() -> str | None:
    """This boot of this kernel and this pid namespace: where a pid names one process (None off Linux)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}" if boot else None


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process, or a zombie): with the pid, it
    names one process even after the pid is reused."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold spaces
    return None if fields[0] == "Z" else fields[19]


class LeaseHeldError(RuntimeError):
    """Another live attempt holds the output's lease; this one touched nothing."""


class LeaseLostError(RuntimeError):
    """This attempt no longer holds the output's lease; it must write and delete nothing more."""


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class LeaseRecord:
    host: str
    pid: int
    token: str  # tells two attempts of the same host and pid apart (a container restart reuses pid 1)
    started_at: str
    renewed_at: str
    expires_at: str
    ttl_s: float
    machine: str | None = None  # see _machine(); lets an attempt on the same machine see that the holder died
    process_start: str | None = None

    def expires(self) -> datetime:
        return datetime.fromisoformat(self.expires_at)

    def holder_is_gone(self) -> bool:
        """True only when certain: the holder ran in this machine's pid namespace and its process no longer runs."""
        if self.machine is None or self.machine != _machine():
            return False
        return _process_start(self.pid) != self.process_start

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started_at}, lease expires {self.expires_at}"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord | None:
        """None for a file that is not a lease record (treated as expired: it can protect nothing)."""
        try:
            value = json.loads(data)
            known = {name: value[name] for name in cls.__dataclass_fields__ if name in value}
            return cls(**known)  # a newer version's extra fields are ignored, not taken for a broken lease
        except (ValueError, TypeError, AttributeError):
            return None


class OutputLease:
    """The lease of one attempt on one output root. `acquire`, then `start_renewing`; `check` before each write."""

    def __init__(self, root: Location, ttl_s: float, clock_skew_s: float = CLOCK_SKEW_S) -> None:
        self.location = root.child(LEASE)
        self.ttl_s, self.clock_skew_s = ttl_s, clock_skew_s
        self.token = uuid.uuid4().hex
        self.started_at = _iso(datetime.now(UTC))
        self._version: str | None = None
        self._valid_until = 0.0  # on _clock()
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # renewals (thread) and release (main) never interleave

    # --- taking it ----------------------------------------------------------------------------------------
    def _record(self) -> LeaseRecord:
        now = datetime.now(UTC)
        return LeaseRecord(
            host=socket.gethostname(),
            pid=os.getpid(),
            token=self.token,
            started_at=self.started_at,
            renewed_at=_iso(now),
            expires_at=_iso(now + timedelta(seconds=self.ttl_s)),
            ttl_s=self.ttl_s,
            machine=_machine(),
            process_start=_process_start(os.getpid()),
        )

    def _write(self, expected_version: str | None) -> None:
        sent = _clock()
        record = self._record()
        try:
            self._version = write_if(self.location, record.encode(), expected_version)
        except WriteConflict:
            version = self._own_write(record)
            if version is None:
                raise
            self._version = version
        self._valid_until = sent + self.ttl_s

    def _own_write(self, record: LeaseRecord) -> str | None:
        """The version of the lease file if it holds `record` itself (a write applied whose reply was lost)."""
        current = read_versioned(self.location)
        found = LeaseRecord.decode(current[0]) if current else None
        if current is None or found is None or found.token != self.token or found.renewed_at != record.renewed_at:
            return None
        return current[1]

    def _try_take(self) -> LeaseRecord | None:
        """Take the lease if it is free or expired; otherwise return the live holder."""
        while True:
            current = read_versioned(self.location)
            try:
                if current is None:
                    self._write(None)
                    return None
                holder = LeaseRecord.decode(current[0])
                skew = timedelta(seconds=self.clock_skew_s)
                if holder is not None and datetime.now(UTC) < holder.expires() + skew and not holder.holder_is_gone():
                    return holder
                # Expired, unreadable, or its holder died here: replace it, unless someone else just did.
                self._write(current[1])
                return None
            except WriteConflict:
                continue  # another attempt moved first: read again and judge its lease

    def acquire(self, wait_s: float = 0.0, poll_s: float = 2.0) -> None:
        """Take the lease, or raise LeaseHeldError naming the holder (after waiting up to `wait_s` for it)."""
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            holder = self._try_take()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                waited = f" (waited {wait_s:g} s)" if wait_s else ""
                raise LeaseHeldError(
                    f"{self.location.uri} is held by another live attempt: {holder.describe()}{waited}; "
                    "this attempt changed nothing"
                )
            if not announced:
                print(
                    f"[llm-batch] waiting up to {wait_s:g} s for the output lease held by {holder.describe()}",
                    file=sys.stderr,
                    flush=True,
                )
                announced = True
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    # --- keeping it ---------------------------------------------------------------------------------------
    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            print(f"[llm-batch] lease on {self.location.uri} lost: {reason}", file=sys.stderr, flush=True)

    def renew(self) -> None:
        """Push the expiry one TTL on; raises LeaseLostError when someone else's lease (or none) is there."""
        with self._lock:
            if self._lost is not None:
                raise LeaseLostError(self._lost)
            try:
                self._write(self._version)
            except WriteConflict as error:
                current = read_versioned(self.location)
                holder = LeaseRecord.decode(current[0]) if current else None
                self._lose(f"now held by {holder.describe()}" if holder else "the lease file was removed")
                raise LeaseLostError(self._lost) from error

    def check(self) -> None:
        """Raise LeaseLostError unless the lease is certainly still ours for long enough to finish one write.

        Late (no renewal for three quarters of the TTL: a laptop that slept, a paused VM, a store that did not
        answer), it renews first: a write conditional on this attempt's own version succeeds only while nobody
        else has written the lease, so a lease that is still ours is kept, and only one that is not, or a store
        that cannot be reached, ends the attempt."""
        if self._lost is None and _clock() > self._valid_until - self.ttl_s / 4:
            try:
                self.renew()
            except LeaseLostError:
                pass  # renew said whose it is now
            except Exception as error:  # storage unreachable: it may expire and be taken over meanwhile
                self._lose(f"not renewed for {self.ttl_s * 3 / 4:.0f} s ({error}); it may be taken over")
        if self._lost is not None:
            raise LeaseLostError(f"lease on {self.location.uri} lost: {self._lost}")

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        while not self._stop.wait(interval):
            try:
                self.renew()
                interval = self.ttl_s / 3
            except LeaseLostError:
                return
            except Exception as error:  # this thread must outlive any one failed renewal
                # A transient failure (storage, network, or an error type no one mapped to StorageError): retry
                # soon; `check` declares the lease lost if this goes on. Ending the thread here would let a live
                # job's lease lapse for good over one odd exception.
                print(f"[llm-batch] lease renewal failed, retrying: {error!r}", file=sys.stderr, flush=True)
                interval = min(2.0, self.ttl_s / 10)
            if _clock() > self._valid_until - self.ttl_s / 4:
                try:
                    self.check()
                except LeaseLostError:
                    return

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="llm-batch-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours (a lost one belongs to someone else now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._lost is not None or self._version is None:
                return
            try:
                delete_if(self.location, self._version)
            except WriteConflict:
                pass  # taken over after our expiry: not ours to delete
            except StorageError as error:  # it expires by itself; a failed delete only delays the next attempt
                print(f"[llm-batch] could not release the lease (it expires by itself): {error}", file=sys.stderr)
            self._version = None


@contextmanager
def hold_lease(root: Location, ttl_s: float, wait_s: float = 0.0) -> Iterator[OutputLease]:
    """Take the output's lease (or raise LeaseHeldError), keep it renewed inside the block, release it after."""
    if root.is_s3 and ttl_s / 4 < S3_CALL_BOUND_S:
        print(
            f"[llm-batch] a lease TTL of {ttl_s:g} s leaves {ttl_s / 4:g} s between the holder's last write and its "
            f"expiry, less than one S3 call may take ({S3_CALL_BOUND_S:g} s); the output's fence still holds, "
            "but a slow call may be abandoned as a lost lease",
            file=sys.stderr,
        )
    lease = OutputLease(root, ttl_s)
    lease.acquire(wait_s)
    lease.start_renewing()
    try:
        yield lease
    finally:
        lease.release()
