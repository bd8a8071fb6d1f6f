"""One attempt of the job without Ray or an engine, as a process of its own: `python -m tests.workload.fence_attempt
resume|restart INPUT OUTPUT TTL_S [PAUSE_AT]`.

It runs the job's own attempt code (the lease, `_start_attempt`, `recover`, `commit_shard`, the summary) and
stands in only for the engine: a row with a prompt is "answered" with its own prompt, a row without one is an
error record. With PAUSE_AT=n it stops itself (SIGSTOP, as a frozen host is stopped) the n-th time a check of its
lease passes, so the pause falls exactly between that check and the request it guards. Exit code 5 when the lease
was lost, as the CLI's.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pyarrow as pa

from workload.contract.config import JobConfig
from workload.files.storage import locate, read_bytes
from workload.job import attempt as job_attempt
from workload.job.input_plan import plan_input
from workload.job.lease import LeaseLostError, OutputLease
from workload.job.output import OutputStore
from workload.job.summary import build_summary

EXIT_LEASE_LOST = 5
SHARD_ROWS = 5


def _rows(input_uri: str) -> list[dict]:
    location = locate(input_uri)
    return [json.loads(line) for line in read_bytes(location).decode().splitlines() if line.strip()]


def main(mode: str, input_uri: str, output_uri: str, ttl_s: float, pause_at: int | None) -> int:
    config = JobConfig.model_validate(
        {"input": {"uri": input_uri}, "output": {"uri": output_uri, "shard_rows": SHARD_ROWS}, "resume": {"mode": mode}}
    )
    lease = OutputLease(OutputStore(output_uri).root, ttl_s, clock_skew_s=0.0)
    lease.acquire(wait_s=60, poll_s=0.1)
    lease.start_renewing()
    checks = 0

    def guard() -> None:
        nonlocal checks
        lease.check()
        checks += 1
        if checks == pause_at:
            print("paused", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    store = OutputStore(output_uri, guard=guard)
    try:
        previous = store.read_manifest()
        plan = plan_input(config.input, previous.get("input_files") if previous and mode == "resume" else None)
        manifest, number = job_attempt._start_attempt(store, config, plan, previous)
        commits = store.recover()
        rows = _rows(input_uri)
        for shard in range(-(-len(rows) // SHARD_ROWS)):
            if shard in commits:
                continue
            chunk = rows[shard * SHARD_ROWS : (shard + 1) * SHARD_ROWS]
            ok = [{"id": r["id"], "generated_text": r["prompt"]} for r in chunk if "prompt" in r]
            errors = [{"id": r["id"], "error_type": "missing_prompt"} for r in chunk if "prompt" not in r]
            stats = {
                "rows_ok": len(ok),
                "rows_failed": len(errors),
                "input_tokens": 0,
                "output_tokens": 0,
                "error_types": {"missing_prompt": len(errors)} if errors else {},
            }
            table = pa.Table.from_pylist(ok) if ok else None
            commits[shard] = store.commit_shard(shard, table, errors, stats, number)
        manifest["attempts"][-1]["ended_at"] = "done"
        store.write_manifest(manifest)
        store.write_summary(build_summary(config, manifest, commits))
    except LeaseLostError as error:
        print(f"stopped: {error}", flush=True)
        return EXIT_LEASE_LOST
    finally:
        lease.release()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    pause = int(sys.argv[5]) if len(sys.argv) > 5 else None
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), pause))
