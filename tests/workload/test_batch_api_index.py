"""The batches' indexes (batch_index.py, issue 61): a tick and a `GET /v1/batches` page cost what is open and what
the page shows, not how many batches have finished; the open-batches index comes back when lost; finished
batches go after the retention, a bounded number a tick, oldest finish first. On both stores: a folder, and a
bucket on a moto server (reads counted by botocore's own events, store_reads.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.workload.store_reads import CountingStore, count_s3_requests, reads, seed_moto, write_finished
from tests.workload.test_batch_api import Clock, Recorder
from workload.batch_api import scheduler
from workload.batch_api.batch_index import DONE_KIND, OPEN_ID, ORDER_KIND, STRAY_S, OpenBatches, order_id
from workload.batch_api.models import BatchRecord
from workload.batch_api.objects import Limits
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore, Store

NOW = 1_800_000_000
LINE_URL = "/v1/chat/completions"
KINDS = ("batch", ORDER_KIND, DONE_KIND)  # what a finished batch writes
LAYER_MADE = 100  # finished batches made through BatchBook.create; the pages show them in order among the rest
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'


def _finished(number: int, done_at: int) -> BatchRecord:
    """A batch that completed at `done_at`, made the day before (its window is a day)."""
    created = done_at - 86400 + number % 3600
    return BatchRecord(
        id=f"batch_{number:024x}", endpoint="/v1/chat/completions", model="m", input_file_id="file-x",
        completion_window="24h", created_at=created, expires_at=created + 86400, owner="p", seq=number,
        input_key="files/x.jsonl", output_key=f"batches/batch_{number:024x}/output", status="completed",
        completed_at=done_at, done_at=done_at,
    )  # fmt: skip


def _add_finished(service: BatchService, start: int, stop: int) -> None:
    for number in range(start, stop):
        service.batches.create(_finished(number, NOW))


def _moto_store(endpoint: str) -> tuple[S3Store, Any, str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"index-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    return S3Store(client, bucket, "batch-api/"), client, bucket


def test_a_tick_and_a_page_read_the_same_at_0_1000_and_10000_finished_batches(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first 100 records are made through the records layer in a folder, the rest written straight, as it
    # writes them (store_reads.write_finished: a tenth of the time), then copied into the bucket by key. fsync is
    # what makes a local write survive a crash, which this test does not make, and it costs a second per 1,000.
    monkeypatch.setattr("os.fsync", lambda _fd: None)
    local = CountingStore(LocalStore(tmp_path / "data"))
    s3, client, bucket = _moto_store(moto_endpoint)
    s3_counts = count_s3_requests(client)
    clock = Clock()
    clock.now = NOW + 3600.0  # before the retention: the tick deletes nothing
    services = {
        "local": (BatchService(local, Recorder(), "m", clock=clock), local.counts),
        "moto": (BatchService(s3, Recorder(), "m", clock=clock), s3_counts),
    }
    for service, _ in services.values():
        service.tick()  # the first tick writes the open-batches index (from no batch)
    measured: dict[tuple[str, int], dict[str, Any]] = {}
    made, copied = 0, set[Path]()
    for size in (0, 1000, 10000):
        through_layer = min(size, LAYER_MADE)
        _add_finished(services["local"][0], min(made, through_layer), through_layer)
        write_finished(tmp_path / "data", (_finished(number, NOW) for number in range(max(made, LAYER_MADE), size)))
        # each batch: its record, its order marker and its retention marker
        assert seed_moto(tmp_path / "data", bucket, "batch-api/", KINDS, copied) == 3 * (size - made)
        made = size
        for name, (service, counts) in services.items():
            counts.clear()
            service.tick()
            service.statuses()  # the tick's metrics line (queue_metrics.py): the open batches as the tick left them
            tick = reads(counts)
            counts.clear()
            first = service.list_batches("p", None, 20)
            first_reads = reads(counts)
            counts.clear()
            second = service.list_batches("p", first["data"][-1]["id"], 20) if first["data"] else None
            measured[name, size] = {"tick": tick, "page": first_reads, "next page": reads(counts)}
            if size:  # the pages are the newest batches, in order, and go on where the first stopped
                newest = [f"batch_{number:024x}" for number in sorted(range(size), key=lambda n: (n % 3600, n))]
                newest.reverse()
                assert second is not None
                assert [b["id"] for b in first["data"] + second["data"]] == newest[:40], name
                assert first["has_more"] and second["has_more"]
    for name in services:
        at_zero = measured[name, 0]
        # At 0 finished batches the tick reads the index (1 GET) and lists the other kinds and the retention queue.
        assert at_zero["tick"]["GET"] == 1, (name, at_zero)
        for size in (1000, 10000):
            assert measured[name, size]["tick"] == at_zero["tick"], (name, size, measured)
            # a page: one listing of the order markers, its 20 batches and one more (has_more); the next page
            # reads the batch its cursor names too
            assert measured[name, size]["page"] == {"LIST": 1, "GET": 21}, (name, size, measured)
            assert measured[name, size]["next page"] == {"LIST": 1, "GET": 22}, (name, size, measured)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        local = LocalStore(tmp_path / "data")
        yield local
        local.close()
        return
    yield _moto_store(request.getfixturevalue("moto_endpoint"))[0]


def _service(store: Store, clock: Clock, retention_s: int = 30 * 86400) -> BatchService:
    return BatchService(store, Recorder(), "m", Limits(retention_s=retention_s), clock)


def test_a_lost_open_index_is_rebuilt_from_the_batches_once(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    service = _service(store, clock)
    source = service.upload_file("p", "in.jsonl", "batch", [LINE])
    first, second, cancelled = (service.create_batch("p", source["id"], LINE_URL, "24h") for _ in range(3))
    service.cancel_batch("p", cancelled["id"])  # queued: cancelled at once, so closed
    index = service.records.get(OpenBatches, OPEN_ID)
    assert index is not None and set(index.open) == {first["id"], second["id"]}
    store.delete(OpenBatches.KIND, OPEN_ID)
    service.tick()  # rebuilds it (one listing of the batches), then starts the oldest
    rebuilt = service.records.get(OpenBatches, OPEN_ID)
    assert rebuilt is not None and set(rebuilt.open) == {first["id"], second["id"]}
    assert service.get_batch("p", first["id"])["status"] == "in_progress"
    # The tick after reads the index, not the batches: the rebuild happened once.
    listed: list[str] = []
    every = store.records

    def records(kind: str) -> list[dict[str, Any]]:
        listed.append(kind)
        return every(kind)

    monkeypatch.setattr(store, "records", records)
    service.tick()
    assert listed and "batch" not in listed, listed


def test_a_page_drops_the_marker_of_a_create_that_died_once_no_create_can_still_write_it(store: Store) -> None:
    """A create writes the order marker before the batch; one that dies between leaves a marker naming nothing,
    which every page would read again for ever. Pages skip it, and the first page after STRAY_S deletes it."""
    clock = Clock()
    service = _service(store, clock)
    source = service.upload_file("p", "in.jsonl", "batch", [LINE])
    kept = service.create_batch("p", source["id"], LINE_URL, "24h")
    died = _finished(7, int(clock.now))
    died.created_at = int(clock.now)  # made now: its create wrote the marker, then died
    service.batches.index.listed(died)
    assert service.list_batches("p", None, 10)["data"] == [service.get_batch("p", kept["id"])]
    assert order_id(died) in store.ids(ORDER_KIND, None, 10)  # a create under way may still write its batch
    clock.now += STRAY_S
    assert [b["id"] for b in service.list_batches("p", None, 10)["data"]] == [kept["id"]]
    assert store.ids(ORDER_KIND, None, 10) == [order_id(service.batches.get(kept["id"]))]


def test_finished_batches_go_after_the_retention_a_bounded_number_a_tick_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the folder only: the retention's listing on S3 is the counting test's, and S3Store's deletes are the
    store contract's (test_batch_api_store.py); a moto run here would add 3 s for nothing new."""
    monkeypatch.setattr(scheduler, "RETENTION_PER_TICK", 2)
    store = LocalStore(tmp_path / "data")
    clock = Clock()
    service = _service(store, clock, retention_s=7 * 86400)
    service.tick()
    # three finished a day apart, oldest finish first: 0, 1, 2
    finished = [_finished(number, NOW - (3 - number) * 86400) for number in range(3)]
    for record in finished:
        service.batches.create(record)
        store.write_blob(f"{record.output_key}/output.jsonl", [b"{}\n"])
    assert [b["id"] for b in service.list_batches("p", None, 10)["data"]] == [r.id for r in reversed(finished)]
    clock.now = NOW - 3 * 86400 + 7 * 86400 + 86400.0  # the first two are past the retention
    service.tick()  # deletes both (the bound is 2)
    assert [service.batches.get(r.id) is None for r in finished] == [True, True, False]
    assert [b["id"] for b in service.list_batches("p", None, 10)["data"]] == [finished[2].id]
    assert store.blob_size(f"{finished[0].output_key}/output.jsonl") is None
    assert store.blob_size(f"{finished[2].output_key}/output.jsonl") is not None
    assert store.ids(ORDER_KIND, None, 10) == [order_id(finished[2])]
    assert len(store.ids(DONE_KIND, None, 10)) == 1
    clock.now += 86400
    service.tick()
    assert service.list_batches("p", None, 10)["data"] == []
    assert store.ids(ORDER_KIND, None, 10) == [] and store.ids(DONE_KIND, None, 10) == []
