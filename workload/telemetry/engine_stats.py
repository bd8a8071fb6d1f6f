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
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineInterval:
    kv_cache_usage_max: float  # 0..1, the fullest the cache was in the interval
    running_requests: int  # at the interval's last step
    waiting_requests: int
    preemptions: int  # in the interval
    free_slots_mean: float = 0.0  # max_num_seqs less each step's busy slots, mean over the interval (0: unknown)


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
    """A vLLM stat logger (the interface StatLoggerManager calls); `take()` returns and resets an interval."""

    def __init__(self, max_num_seqs: int = 0) -> None:
        self._lock = threading.Lock()  # vLLM records from its output handler; the publisher takes from its thread
        self._max_num_seqs = max_num_seqs  # the engine's settled value; 0: unknown, no free slots counted
        self._free_slots = 0  # summed over the interval's steps
        self._kv_max = 0.0
        self._running = 0
        self._waiting = 0
        self._preemptions = 0
        self._steps = 0

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        with self._lock:
            if scheduler_stats is not None:
                self._kv_max = max(self._kv_max, float(scheduler_stats.kv_cache_usage))
                self._running = int(scheduler_stats.num_running_reqs)
                self._waiting = int(scheduler_stats.num_waiting_reqs)
                busy = self._running + finished_in_step(iteration_stats)
                self._free_slots += max(0, self._max_num_seqs - busy)
                self._steps += 1
            if iteration_stats is not None:
                self._preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0))

    def take(self) -> EngineInterval | None:
        """The interval since the last take, or None when the engine ran no step in it."""
        with self._lock:
            if not self._steps and not self._preemptions:
                return None
            free = self._free_slots / self._steps if self._steps else 0.0
            interval = EngineInterval(self._kv_max, self._running, self._waiting, self._preemptions, free)
            self._kv_max, self._preemptions, self._steps, self._free_slots = 0.0, 0, 0, 0
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
