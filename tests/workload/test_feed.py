"""The job's feed per engine (workload/engine/feed.py): sized from max_num_seqs, bounded by the driver's memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from workload.contract.config import JobConfig
from workload.contract.engine_sizing import MAX_NUM_SEQS_CAP
from workload.engine.feed import BYTES_PER_ROW_TOKEN, DRIVER_MEMORY_SHARE, FEED_LINE, plan_feed

GIB = 1 << 30


def _config(**fields: Any) -> JobConfig:
    return JobConfig.model_validate({"input": {"uri": "/data/in"}, "output": {"uri": "/data/out"}, **fields})


def test_auto_feeds_four_times_a_pinned_max_num_seqs() -> None:
    feed = plan_feed(_config(engine={"max_num_seqs": 512}), 16 * GIB)
    assert (feed.batches, feed.rows_in_flight, feed.factor) == (64, 2048, 4.0)
    assert feed.line().startswith(f"{FEED_LINE}2048 rows in flight per engine (64 batches of 32) = 4.0x")


def test_auto_on_the_cpu_feeds_the_unsized_engine() -> None:
    feed = plan_feed(_config(), 16 * GIB)
    assert (feed.max_num_seqs, feed.rows_in_flight, feed.sized_for) == (128, 512, "auto on the CPU")


def test_auto_on_a_gpu_feeds_the_most_sizing_can_settle_on() -> None:
    """The actor's max_concurrency is fixed before its engine sizes itself: the feed covers any settled value."""
    feed = plan_feed(_config(device="gpu"), 64 * GIB)
    assert feed.max_num_seqs == MAX_NUM_SEQS_CAP and feed.rows_in_flight == 4 * MAX_NUM_SEQS_CAP


def test_a_batch_size_that_does_not_divide_rounds_up() -> None:
    feed = plan_feed(_config(engine={"max_num_seqs": 100}, batch_size=48), 16 * GIB)
    assert feed.batches == 9 and feed.rows_in_flight >= 400


def test_the_driver_memory_share_bounds_the_feed_and_the_line_says_so() -> None:
    config = _config(engine={"max_num_seqs": 1024, "row_tokens": 2000}, replicas=4)
    memory = 2 * GIB
    allowed = memory // DRIVER_MEMORY_SHARE // 4 // (2000 * BYTES_PER_ROW_TOKEN)
    feed = plan_feed(config, memory)
    assert feed.memory_rows == allowed == 2097
    assert feed.rows_in_flight == 2112  # 66 batches of 32: the bound, rounded up to a whole batch
    assert "under 2x" not in feed.line()
    starved = plan_feed(config, GIB // 2)
    assert starved.rows_in_flight < 2 * 1024 and "under 2x" in starved.line()


def test_max_replicas_divides_the_memory_share() -> None:
    config = _config(engine={"max_num_seqs": 64, "row_tokens": 100_000}, replicas=1, max_replicas=8)
    assert plan_feed(config, 16 * GIB).memory_rows == 16 * GIB // DRIVER_MEMORY_SHARE // 8 // 1_600_000


def test_a_pinned_feed_is_kept_and_flagged_when_it_starves_the_engine() -> None:
    feed = plan_feed(_config(engine={"max_num_seqs": 512}, max_concurrent_batches=8), 16 * GIB)
    assert feed.rows_in_flight == 256
    assert "0.5x max_num_seqs 512 (pinned)" in feed.line() and "under 2x" in feed.line()


@pytest.mark.parametrize("value", [0, -1, "many", 2.5, True])
def test_a_bad_max_concurrent_batches_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"max_concurrent_batches\n.*must be 'auto' or an integer of at least 1"):
        _config(max_concurrent_batches=value)


def test_a_number_from_the_command_line_is_a_number() -> None:
    assert _config(max_concurrent_batches="12").max_concurrent_batches == 12


def test_no_driver_memory_is_an_error() -> None:
    with pytest.raises(ValueError, match="driver memory must be positive"):
        plan_feed(_config(), 0)


def test_the_gpu_15min_profile_runs_the_job_on_the_products_feed() -> None:
    """The GPU profile for one 15-minute machine: the job's feed is the product's, sized from the pinned 512."""
    from workload.bench.profiles import get_profile

    profile = get_profile("gpu-15min")
    assert [label for label, _ in profile.points()] == ["bimodal", "long=1000"]
    config = profile.job_config("/models/shape", Path("/tmp/run"))
    assert config.max_concurrent_batches == "auto" and config.device == "gpu"
    assert plan_feed(config, 64 * GIB).rows_in_flight == 4 * 512
