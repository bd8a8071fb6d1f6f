"""The Batch API's store on the AWS tiers: the stack's bucket, under one prefix (`batch-api/` by default).

The same keys as `LocalStore` (store.py), so the service, its scheduler and the job see one layout:
- a record is one JSON object; its version is the object's ETag, and `put` is an S3 conditional write
  (`IfNoneMatch="*"` creates, `IfMatch=<ETag>` changes). Two fronts (two Lambda invocations, or a front and the
  scheduled tick) changing one batch never lose each other's write: the loser gets `PreconditionFailed` (412) or
  `ConditionalRequestConflict` (409), which is `StoreConflict`, and the service reads again and redoes it.
- a body is written by multipart upload in `PART_BYTES` parts, `UPLOADERS` at once, so a 200 MB file never sits
  in memory (at most `UPLOADERS` parts do); it appears only when the upload completes (all or nothing), and a
  failed write aborts the upload (no parts left to pay for). A complete whose reply is lost is retried by botocore
  and S3 answers the repeat with the same object (idempotent; tests/workload/test_lost_replies.py holds it).

Listing: `records(kind)` lists `records/<kind>/` (1,000 keys a page) and reads the objects `READERS` at a time;
`ids(kind, after, limit)` is one ListObjectsV2 (`StartAfter`, `MaxKeys`) and reads nothing. Batches are never
listed whole: the tick reads the open-batches index and the pages read the ordered ids (batch_index.py).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit

from workload.batch_api.store import CHUNK, StoreConflict, Versioned, check_id, check_ids_limit

PART_BYTES = 8 * 1024 * 1024  # S3's multipart minimum is 5 MiB (but the last part); 8 MiB keeps memory small
READERS = 16
UPLOADERS = 8  # parts of one body in flight at once: at most 64 MiB held
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
# The metadata key of each write's nonce; the same name as the job's (workload/files/storage.py), which this layer
# may not import.
WRITE_ID = "llm-batch-write-id"


SIGV4 = "s3v4"


def s3_client(session: Any, **kwargs: Any) -> Any:
    """The S3 client the store needs: SigV4 for every request and every presigned URL (`download_url`)."""
    from botocore.config import Config

    return session.client("s3", config=Config(signature_version=SIGV4), **kwargs)


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store:
    """Records and bodies in `s3://bucket/prefix`; `kms_key_id`: encrypt what it writes with the stack's key."""

    def __init__(self, client: Any, bucket: str, prefix: str = "batch-api/", kms_key_id: str | None = None) -> None:
        if not bucket:
            raise ValueError("the Batch API's bucket is not set")
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"the Batch API's prefix must end with '/', got {prefix!r}")
        self.s3, self.bucket, self.prefix = client, bucket, prefix
        self._encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key_id} if kms_key_id else {}

    def close(self) -> None:
        """Nothing to release: S3 needs no lock (conditional writes stand in for it)."""

    def _key(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"not a key under the store: {key!r}")
        return self.prefix + key

    def _record_key(self, kind: str, object_id: str) -> str:
        return f"{self.prefix}records/{kind}/{check_id(object_id)}.json"

    # ---- records -----------------------------------------------------------------------------------------------

    def get(self, kind: str, object_id: str) -> Versioned | None:
        try:
            found = self.s3.get_object(Bucket=self.bucket, Key=self._record_key(kind, object_id))
        except ValueError:
            return None
        except self.s3.exceptions.ClientError as error:
            if _code(error) in _MISSING_CODES:
                return None
            raise
        return Versioned(json.loads(found["Body"].read()), str(found["ETag"]))

    def put(self, kind: str, record: dict[str, Any], expected: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        key = self._record_key(kind, record["id"])
        # A nonce per write: when a reply is lost and botocore retries with the same condition, the retry's 412 is
        # this write having applied, not a rival's (the same rule as the job's output, workload/files/storage.py).
        write_id = uuid.uuid4().hex
        try:
            written = self.s3.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=json.dumps(record, sort_keys=True).encode(),
                ContentType="application/json",
                Metadata={WRITE_ID: write_id},
                **condition,
                **self._encryption,
            )
        except self.s3.exceptions.ClientError as error:
            # A change to a record deleted meanwhile answers NoSuchKey: it changed too.
            if _code(error) in _CONFLICT_CODES | _MISSING_CODES:
                own = self._own_version(key, write_id)
                if own is not None:
                    return own
                raise StoreConflict(f"{kind} {record['id']} changed since it was read") from None
            raise
        return str(written["ETag"])

    def _own_version(self, key: str, write_id: str) -> str | None:
        """The record's ETag if what is stored is the write that carried `write_id`, else None."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.ClientError:
            return None
        return str(head["ETag"]) if head.get("Metadata", {}).get(WRITE_ID) == write_id else None

    def delete(self, kind: str, object_id: str) -> None:
        with contextlib.suppress(ValueError):
            self.s3.delete_object(Bucket=self.bucket, Key=self._record_key(kind, object_id))

    def records(self, kind: str) -> list[dict[str, Any]]:
        keys = sorted(self._list(f"{self.prefix}records/{kind}/"))

        def read(key: str) -> dict[str, Any] | None:
            try:
                return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
            except self.s3.exceptions.ClientError as error:
                if _code(error) in _MISSING_CODES:  # deleted between the listing and the read
                    return None
                raise

        with ThreadPoolExecutor(max_workers=READERS) as pool:
            return [record for record in pool.map(read, keys) if record is not None]

    def ids(self, kind: str, after: str | None, limit: int) -> list[str]:
        folder = f"{self.prefix}records/{kind}/"
        asked: dict[str, Any] = {"Bucket": self.bucket, "Prefix": folder, "MaxKeys": check_ids_limit(limit)}
        if after is not None:
            asked["StartAfter"] = f"{folder}{check_id(after)}.json"
        listed = self.s3.list_objects_v2(**asked)
        keys = [str(item["Key"]).removeprefix(folder) for item in listed.get("Contents", [])]
        return [key.removesuffix(".json") for key in keys if key.endswith(".json")]

    def _list(self, prefix: str) -> Iterator[str]:
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield str(item["Key"])

    # ---- bodies ------------------------------------------------------------------------------------------------

    def write_blob(self, key: str, chunks: Iterable[bytes]) -> int:
        full = self._key(key)
        buffer, size, upload_id = bytearray(), 0, None
        # Parts go up `UPLOADERS` at once (an Upload's complete has the front's 29 s for 200 MB), at most that many
        # held in memory; the part list is put in order at the end.
        sending: list[Future[dict[str, Any]]] = []
        pool = ThreadPoolExecutor(max_workers=UPLOADERS)

        def send(number: int, body: bytes) -> dict[str, Any]:
            sent = self.s3.upload_part(Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": sent["ETag"]}

        def queue(body: bytes) -> None:
            while sum(not future.done() for future in sending) >= UPLOADERS:
                wait([future for future in sending if not future.done()], return_when=FIRST_COMPLETED)
            sending.append(pool.submit(send, len(sending) + 1, body))

        try:
            for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                while len(buffer) >= PART_BYTES:
                    if upload_id is None:
                        started = self.s3.create_multipart_upload(Bucket=self.bucket, Key=full, **self._encryption)
                        upload_id = started["UploadId"]
                    queue(bytes(buffer[:PART_BYTES]))
                    del buffer[:PART_BYTES]
            if upload_id is None:  # under one part: one plain write
                self.s3.put_object(Bucket=self.bucket, Key=full, Body=bytes(buffer), **self._encryption)
                return size
            if buffer:
                queue(bytes(buffer))
            parts = [future.result() for future in sending]  # in part order; the first failure is raised
            self.s3.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            for future in sending:
                future.cancel()
            pool.shutdown(wait=True)  # no part lands after the abort below
            if upload_id is not None:
                with contextlib.suppress(Exception):
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            raise
        finally:
            pool.shutdown(wait=True)
        return size

    def read_blob(self, key: str) -> Iterator[bytes] | None:
        try:
            found = self.s3.get_object(Bucket=self.bucket, Key=self._key(key))
        except self.s3.exceptions.ClientError as error:
            if _code(error) in _MISSING_CODES:
                return None
            raise
        body = found["Body"]

        def chunks() -> Iterator[bytes]:
            with contextlib.closing(body):
                yield from body.iter_chunks(CHUNK)

        return chunks()

    def blob_size(self, key: str) -> int | None:
        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except self.s3.exceptions.ClientError as error:
            if _code(error) in _MISSING_CODES:
                return None
            raise

    def list_blobs(self, prefix: str) -> list[str]:
        return sorted(key.removeprefix(self.prefix) for key in self._list(self._key(prefix).rstrip("/") + "/"))

    def delete_blobs(self, prefix: str) -> None:
        full = self._key(prefix).rstrip("/")
        keys = [full, *self._list(full + "/")]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def download_url(self, key: str, expires_s: int = 3600) -> str:
        """A presigned GET of the body: how the front answers a download larger than its response limit.

        Signed SigV4 or refused: botocore presigns SigV2 by default in us-east-1 and us-west-2 (seen with botocore
        1.44.8, 2026-12-06, even where the client's `meta.config.signature_version` reads 's3v4'), and S3 refuses
        SigV2 for SSE-KMS objects, which every object here is (issue 60). So the URL itself is checked."""
        url = str(
            self.s3.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires_s
            )
        )
        if "X-Amz-Algorithm=AWS4-HMAC-SHA256" not in urlsplit(url).query:
            raise ValueError(
                "the S3 client presigns SigV2, which S3 refuses for SSE-KMS objects: build it with botocore's "
                "Config(signature_version='s3v4') (s3_store.s3_client)"
            )
        return url
