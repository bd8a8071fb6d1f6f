"""Time an Upload's complete on moto: does a 200 MB Upload in the Lambda front's 4 MiB parts go together within the
front's 29 s (issue 60, finding 5)? One JSON line; exit 1 when the complete took longer than the budget.

    python tools/upload_complete_timing.py            # 200 MB (OpenAI's largest file), 48 parts of 4 MiB
    python tools/upload_complete_timing.py --mb 24

moto's timing, not S3's: moto answers in-process on this machine (its CPU bound, no network), where S3 from a
Lambda is bound by each request's latency, which the parallel reads and part uploads overlap. The parts are
generated JSONL bytes written through the service (as the front's part route writes them); the complete is timed
alone, and its file's md5 is checked against the parts'.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FRONT_BUDGET_S = 29  # API Gateway's HTTP API waits at most 30 s for the function (infra/components/batch_api.py)
PART_BYTES = 4 * 1024 * 1024  # the front's part size (lambda_front.FRONT_BODY_BYTES)
LINE = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'


@contextlib.contextmanager
def moto_s3() -> Iterator[Any]:
    """A moto server on loopback and a SigV4 S3 client to it (fake credentials, this process only)."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import boto3

        from workload.batch_api.s3_store import s3_client

        session = boto3.Session(aws_access_key_id="moto", aws_secret_access_key="moto", region_name="us-east-1")
        yield s3_client(session, endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        server.stop()


def time_complete(client: Any, total_bytes: int) -> dict[str, Any]:
    """Upload `total_bytes` in front-sized parts through the service over `client`'s S3, then time the complete."""
    from workload.batch_api.executor import LocalJobExecutor
    from workload.batch_api.s3_store import S3Store
    from workload.batch_api.service import BatchService

    bucket = "upload-timing"
    client.create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory() as runs:
        # The real local executor stands idle: nothing here starts a batch.
        service = BatchService(S3Store(client, bucket), LocalJobExecutor({}, Path(runs)), "llm-batch")
        create = {"bytes": total_bytes, "filename": "big.jsonl", "mime_type": "application/jsonl", "purpose": "batch"}
        upload = service.create_upload("timing", create)
        part = (LINE * (PART_BYTES // len(LINE) + 1))[:PART_BYTES]
        digest, part_ids, left = hashlib.md5(usedforsecurity=False), [], total_bytes
        while left > 0:
            piece = part[: min(PART_BYTES, left)]
            digest.update(piece)
            part_ids.append(service.add_upload_part("timing", upload["id"], [piece])["id"])
            left -= len(piece)
        started = time.monotonic()
        done = service.complete_upload("timing", upload["id"], part_ids, digest.hexdigest())
        seconds = time.monotonic() - started
    return {
        "bytes": total_bytes,
        "parts": len(part_ids),
        "complete_s": round(seconds, 2),
        "budget_s": FRONT_BUDGET_S,
        "status": done["status"],
        "timed_on": "moto (ThreadedMotoServer on this machine), not S3",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/upload_complete_timing.py", description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="the Upload's size in MB (default 200, OpenAI's)")
    args = parser.parse_args(argv)
    if not args.mb > 0:
        parser.error(f"--mb must be positive, got {args.mb}")
    os.environ.pop("AWS_ENDPOINT_URL", None)  # the client is pointed at this moto server, whatever the shell says
    with moto_s3() as client:
        result = time_complete(client, int(args.mb * 1000 * 1000))
    print(json.dumps(result))
    return 0 if result["complete_s"] <= FRONT_BUDGET_S else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
