"""The queue drain: with the Batch API on, one execution runs a night's queue back to back on one GPU boot.

Without the Batch API the nightly machine is exactly its file (small.asl.json, eks.asl.json). With it, the states
of queue_drain.json are merged in and three edges move, so that a run that ended well (its summary written) or
was skipped (no ready input) does not release the GPUs at once but first asks the tick function for the next
queued run (`NextBatch`: workload/batch_api/scheduler.py `Scheduler.next_run`):

    SummaryWritten --summary--> NextBatch --run--> TakeNextRun -> ResolveDate (PlanBatch or PlanRun, a new run)
                                          --none--> ReleaseAfterSuccess (as without the queue)
    NotifySkipped -> NextBatchAfterSkip --run--> TakeNextRun
                                        --none--> ReleaseAfterSkip -> ReportSkipped (a no-op when nothing ran)

A failed run still ends the execution through ReleaseAfterFailure: its alert, its release and its failed status
are the run's, and no later batch inherits a GPU in an unknown state; the tick starts a new execution for the
rest of the queue. A failing NextBatch (the function down) releases as if the queue were empty.

The execution's length is bounded by polls, not runs: each NextBatch reports what the ended run spent and the
function refuses another run once the execution's polls plus one whole run's would pass `QueuePollBudget`
(Step Functions' 25,000-event history), so the machine's own timeout, a backstop, is set from that budget.
"""

from __future__ import annotations

import copy
from typing import Any

from infra import statemachines
from infra.statemachines import graph

FRAGMENT = "queue_drain.json"


def with_queue(
    definition: dict[str, Any], substitutions: dict[str, statemachines.Substitution], timeout_s: int
) -> dict[str, Any]:
    """`definition` (rendered) with the queue drain: `substitutions` fill TickFunction, MaxPolls and
    QueuePollBudget; `timeout_s` is the whole execution's backstop."""
    drained = copy.deepcopy(definition)
    states = graph.states(drained)
    added = graph.states(statemachines.render(FRAGMENT, substitutions))
    clash = sorted(set(added) & set(states))
    if clash:
        raise ValueError(f"{FRAGMENT}: state(s) {', '.join(clash)} already in the definition")
    states.update(added)
    # The release after a skip is the release after success, ending in the skip's report.
    release = copy.deepcopy(states["ReleaseAfterSuccess"])
    release["Next"] = "ReportSkipped"
    states["ReleaseAfterSkip"] = release
    (written,) = [rule for rule in states["SummaryWritten"]["Choices"] if rule["Next"] == "ReleaseAfterSuccess"]
    written["Next"] = "NextBatch"
    skipped = states["NotifySkipped"]
    skipped["Next"] = "NextBatchAfterSkip"
    for catcher in skipped.get("Catch", []):
        catcher["Next"] = "NextBatchAfterSkip"
    drained["TimeoutSeconds"] = timeout_s
    drained["Comment"] = f"{drained['Comment']} With the Batch API: a night's queue runs back to back on one boot."
    return drained
