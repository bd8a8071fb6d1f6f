"""vLLM's scheduler statistics of one engine, gathered for CloudWatch: KV-cache use, running and waiting
requests, preemptions.

Ray Data LLM builds the engine with no stat logger of ours (`log_engine_metrics` only adds Ray's Prometheus
exporter, which nothing here scrapes), so the engine actor appends an `EngineStats` to the engine's own
`StatLoggerManager` (vllm/v1/metrics/loggers.py, vLLM 0.32) once it is built: vLLM then hands it every step's
`SchedulerStats` and `IterationStats`, and `CloudWatchMetrics` (its `engine_stats`) publishes an interval's worth
at each publication. Sustained preemptions mean over-admission: more sequences than the KV cache holds, each
preempted one recomputed (monitoring/alarms.py `engine-preemptions`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineInterval:
    kv_cache_usage_max: float  # 0..1, the fullest the cache was in the interval (the last step's if none ran in it)
    running_requests: int  # as the latest step left them
    waiting_requests: int
    preemptions: int  # in the interval
    # max_num_seqs less the busy slots, mean over the interval's time (0: max_num_seqs unknown); see EngineStats
    free_slots_mean: float = 0.0


class StepLogger:
    """The part of vLLM's stat-logger interface (what StatLoggerManager calls) that ours leave alone; a subclass
    defines `record`, which vLLM calls with every step's stats."""

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


def finished_in_step(iteration_stats: Any) -> int:
    """Requests the step ended. A step's busy slots are running + these: vLLM counts running after dropping them
    (vllm/v1/core/sched/scheduler.py, `make_stats` in `update_from_output`, vLLM 0.32)."""
    return len(getattr(iteration_stats, "finished_requests", None) or ())


class EngineStats(StepLogger):
    """A vLLM stat logger (the interface StatLoggerManager calls); `take()` returns and resets an interval.

    Free slots are weighted by time, not by step: each step's free slots (max_num_seqs less its running requests
    and those it ended) count for the time since the step before it, and a stretch that follows a step that left
    nothing running or waiting counts every slot free, as does the time since the last step while it left none.
    Why: vLLM calls `record` only when its engine steps, so an engine idle for want of rows ran no steps and an
    average over steps never saw the wait, and many quick steps of a few rows outweighed a slow full one. A
    stretch's first step after idling is counted idle too: an error of one step's time."""

    def __init__(self, max_num_seqs: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()  # vLLM records from its output handler; the publisher takes from its thread
        self._max_num_seqs = max_num_seqs  # the engine's settled value; 0: unknown, no free slots counted
        self._clock = clock
        self._opened = clock()  # the interval's start
        self._last_step = self._opened  # the latest step's end, or the interval's start
        self._free_slot_s = 0.0  # free slots x seconds since the interval's start, up to the latest step
        self._kv_max = 0.0
        self._kv_last = 0.0
        self._running = 0
        self._waiting = 0
        self._preemptions = 0
        self._steps = 0

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        with self._lock:
            if scheduler_stats is not None:
                now = self._clock()
                kv = float(scheduler_stats.kv_cache_usage)
                self._kv_max, self._kv_last = max(self._kv_max, kv), kv
                idled = self._running == 0 and self._waiting == 0  # the step before left the engine nothing to do
                self._running = int(scheduler_stats.num_running_reqs)
                self._waiting = int(scheduler_stats.num_waiting_reqs)
                busy = 0 if idled else self._running + finished_in_step(iteration_stats)
                self._free_slot_s += (now - self._last_step) * max(0, self._max_num_seqs - busy)
                self._last_step = now
                self._steps += 1
            if iteration_stats is not None:
                self._preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0))

    def take(self) -> EngineInterval | None:
        """The interval since the last take; None when the engine's max_num_seqs is unknown and it ran no step
        (nothing to say). An engine that ran no step reports its slots as its last step left them (all free when
        it left nothing running) and that step's KV-cache use."""
        with self._lock:
            now = self._clock()  # under the lock: a step recorded after it would make the last stretch negative
            if not self._steps and not self._preemptions and not self._max_num_seqs:
                return None
            free_slot_s = self._free_slot_s + (now - self._last_step) * max(0, self._max_num_seqs - self._running)
            span = now - self._opened
            free = free_slot_s / span if span > 0 else float(max(0, self._max_num_seqs - self._running))
            kv = self._kv_max if self._steps else self._kv_last
            interval = EngineInterval(kv, self._running, self._waiting, self._preemptions, free)
            self._kv_max, self._preemptions, self._steps, self._free_slot_s = 0.0, 0, 0, 0.0
            self._opened = self._last_step = now
            return interval


def attach(async_engine: Any, stats: StepLogger) -> bool:
    """Feed `stats` from this vLLM engine's steps; False where it keeps no stats (disable_log_stats)."""
    manager = getattr(async_engine, "logger_manager", None)
    if manager is None:
        return False
    manager.stat_loggers.append(stats)
    return True


def engine_reporter(metrics: dict[str, Any] | None, stats: EngineStats) -> Any:
    """A CloudWatch publisher of `stats` every metrics.publish_interval_s (Stack dimension only: no row counts,
    no heartbeat), or None when the job publishes nowhere."""
    from workload.contract.config import MetricsConfig

    config = MetricsConfig.model_validate(metrics or {})
    if config.sink != "cloudwatch":
        return None
    import socket

    from workload.telemetry.cloudwatch import CloudWatchMetrics

    return CloudWatchMetrics(config, socket.gethostname(), gpu_sampler=False, heartbeat=False, engine_stats=stats)
