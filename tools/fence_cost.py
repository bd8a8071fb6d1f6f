"""What one shard commit costs on S3, in requests and time: `python -m tools.fence_cost [--commits N]`.

Runs against a moto server it starts on 127.0.0.1 (moto, not AWS: real S3 adds tens of milliseconds per request
that moto does not, so read the request counts as the cost and the times as moto's). Each commit is what the job
does per shard: the output store's `commit_shard` (behind a live lease's check) and the manifest write that
follows it. Prints one JSON object: requests per commit by operation, and the mean and p95 time per commit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
import uuid
from collections import Counter
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(commits: int) -> dict[str, Any]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    try:
        import boto3
        import pyarrow as pa

        from workload.files import storage
        from workload.job.lease import OutputLease
        from workload.job.output import OutputStore

        bucket = f"cost-{uuid.uuid4().hex[:8]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/out"
        lease = OutputLease(OutputStore(uri).root, ttl_s=120)
        lease.acquire()
        store = OutputStore(uri, guard=lease.check)
        manifest: dict[str, Any] = {"attempts": [{"attempt": 1}]}
        store.read_manifest()
        store.write_manifest(manifest)
        sent: Counter[str] = Counter()

        def count(request: Any, **_: Any) -> None:
            sent[f"{request.method} {request.url.split('?')[0].rsplit('/', 2)[-2]}"] += 1

        storage.s3_client().meta.events.register("before-send.s3", count)
        stats = {"rows_ok": 90, "rows_failed": 10, "input_tokens": 0, "output_tokens": 0, "error_types": {"x": 10}}
        table = pa.table({"id": [f"r{i}" for i in range(90)], "generated_text": ["answer"] * 90})
        errors = [{"id": f"e{i}", "error_type": "x"} for i in range(10)]
        times = []
        for shard in range(commits):
            started = time.perf_counter()
            store.commit_shard(shard, table, errors, stats, attempt=1)
            store.write_manifest(manifest)
            times.append(time.perf_counter() - started)
        lease.release()
        per_commit = {name: round(n / commits, 2) for name, n in sorted(sent.items())}
        return {
            "server": "moto (ThreadedMotoServer on 127.0.0.1)",
            "commits": commits,
            "requests_per_commit": round(sum(sent.values()) / commits, 2),
            "by_operation_and_folder": per_commit,
            "mean_ms": round(statistics.mean(times) * 1000, 1),
            "p95_ms": round(sorted(times)[int(0.95 * (commits - 1))] * 1000, 1),
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.fence_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    print(json.dumps(measure(parser.parse_args().commits), indent=2))


if __name__ == "__main__":
    main()
