"""Rows the main stream's validation stage rejects, handed to the driver beside the engine's stream, not through it.

One read of the input feeds both outcomes of validation (issue 50). The valid rows go on to the engine's stages;
a rejected row (a line that failed validation, a repeated id's later row) cannot travel with them, since a block
of only such rows gets other column types in Ray Data LLM's stages than its neighbours and Ray Data cannot then
concatenate them. So each validation task hands its rejected rows, as one Arrow table of error rows, to one small
actor, and the driver drains that actor every tick of its loop into the committer, as it takes the engine's
batches. Before this, a second read of the input (every file holding such a row) parsed and validated every line
again only to keep its rejected ones.

The actor lives on the driver's node, pinned there (workload/job/driver_node.py): a lost worker must not take the
rows it holds with it.

The actor holds what the driver has not drained yet: at most a tick's worth of rejected rows, which the driver
would hold in their shard's buffer anyway. A validation task that Ray retries hands the same rows again; the
committer keeps the first of each position (`ShardCommitter._redelivered`), as for a rerun engine batch.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import ray

from workload.job.driver_node import on_driver_node


class RejectsCollector:
    """The actor's class: error-row tables as the validation tasks hand them, until the driver drains them."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def put(self, table: pa.Table) -> None:
        self.tables.append(table)

    def drain(self) -> list[pa.Table]:
        tables, self.tables = self.tables, []
        return tables


class RejectsReport:
    """What a validation task calls with its rejected rows: a report to the collector actor, which returns once
    the actor holds them, so every row is with the actor before the task's valid rows reach the driver
    (picklable, unlike a lambda)."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def __call__(self, table: pa.Table) -> None:
        ray.get(self.collector.put.remote(table))


class Rejects:
    """The driver's side: the collector actor, the report the validation tasks call, and the drain."""

    def __init__(self) -> None:
        self.actor = ray.remote(num_cpus=0, scheduling_strategy=on_driver_node())(RejectsCollector).remote()
        self.report = RejectsReport(self.actor)

    def drain(self) -> list[pa.Table]:
        """Every rejected row handed in since the last drain."""
        return list(ray.get(self.actor.drain.remote()))

    def close(self) -> None:
        ray.kill(self.actor)
