"""How many rows the job keeps in flight per engine: the feed, sized from the engine's `max_num_seqs`.

Why a feed and not rows streamed out one by one: Ray Data LLM's engine stage hands its UDF a batch and yields that
batch only once every row of it has ended (ray/llm/_internal/batch/stages/base.py, `StatefulStageUDF.__call__`
collects the async generator's outputs and yields them in input order, Ray 2.60), so a batch holds its place until
its slowest row ends whatever the engine's own generator does. What the stage does offer is the number of batches an
engine actor runs at once (`max_concurrent_batches`, Ray Core's `max_concurrency` on the actor). With many more rows
in flight than the engine has sequence slots, a batch waiting on its slowest row is a few slots' worth of the feed,
and the engine's own queue holds the next rows for every slot that frees (docs/benchmark.md: the feed).

The numbers: `FEED_FACTOR` (4) x the engine's `max_num_seqs`, never under `LEAST_FACTOR` (2) x it unless the driver's
memory says so. An actor's `max_concurrency` is fixed when Ray creates it, before its engine sizes `auto` on its GPU
(workload/engine/auto_settings.py), and the driver cannot see that GPU; so with `auto` on a GPU the feed is sized
for the most sizing can settle on (MAX_NUM_SEQS_CAP): never less than the engine gets, at the cost of memory only.

Imports neither Ray nor vLLM: the job, the benchmark and the tests size the feed with the same function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workload.contract.config import JobConfig
from workload.contract.engine_sizing import MAX_NUM_SEQS_CAP

AUTO = "auto"
FEED_FACTOR = 4  # rows in flight per sequence slot: chosen
LEAST_FACTOR = 2  # below this a batch waiting on its slowest row starves slots (the step-count model)
DRIVER_MEMORY_SHARE = 8  # the feed of every engine together holds at most 1/8 of the driver's memory
# A row in flight: its prompt text (about 4 bytes a token), its token ids (8 each, int64 in Arrow) and its answer's
# text and ids; 16 bytes a token of `row_tokens` errs on the large side.
BYTES_PER_ROW_TOKEN = 16
FEED_LINE = "[llm-batch] engine feed: "


@dataclass(frozen=True)
class Feed:
    max_num_seqs: int  # what the feed was sized for
    sized_for: str  # where that number came from
    batch_size: int
    batches: int  # max_concurrent_batches per engine
    memory_rows: int  # the most rows per engine the driver's memory share allows

    @property
    def rows_in_flight(self) -> int:
        return self.batch_size * self.batches

    @property
    def factor(self) -> float:
        return self.rows_in_flight / self.max_num_seqs

    def line(self) -> str:
        """The one log line that states the feed."""
        text = (
            f"{FEED_LINE}{self.rows_in_flight} rows in flight per engine ({self.batches} batches of {self.batch_size})"
            f" = {self.factor:.1f}x max_num_seqs {self.max_num_seqs} ({self.sized_for}); driver memory allows "
            f"{self.memory_rows}"
        )
        if self.factor < LEAST_FACTOR:
            text += f"; under {LEAST_FACTOR}x: a batch waiting on its slowest row idles sequence slots"
        return text


def feed_max_num_seqs(config: JobConfig) -> tuple[int, str]:
    """The engine's `max_num_seqs` as the driver can know it, and where it came from."""
    engine = config.engine
    if engine.max_num_seqs != AUTO:
        return int(engine.max_num_seqs), "pinned"
    if config.device == "cpu":
        return engine.unsized_max_num_seqs, "auto on the CPU"
    return MAX_NUM_SEQS_CAP, "auto on a GPU: the most sizing settles on"


def plan_feed(config: JobConfig, driver_memory_bytes: int) -> Feed:
    """The feed per engine. A pinned `max_concurrent_batches` is kept as the user set it (the line says if it is
    under 2x); `auto` is FEED_FACTOR x max_num_seqs, bounded by the driver's memory share, at least one batch."""
    if driver_memory_bytes <= 0:
        raise ValueError(f"driver memory must be positive, got {driver_memory_bytes} bytes")
    seqs, sized_for = feed_max_num_seqs(config)
    engines = config.max_replicas or config.replicas
    row_bytes = config.engine.row_tokens * BYTES_PER_ROW_TOKEN
    memory_rows = driver_memory_bytes // DRIVER_MEMORY_SHARE // engines // row_bytes
    if config.max_concurrent_batches != AUTO:
        batches = int(config.max_concurrent_batches)
    else:
        wanted = min(FEED_FACTOR * seqs, memory_rows)
        batches = max(1, math.ceil(wanted / config.batch_size))
    return Feed(seqs, sized_for, config.batch_size, batches, int(memory_rows))
