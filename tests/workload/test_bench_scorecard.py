"""The scorecard's arithmetic on hand-made request records, where every figure can be worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from workload.bench.memory import PeakMemory
from workload.bench.plots import plot_latency, plot_throughput
from workload.bench.profiles import get_profile
from workload.bench.records import MissingMetricsError, RequestRecord, record_from_metrics
from workload.bench.report import markdown
from workload.bench.results import ModeRun
from workload.bench.runner import without_nan
from workload.bench.scorecard import build_scorecard
from workload.bench.stats import mean_running, percentile, summarise, tokens_in_window

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(bench_id: int, scheduled: float, first: float, last: float, tokens: int, **extra: object) -> RequestRecord:
    fields = dict(
        bench_id=bench_id,
        kind="short",
        expected_tokens=tokens,
        output_tokens=tokens,
        prompt_tokens=10,
        arrival=scheduled,
        queued=scheduled,
        scheduled=scheduled,
        first_token=first,
        last_token=last,
    )
    fields.update(extra)
    return RequestRecord(**fields)  # type: ignore[arg-type]


def _run(mode: str, records: list[RequestRecord], point: str = "bimodal", submitted: float = 100.0) -> ModeRun:
    return ModeRun(point, mode, 5.0, submitted, 200.0, 3 * 2**30, "process-tree-pss", records)


# Two requests from ready=100: one decodes 11 tokens over [101, 102], one 21 tokens over [101, 104].
RECORDS = [_record(0, 100.5, 101.0, 102.0, 11), _record(1, 100.5, 101.0, 104.0, 21)]


@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], 50))


def test_tokens_in_window_spreads_a_decode_evenly() -> None:
    record = RECORDS[1]  # 21 tokens over [101, 104]
    assert tokens_in_window(record, 102.0, 104.0) == pytest.approx(14.0)
    assert tokens_in_window(record, 0.0, 1000.0) == pytest.approx(21.0)
    assert tokens_in_window(record, 104.5, 105.0) == 0.0


def test_mean_running_is_time_averaged_concurrency() -> None:
    assert mean_running(RECORDS, 102.0, 104.0) == pytest.approx(1.0)  # only request 1 still decoding
    assert mean_running(RECORDS, 101.0, 102.0) == pytest.approx(2.0)


def test_summary_figures_by_hand() -> None:
    summary = summarise(_run("continuous", RECORDS), max_num_seqs=4)
    assert summary["completed"] == 2 and summary["failures"] == 0
    assert summary["window_s"] == pytest.approx(2.0)  # first finish 102 -> last finish 104
    assert summary["requests_per_s"] == pytest.approx(0.5)  # one completion after the first, in 2 s
    assert summary["output_tokens_per_s"] == pytest.approx(14.0 / 2.0)
    assert summary["ttft_p50_s"] == pytest.approx(1.0)
    assert summary["e2e_p95_s"] == pytest.approx(2.0 + 0.95 * 2.0)
    assert summary["itl_p95_s"] == pytest.approx(0.1 + 0.95 * (0.15 - 0.1))
    assert summary["queue_p95_s"] == pytest.approx(0.5)
    assert summary["occupancy"] == pytest.approx(0.25)
    assert summary["overall_output_tokens_per_s"] == pytest.approx(32 / 4.0)
    assert summary["peak_memory_gib"] == pytest.approx(3.0) and summary["startup_s"] == 5.0


def test_wrong_lengths_and_errors_are_failures_not_throughput() -> None:
    short = _record(2, 100.5, 101.0, 101.5, 5, expected_tokens=8)
    failed = RequestRecord(3, "long", 100, 0, 0, 0, 0, 0, 0, 0, error="EngineDeadError: boom")
    summary = summarise(_run("job", [*RECORDS, short, failed]), max_num_seqs=4)
    assert summary["failures"] == 2 and summary["completed"] == 2
    assert summary["failure_reasons"] == ["EngineDeadError: boom", "wrong output length"]
    assert summary["output_tokens"] == 32


def test_job_latency_is_measured_from_its_first_engine_arrival() -> None:
    """The job's actor start-up is start-up, not queue time: its `ready` is the first arrival at an engine."""
    late = [_record(0, 150.5, 151.0, 152.0, 11, arrival=150.0), _record(1, 150.5, 151.0, 154.0, 21, arrival=150.2)]
    summary = summarise(_run("job", late, submitted=100.0), max_num_seqs=4)
    assert summary["ttft_p50_s"] == pytest.approx(1.0)
    assert summary["queue_p50_s"] == pytest.approx(0.5)


