"""The nightly machine's clock: how often it polls a run's markers, how many polls an execution may spend, and
how long the small tier's node waits for the queue's next run. One module, because the node's wait is derived
from the machine's poll interval (infra/components/user_data.py reads it, infra/components/nightly.py renders it).
"""

from __future__ import annotations

MIN_POLL_SECONDS = 60
# How often the GPU sweep runs (infra/components/nightly.py's schedule): the estimate prices its executions.
SWEEP_MINUTES = 30
# A standard execution's history holds at most 25,000 events and one poll of the markers writes about 40:
# a long deadline polls less often rather than run out of history.
MAX_POLLS = 300
HISTORY_EVENTS = 25_000  # Step Functions quotas: a standard execution's history holds at most 25,000 events
EVENTS_PER_POLL = 40
# With the Batch API's queue one execution runs several runs: their polls together stay within four fifths of
# the history (the rest for the runs' starts and ends), and one whole run always fits.
QUEUE_POLL_BUDGET = HISTORY_EVENTS * 4 // 5 // EVENTS_PER_POLL
# The machine's own timeout is a backstop past its runs' polls (the release runs well before it).
TIMEOUT_MARGIN_S = 1800
# What the small tier's node waits for the next run request after a job ends well, past two of the machine's
# polls (the one that sees the summary, and a late one): the margin covers the NextBatch call and the tasks up
# to WriteRunRequest, a few seconds each.
NEXT_RUN_MARGIN_S = 60

# The GPU sweep's schedule (infra/components/nightly.py): it releases what no running execution holds.
SWEEP_MINUTES = 30
# A release's own time on top of the sweep's wait: the sweep machine's list and its Lambda call to delete the RayJob
# (retried up to six times, 5 s doubling: infra/statemachines/sweep_eks.asl.json's ReleaseIdleCapacity).
SWEEP_RELEASE_S = 5 * (2**6 - 1)

if QUEUE_POLL_BUDGET < MAX_POLLS:
    raise ValueError("QUEUE_POLL_BUDGET must hold one whole run's polls")


def poll_seconds(run_deadline_minutes: int) -> int:
    """How often the machine looks at the run's markers: at least a minute, and at most MAX_POLLS a run."""
    return max(MIN_POLL_SECONDS, -(-run_deadline_minutes * 60 // MAX_POLLS))


def max_polls(run_deadline_minutes: int) -> int:
    """One run's polls before its deadline."""
    return -(-run_deadline_minutes * 60 // poll_seconds(run_deadline_minutes))


def queue_timeout_s(run_deadline_minutes: int) -> int:
    """The backstop of an execution that runs a queue: every poll of its budget, and the margin."""
    return QUEUE_POLL_BUDGET * poll_seconds(run_deadline_minutes) + TIMEOUT_MARGIN_S


def next_run_hold_s(run_deadline_minutes: int) -> int:
    """How long the small tier's node waits for the queue's next run request (infra/components/user_data.py)."""
    return 2 * poll_seconds(run_deadline_minutes) + NEXT_RUN_MARGIN_S


def eks_stop_wait_s(termination_grace_s: int) -> int:
    """How long the Batch API waits, after it stopped an EKS tier's execution, for the job's partial files.

    A stopped (ABORTED) execution skips its release step. The front invokes the submit function's release itself
    (workload/batch_api/sfn_executor.py), so the RayJob is normally deleted at once; should that invocation fail,
    nothing deletes it until the GPU sweep finds no execution running (at most SWEEP_MINUTES later, plus its
    release) or the next execution's submit replaces it. The job then has its pods' termination grace (the job's
    grace period and a margin, infra/k8s/rayjob.py) to commit and write `_interrupted.json`. A batch closes at that
    note, or at this bound, which covers the slow path.
    """
    if termination_grace_s < 1:
        raise ValueError(f"termination_grace_s must be at least 1, got {termination_grace_s}")
    return SWEEP_MINUTES * 60 + SWEEP_RELEASE_S + termination_grace_s
