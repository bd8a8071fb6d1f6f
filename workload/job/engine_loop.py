"""The attempt's engine loop: the id pass (which also counts the input), the pipeline's stream, and the stop signal
and lease checked every tick.

The driver reads the pipeline's output in a thread of its own and wakes at least every `TICK_S`, so a SIGTERM or a
lost lease is acted on within a second even while Ray Data holds a task's rows; an engine crash loop found under
Ray's wrapping is raised as the guard's own verdict.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from workload.contract.config import ConfigError, JobConfig, seeded_cpu_conflict
from workload.files.pinned import InputChangedError
from workload.files.results import EngineCrashLoopError
from workload.job.committer import ShardCommitter
from workload.job.input_plan import InputPlan
from workload.job.lease import LeaseLostError
from workload.telemetry.process_memory import rss_mib
from workload.telemetry.progress import Progress

MEMBER_COLUMN = "_member"  # a pool's rows: the index of the member (output) each row belongs to


@dataclass
class Feed:
    """One output's rows in the stream: the lone job has one, a pool one per member (workload/job/pool.py).

    `count` takes the plan with every file's record count, from the id pass, and sets the output's shards by it
    (the committer's pending shards among them); `finished` is called once every shard of the output is committed
    while the stream still runs (a pool finishes that member at once; the lone job finishes after the stream)."""

    committer: ShardCommitter
    config: JobConfig
    plan: InputPlan
    count: Callable[[InputPlan], None]
    already: int  # rows committed before this attempt
    attempt: int
    finished: Callable[[], None] = lambda: None
    done: bool = field(default=False, init=False)


def run_engine(
    feeds: list[Feed],
    config: JobConfig,
    stop: Any,
    check_lease: Callable[[], None],
    timings: dict[str, float],
    memory: dict[str, float],
) -> bool:
    """Stream the pending shards' rows of every feed through one Ray Data LLM pipeline (one engine start);
    returns False if stopped by a signal. `config`: the engine's settings (every feed's but for its input and
    output)."""
    from workload.engine.pipeline import build_pipeline, one_batch_per_block
    from workload.job.input_stream import id_pass, input_stream, stream_read_concurrency
    from workload.job.rejects import Rejects

    started = time.monotonic()
    stop.install()  # ours already (runtime._signals_kept keeps Ray's handlers out); cheap insurance
    if stop.stopped:  # a SIGTERM while Ray started: nothing read, nothing in flight, every shard left as it was
        return False
    # Each input's repeated ids and facts first: a row is sent only once no earlier row can claim its id.
    passes = []
    for feed in feeds:
        duplicates, facts, feed.plan = id_pass(feed.plan, feed.config.sampling, _partitions(), config.stages.num_cpus)
        feed.count(feed.plan)
        feed.committer.types = facts.types
        passes.append((feed, duplicates, facts))
        if stop.stopped:  # nothing is in flight yet: every pending shard is left for the next attempt
            return False
    timings["id_pass_s"] = round(time.monotonic() - started, 3)
    progress = Progress(
        total=sum(f.committer.rows_in for f in feeds),
        already=sum(f.already for f in feeds),
        attempt=max(f.attempt for f in feeds),
    )
    for feed in feeds:
        if not feed.committer.pending:  # counted only now, and every shard already committed
            _finish(feed)
    passes = [p for p in passes if p[0].committer.pending]
    if not passes:
        progress.close()
        return True
    seeded = any(facts.seeded for _, _, facts in passes)
    problem = seeded_cpu_conflict(config, seeded)
    if problem:  # a row's own seed meets engine settings that would crash on it: stop before any engine starts
        progress.close()
        raise ConfigError(problem)

    # Rows that failed validation never enter the engine's stages: the one read of the main stream hands them to
    # the driver beside it (workload/job/rejects.py), and they go straight to their shards.
    rejects = [Rejects() for _ in passes]
    streams = [
        input_stream(
            feed.plan,
            feed.config.sampling,
            duplicates,
            feed.config.output.shard_rows,
            feed.committer.pending,
            config.stages.num_cpus,
            reject.report,
            stream_read_concurrency(config.max_replicas or config.replicas),
        )
        for (feed, duplicates, _), reject in zip(passes, rejects, strict=True)
    ]
    tagged = len(passes) > 1
    if tagged:
        # A pool: each row tagged with its member, each member's rows cut into engine batches, and the union
        # taking one batch of each member in turn (Ray Data's ordered union), so a small member's rows reach the
        # engine beside a large one's rather than after it, and it finishes early.
        streams = [
            one_batch_per_block(
                stream.map_batches(
                    _tag,
                    fn_kwargs={"member": index},
                    batch_format="pyarrow",
                    batch_size=None,
                    num_cpus=config.stages.num_cpus,
                ),
                config.batch_size,
                config.stages.num_cpus,
            )
            for index, stream in enumerate(streams)
        ]
        dataset = streams[0].union(*streams[1:])
        dataset.context.execution_options.preserve_order = True
    else:
        dataset = streams[0]
    carry = (MEMBER_COLUMN,) if tagged else ()
    if any(facts.valid_rows for _, _, facts in passes):
        # No model on the driver: each node running a stage fetches config.model itself
        # (workload/engine/node_stages.py).
        if config.task == "embed":
            from workload.engine.embed import build_embed_pipeline

            dataset = build_embed_pipeline(dataset, config, carry=carry)
        else:
            chat = any(facts.has_messages for _, _, facts in passes)
            dataset = build_pipeline(dataset, config, chat_template=chat, seeded=seeded, carry=carry)
    # Every ray.init (ours, and the one build_processor makes) would install a SIGTERM handler that exits at once,
    # without committing; runtime._signals_kept stops that, and this takes the signal back should anything else.
    stop.install()
    memory["before_stream"] = rss_mib()

    def take(feed: Feed, table: pa.Table) -> None:
        ok, failed, rejected, out_tokens = feed.committer.take(table)
        first = feed.committer.first_request_at
        if first is not None and "first_engine_request_s" not in timings:
            timings["first_answer_s"] = round(time.monotonic() - timings["t0"], 3)
            timings["first_engine_request_s"] = round(first - timings["t0"], 3)
        progress.advance(ok, failed + rejected, out_tokens)
        if not feed.committer.pending:
            _finish(feed)

    def route(table: pa.Table) -> None:
        if not tagged:
            take(passes[0][0], table)
            return
        members = table.column(MEMBER_COLUMN)
        for index in pc.unique(members).to_pylist():
            rows = table.filter(pc.equal(members, index)).drop_columns([MEMBER_COLUMN])
            take(passes[index][0], rows)

    def drain() -> None:
        for (feed, _, _), reject in zip(passes, rejects, strict=True):
            for table in reject.drain():
                take(feed, table)

    try:
        drained = time.monotonic()
        for batch in _batches_or_ticks(dataset):
            # The rejected rows handed in since the last drain: on each tick, and between batches at most every
            # DRAIN_S, since each drain is a round trip to the actor and a big engine's batches come many a second.
            if batch is None or time.monotonic() - drained >= DRAIN_S:
                drain()
                drained = time.monotonic()
            if batch is not None:
                route(batch)
            check_lease()  # a lost lease stops the engine work now, not only at the next commit
            if stop.stopped:
                return False
        # The stream has ended, so every validation task has returned, and so handed in its rejected rows.
        drain()
    except LeaseLostError:
        raise
    except Exception as error:
        loop = _crash_loop_in(error)
        if loop is not None:
            raise EngineCrashLoopError(loop) from None
        change = _found_in(error, InputChangedError)
        if change is not None:  # a read task found its file changed: the job's own verdict, not Ray's wrapping
            raise InputChangedError(change) from None
        raise
    finally:
        progress.close()  # the bar ends before the summary or a stop's notice is printed below it
        for reject in rejects:
            with contextlib.suppress(Exception):  # the actor ends with Ray anyway; a failed kill changes nothing
                reject.close()
    return True


def _finish(feed: Feed) -> None:
    if not feed.done:
        feed.done = True
        feed.finished()


def _tag(batch: pa.Table, member: int) -> pa.Table:
    return batch.append_column(MEMBER_COLUMN, pa.array([member] * batch.num_rows, pa.int64()))


_END = object()
TICK_S = 1.0
DRAIN_S = 0.5


def _batches_or_ticks(dataset: Any) -> Iterator[pa.Table | None]:
    """The dataset's output batches, with a None at least every TICK_S while none comes.

    Ray Data can hold a task's rows until the task ends (a small input is one block, answered whole), so a loop
    that only wakes on a batch would see a SIGTERM, or a lost lease, only then: after the grace period, when the
    stop timer has hard-exited without the `_interrupted.json` note. A thread reads the batches; the caller
    wakes on each tick. At a stop the thread is left behind, blocked in Ray, and ends with the process."""
    handoff: queue.Queue[Any] = queue.Queue(maxsize=2)

    def pump() -> None:
        try:
            for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                handoff.put(batch)
            handoff.put(_END)
        except BaseException as error:  # handed to the caller's thread, which raises it as its own
            handoff.put(error)

    threading.Thread(target=pump, name="llm-batch-output", daemon=True).start()
    while True:
        try:
            item = handoff.get(timeout=TICK_S)
        except queue.Empty:
            yield None
            continue
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _partitions() -> int:
    """Hash partitions of the id pass: one per CPU of the cluster, so each node groups its share of the ids."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _crash_loop_in(error: BaseException) -> str | None:
    """The engine guard's crash-loop verdict, from under the layers Ray wraps a stage's exception in."""
    return _found_in(error, EngineCrashLoopError)


def _found_in(error: BaseException, kind: type[BaseException]) -> str | None:
    """The message of an error of `kind` under the layers Ray wraps a task's exception in (None: not there)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kind):
            return str(current.args[0]) if current.args else str(current)
        current = current.__cause__ or current.__context__
    text = str(error)
    marker = f"{kind.__name__}: "
    if marker in text:
        return text[text.index(marker) + len(marker) :].strip().splitlines()[0]
    return None
