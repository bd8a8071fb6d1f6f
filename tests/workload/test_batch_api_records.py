"""The typed records load what the untyped code wrote, and write it back as it was: the stored format is unchanged.

The records in tests/workload/data/batch_api_records/ were written by the Batch API as of commit 1e5a373, before
its records were typed (make_records.py there says how): every kind (file, batch, upload, night) in every state
that code leaves one in. Each is put, byte for byte, into a LocalStore folder and into an S3Store bucket (a moto
server), read back through the records layer, and must come out with every private field typed, the same JSON
when stored again, and OpenAI's object when answered; then a service over them answers and ticks.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.workload.test_batch_api import Clock
from tests.workload.test_batch_api_metrics import Scripted
from workload.batch_api.models import BatchRecord, FileRecord, NightEntry, Record, UploadRecord
from workload.batch_api.records import Records
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore, Store

WRITTEN_BEFORE = Path(__file__).parent / "data" / "batch_api_records"
MODELS: dict[str, type[Record]] = {model.KIND: model for model in (FileRecord, BatchRecord, UploadRecord, NightEntry)}


def _written(kind: str) -> dict[str, bytes]:
    return {path.stem: path.read_bytes() for path in sorted((WRITTEN_BEFORE / kind).glob("*.json"))}


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Both stores, holding the old records as the old code left them (the same bytes)."""
    if request.param == "local":
        local = LocalStore(tmp_path / "data")
        for kind in MODELS:
            (local.root / "records" / kind).mkdir(parents=True)
            for object_id, raw in _written(kind).items():
                (local.root / "records" / kind / f"{object_id}.json").write_bytes(raw)
        yield local
        local.close()
        return
    client = boto3.client("s3", endpoint_url=request.getfixturevalue("moto_endpoint"), region_name="us-east-1")
    bucket = f"records-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    for kind in MODELS:
        for object_id, raw in _written(kind).items():
            client.put_object(Bucket=bucket, Key=f"batch-api/records/{kind}/{object_id}.json", Body=raw)
    yield S3Store(client, bucket, "batch-api/")


def test_every_old_record_loads_typed_and_is_stored_as_it_was(store: Store) -> None:
    records = Records(store, Clock())
    for kind, model in MODELS.items():
        written = {object_id: json.loads(raw) for object_id, raw in _written(kind).items()}
        loaded = {record.id: record for record in records.all(model)}
        assert sorted(loaded) == sorted(written) and written, kind
        for object_id, record in loaded.items():
            old = written[object_id]
            assert record.model_extra == {}, f"{kind} {object_id}: fields the types do not name"
            assert record.stored() == old, f"{kind} {object_id}: stored differently"
            assert record.public() == {k: v for k, v in old.items() if not k.startswith("_")}
    statuses = {record.status for record in records.all(BatchRecord)}
    assert statuses == {"validating", "cancelling", "completed", "failed", "cancelled"}
    swept = [record for record in records.all(BatchRecord) if record.output_deleted]
    assert len(swept) == 1 and swept[0].done_at is not None and swept[0].seq > 0


def test_a_service_over_old_records_answers_and_moves_them_on(store: Store) -> None:
    for file in Records(store).all(FileRecord):  # the bodies the old code wrote beside its records
        store.write_blob(file.key, [b"x" * file.bytes])
    service = BatchService(store, Scripted(), "llm-batch", clock=Clock())
    batches = service.list_batches("p", None, 100)["data"]
    assert len(batches) == len(_written("batch"))
    completed = next(batch for batch in batches if batch["status"] == "completed")
    assert completed["usage"]["total_tokens"] == 28 and completed["llm_batch"]["job_wall_s"] == 81.5
    assert {f["purpose"] for f in service.list_files("p", None, 100, "asc", None)["data"]} == {"batch", "batch_output"}
    service.tick()  # the cancelling one's run is stopped and it closes; the queued one starts
    after = {batch["id"]: batch["status"] for batch in service.list_batches("p", None, 100)["data"]}
    moved = {b["status"]: after[b["id"]] for b in batches if b["status"] in ("cancelling", "validating")}
    assert moved == {"cancelling": "cancelled", "validating": "in_progress"}
    assert service.get_batch("p", completed["id"]) == completed  # a closed batch is left as it was