def test_records_need_vllm_timestamps() -> None:
    with pytest.raises(MissingMetricsError, match="disable_log_stats=False"):
        record_from_metrics(
            bench_id=1, kind="short", expected_tokens=3, output_tokens=3, prompt_tokens=2, metrics=None, offset=0.0
        )
    metrics = {"arrival_time": 1000.0, "queued_ts": 9.0, "scheduled_ts": 9.5, "first_token_ts": 10, "last_token_ts": 11}
    record = record_from_metrics(
        bench_id=1, kind="short", expected_tokens=3, output_tokens=3, prompt_tokens=2, metrics=metrics, offset=991.0
    )
    assert record.arrival == 9.0 and record.last_token == 11.0 and record.ok


def _scorecard() -> dict:
    profile = get_profile("smoke")
    slow = [_record(0, 100.5, 101.0, 104.0, 11), _record(1, 104.5, 105.0, 108.0, 21)]
    runs = [
        _run("continuous", RECORDS),
        _run("synchronous", slow),
        _run("job", RECORDS),
        _run("continuous", RECORDS, point="long=64"),
        _run("synchronous", slow, point="long=64"),
    ]
    repro = {
        "command": "python -m workload bench --out x",
        "commit": None,
        "versions": {"python": "3.11"},
        "hardware": {"cpu": "test", "usable_cores": 2, "memory_gib": 1.0},
    }
    return build_scorecard(profile, runs, engine_args={"max_num_seqs": 8}, reproducibility=repro, errors={})


def test_scorecard_names_both_ratios_and_their_targets() -> None:
    scorecard = _scorecard()
    # continuous: 7 tok/s in its window; synchronous: 21 tokens/4 s window spread -> by hand below.
    sync = next(r for r in scorecard["runs"] if r["mode"] == "synchronous" and r["point"] == "bimodal")
    assert scorecard["continuous_over_synchronous"] == pytest.approx(7.0 / sync["output_tokens_per_s"])
    assert scorecard["job_over_continuous"] == pytest.approx(1.0)
    assert scorecard["targets"] == {
        "continuous_over_synchronous": 2.0,
        "job_over_continuous": 0.9,
        "job_startup_over_engine_startup": 1.3,
        "job_peak_memory_over_engine": 1.3,
    }
    assert scorecard["targets_met"]["job_over_continuous"] is True
    assert [row["point"] for row in scorecard["sweep"]] == ["bimodal", "long=64"]
    assert scorecard["sweep"][1]["long_tokens"] == 64.0 and "job" not in scorecard["sweep"][1]
    assert scorecard["reproducibility"]["seed"] == 0
    assert set(scorecard["measurement"]) >= {"ttft", "itl", "e2e", "queue", "window", "peak_memory"}
    json.dumps(without_nan(scorecard), allow_nan=False)


def test_markdown_table_has_a_row_per_run_and_the_command() -> None:
    text = markdown(_scorecard())
    assert "continuous / synchronous: **" in text and "job / continuous: **1.00**" in text
    assert text.count("| bimodal |") == 3 and text.count("| long=64 |") == 2
    assert "`python -m workload bench --out x`" in text


