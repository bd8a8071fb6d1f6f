"""`Idempotency-Key` on `POST /v1/batches`: a retried create answers the batch its first try made.

A create whose HTTP reply is lost (a timeout, a reset, a front that died after writing) is sent again by the
client; without a key the second request is a second batch that runs and bills for one call. With a key, the
first create writes a claim (records/idempotency/<id>.json, its id a hash of the owner and the key, so a key is
never stored in the clear nor shared between tenants) naming the batch id it is about to create and a hash of the
request's parameters; only then the batch. A later create with the same key:
- finds the claim and answers that batch as it is now (the same id; its status may have moved on);
- or, sent with other parameters, is refused (400, OpenAI's error shape): a key names one request, not a slot.
A create that died between its claim and its batch leaves a claim whose batch does not exist; the retry creates
the batch under the claimed id, so the key still makes at most one batch. Two creates racing on one key: one
claim wins (a create-only write), the other reads it.

Claims are kept CLAIM_TTL_S (24 h, as OpenAI keeps its keys) and swept by the tick.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from workload.batch_api.models import Owned
from workload.batch_api.objects import ApiError, new_id
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict

CLAIM_TTL_S = 24 * 3600
MAX_KEY_CHARS = 255
HEADER = "Idempotency-Key"


class IdempotencyClaim(Owned):
    """A key's claim on the batch it made; never answered to a client."""

    KIND: ClassVar[str] = "idempotency"

    params: str  # a hash of the create's parameters
    batch_id: str
    expires_at: int


def check_key(key: Any) -> str | None:
    """The header's value, or None where none was sent; a 400 for one no client would mean."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise ApiError(400, f"the {HEADER} header must be 1 to {MAX_KEY_CHARS} printable characters", HEADER)
    return key


def params_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


class Claims:
    def __init__(self, records: Records) -> None:
        self.records = records

    @staticmethod
    def _id(owner: str, key: str) -> str:
        return "idem_" + hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()[:40]

    def claim(self, owner: str, key: str, params: str) -> tuple[str, bool]:
        """The batch id for this key, and whether this call made the claim (False: an earlier try did)."""
        claim_id = self._id(owner, key)
        now = self.records.now()
        for _ in range(2):
            found = self.records.get(IdempotencyClaim, claim_id)
            if found is not None and now < found.expires_at:
                if found.params != params:
                    raise ApiError(
                        400,
                        f"the {HEADER} header was already used with other parameters within "
                        f"{CLAIM_TTL_S // 3600} h; send a new key for a new request",
                        HEADER,
                        code="idempotency_key_reused",
                    )
                return found.batch_id, False
            if found is not None:  # past its time, not swept yet: the key is free again
                self.records.delete(IdempotencyClaim, claim_id)
            fresh = IdempotencyClaim(
                id=claim_id, created_at=now, seq=self.records.seq(), owner=owner, params=params,
                batch_id=new_id("batch"), expires_at=now + CLAIM_TTL_S,
            )  # fmt: skip
            try:
                self.records.create(fresh)
                return fresh.batch_id, True
            except StoreConflict:
                continue  # a racing create with the same key claimed it first: read its claim
        raise ApiError(409, f"another request with this {HEADER} is being made; retry it", HEADER)

    def sweep(self, now: int) -> None:
        for claim in self.records.all(IdempotencyClaim):
            if now >= claim.expires_at:
                self.records.delete(IdempotencyClaim, claim.id)
