"""Several batches on one engine pool (issue 62): which queued batches run together, and the run that holds them.

A run is one job on the GPUs. Queued batches for the same endpoint (so the same model and the same task) share
it: the scheduler claims the first batch in the queue's order (priorities.py) and, behind it, up to
`max_batches - 1` more of the same endpoint, also in that order, and starts one job over all of them, the job's
pool mode (docs/job.md, "Pool mode"). Each batch keeps its own output folder, lease, manifest and shard markers,
exactly as a batch run alone, so each is committed, counted, cancelled and expired on its own and resumes from its
own commits whatever run comes next; the job finishes a batch (summary.json, output.jsonl) as soon as its last
shard commits, and the tick closes it then, while the others run on.

A batch that arrives while a run holds the GPUs joins at the next run, not inside the running one: Ray Data's
streaming executor fixes a dataset's inputs when the execution starts, so rows cannot be added to a running job.
The next run comes early: once the running job has had `join_after_s`, a tick that finds a queued batch the run
could take stops it (SIGTERM: it commits what finished) and starts the run again with the newcomer; the running
batches resume from their commits. What a join costs them is one engine start and the rows in flight at the stop.
A cancel (or an expiry) of one batch in a run stops the run the same way; the others resume at once without it.

Where a run is an execution of the tiers' state machine (the executor chains runs), a stop releases the GPUs, so
there no run is stopped for a join: a newcomer joins when the execution's run ends (its NextBatch step claims
the next group). A group of one is a batch's run as it always was (its run id is the batch's id).

The pool's own files lie where the tiers' state machine lets a batch's run read and write (its CheckBatchUris
state, and the job's role: infra/components/job_access.py): the members' spec, what the job reads as its input, as
a file (`files/pools/<pool id>.pool.json`: no uploaded file's key has a `/` after `files/`, so no caller can name
one), and the pool's folder as a batch's output (`batches/<pool id>/output`: its lease, and the notes the state
machine waits for). Both go when the run ends; each batch's own output holds everything that is its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from workload.batch_api.executor import BatchRun
from workload.batch_api.models import BatchRecord

SPEC_SUFFIX = ".pool.json"  # the job runs in pool mode on an input whose name ends so (docs/job.md, "Pool mode")


@dataclass(frozen=True)
class PoolSettings:
    """`max_batches`: batches one run holds (1, the default: every batch runs alone, the queue of before issue 62;
    the local server's `--pool-batches` sets it); `join_after_s`: how long a run goes before a tick may stop it to
    let a queued batch join."""

    max_batches: int = 1
    join_after_s: int = 300

    def __post_init__(self) -> None:
        if self.max_batches < 1:
            raise ValueError(f"pool max_batches must be at least 1, got {self.max_batches}")
        if self.join_after_s < 0:
            raise ValueError(f"pool join_after_s must be at least 0, got {self.join_after_s}")


def run_of(record: BatchRecord) -> str:
    """The id of the run a running batch is in: its pool's, or its own when it runs alone."""
    return record.pool_id or record.id


def pool_output(pool_id: str) -> str:
    return f"batches/{pool_id}/output"


def spec_key(pool_id: str) -> str:
    return f"files/pools/{pool_id}{SPEC_SUFFIX}"


def new_pool_id(batch_ids: Iterable[str], now: int) -> str:
    """A run's id, new for every grouping: the same batches grouped again later are another run."""
    digest = hashlib.sha256(json.dumps([sorted(batch_ids), now]).encode()).hexdigest()[:24]
    return f"pool_{digest}"


def joiners(running: list[BatchRecord], queue: Iterable[object], settings: PoolSettings) -> list[BatchRecord]:
    """Queued batches (in the queue's order) that a run over `running` may take: the same endpoint, up to the
    pool's size."""
    room = settings.max_batches - len(running)
    endpoint = running[0].endpoint if running else None
    found: list[BatchRecord] = []
    for entry in queue:
        if room <= len(found):
            break
        if isinstance(entry, BatchRecord) and entry.status == "validating":
            if endpoint is None:
                endpoint = entry.endpoint
            if entry.endpoint == endpoint:
                found.append(entry)
    return found


def needs_spec(records: list[BatchRecord]) -> bool:
    """Whether a run goes through a spec: several batches, or one with uploaded images (the spec is what hands the
    tiers' job its image files: their execution input carries only its input and output, sfn_executor.run_input)."""
    return len(records) > 1 or any(r.image_files for r in records)


def join_due(running: list[BatchRecord], queue: Iterable[object], settings: PoolSettings, now: int) -> bool:
    """Whether the tick should stop the run over `running` so that a queued batch joins it (see above)."""
    if not running or any(r.stop is not None or r.status != "in_progress" for r in running):
        return False
    since = max((r.run_since or r.in_progress_at or now) for r in running)
    return now - since >= settings.join_after_s and bool(joiners(running, queue, settings))


def pool_run(
    pool_id: str, members: list[BatchRecord], uri: Callable[[str], str], write: Callable[[str, bytes], None]
) -> BatchRun:
    """Write the members' spec (the job's input in pool mode) and name the run over it."""
    spec = {
        "pool": pool_id,
        "members": [
            {
                "name": record.id,
                "input": uri(record.input_key),
                "output": uri(record.output_key),
                "image_files": {file_id: uri(key) for file_id, key in (record.image_files or {}).items()} or None,
            }
            for record in members
        ],
    }
    write(spec_key(pool_id), json.dumps(spec, indent=1).encode())
    return BatchRun(pool_id, uri(spec_key(pool_id)), uri(pool_output(pool_id)), members[0].endpoint)


def forget(pool_id: str, delete: Callable[[str], None]) -> None:
    """A run that ended: its spec and its folder (lease, notes) go; no batch reads them again. The executor's
    marker beside the folder (the tiers' `batches/<run>/execution.json`) stays, as a lone batch's does: the usage
    report finds a run's execution by it (monitoring/cost_report/usage.py)."""
    delete(spec_key(pool_id))
    delete(pool_output(pool_id))