def test_plots_are_pngs(tmp_path: Path) -> None:
    scorecard = _scorecard()
    runs = [_run("continuous", RECORDS), _run("job", RECORDS)]
    for path in (
        plot_throughput(scorecard, tmp_path / "t.png"),
        plot_latency(runs, "bimodal", tmp_path / "l.png"),
    ):
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_peak_memory_counts_child_processes() -> None:
    import subprocess
    import sys

    child = "b = bytearray(300 * 2**20); import time; time.sleep(1.5)"
    with PeakMemory("cpu", interval_s=0.05, cpu_interval_s=0.05) as alone:
        pass
    with PeakMemory("cpu", interval_s=0.05, cpu_interval_s=0.05) as memory:
        subprocess.run([sys.executable, "-c", child], check=True)
    assert memory.peak_bytes >= alone.peak_bytes + 250 * 2**20
    assert memory.source == "process-tree-pss"
    # The peak's parts: the child (named by its program) holds the 300 MiB, and the parts sum to the peak.
    parts = memory.peak_mib_by_role
    assert parts[Path(sys.executable).name] >= 250 and "driver" in parts
    assert sum(memory.peak_by_role.values()) == memory.peak_bytes


def test_peak_memory_charges_shared_pages_once() -> None:
    """Two processes sharing 300 MiB of touched memory cost the machine 300 MiB, not 600 (what RSS would say)."""
    import subprocess
    import sys

    child = (
        "import mmap, os, time\n"
        "shared = mmap.mmap(-1, 300 * 2**20)\n"
        "for _ in range(300): shared.write(b'x' * 2**20)\n"
        "if os.fork() == 0:\n"
        "    time.sleep(1.5); os._exit(0)\n"
        "time.sleep(1.5); os.wait()\n"
    )
    with PeakMemory("cpu", interval_s=0.05, cpu_interval_s=0.05) as alone:
        pass
    with PeakMemory("cpu", interval_s=0.05, cpu_interval_s=0.05) as memory:
        subprocess.run([sys.executable, "-c", child], check=True)
    grown = memory.peak_bytes - alone.peak_bytes
    assert 250 * 2**20 <= grown <= 450 * 2**20


def test_cpu_seconds_are_attributed_to_the_process_that_spent_them() -> None:
    import subprocess
    import sys

    busy = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    with PeakMemory("cpu", interval_s=0.05, cpu_interval_s=0.05) as monitor:
        subprocess.run([sys.executable, "-c", busy], check=True)
    spent = monitor.cpu_seconds
    child = {role: seconds for role, seconds in spent.items() if role != "driver"}
    assert sum(child.values()) >= 0.7  # the busy child, seen by the sampler before it exited


def test_the_like_for_like_baseline_is_reported_beside_the_default_and_judges_the_targets() -> None:
    """The bare engine in the job's process layout (continuous_job_layout) against the job: its ratios sit beside
    the default-layout ones, and the targets are judged on them. Here the job-layout engine decodes half as fast
    as the job (so like for like the job looks 2x) and peaks at 1 GiB against the job's 3 (3x: the memory target
    is missed like for like, though met against the default layout's 3 GiB)."""
    profile = get_profile("smoke")
    half = [_record(0, 100.5, 101.0, 104.0, 11), _record(1, 100.5, 101.0, 108.0, 21)]
    layout = ModeRun("bimodal", "continuous_job_layout", 5.0, 100.0, 200.0, 1 * 2**30, "process-tree-pss", half)
    runs = [_run("continuous", RECORDS), _run("job", RECORDS), layout]
    repro = {"command": "x", "commit": None, "versions": {}, "hardware": {}}
    scorecard = build_scorecard(profile, runs, engine_args={}, reproducibility=repro, errors={})
    assert scorecard["job_peak_memory_over_engine"] == pytest.approx(1.0)  # the default layout's
    assert scorecard["like_for_like"]["job_peak_memory_over_engine"] == pytest.approx(3.0)
    assert scorecard["targets_met"]["job_peak_memory_over_engine"] is False  # judged like for like
    assert scorecard["like_for_like"]["job_over_continuous"] > scorecard["job_over_continuous"]
    assert "job's process layout" in scorecard["baseline"]
    text = markdown(scorecard)
    assert "Like for like" in text and text.index("Like for like") < text.index("| ")
