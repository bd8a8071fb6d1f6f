"""The dashboard body: charts only what the job publishes, draws the configured thresholds, and CloudWatch
(moto) stores it."""

from __future__ import annotations

import json
from typing import Any

import boto3

from monitoring.alarms import AlarmThresholds
from monitoring.dashboard import dashboard_body
from monitoring.queries import load_queries
from tests.monitoring.conftest import GROUP, STACK, PublishedRun
from workload.contract import metric_names as mn

THRESHOLDS = AlarmThresholds(batch_latency_p95_max_s=90, gpu_util_min_percent=40, error_ratio_max=0.1)


def _body(alarm_arns: list[str] | None = None) -> dict[str, Any]:
    slow = next(query for query in load_queries() if query.name == "slow_batches")
    return dashboard_body(STACK, "RayDataLLM/BatchInference", "eu-west-1", THRESHOLDS, GROUP, slow, alarm_arns or [])


def _by_title(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {widget["properties"]["title"]: widget for widget in body["widgets"]}


def test_dashboard_charts_what_the_job_published(published_run: PublishedRun) -> None:
    published = {
        (m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in published_run.metrics
    }
    charted = set()
    for widget in _body()["widgets"]:
        for line in widget["properties"].get("metrics", []):
            if isinstance(line[0], dict):
                continue  # a math expression over the lines beside it
            namespace, name, dim_name, dim_value = line[:4]
            assert namespace == published_run.config.namespace
            assert (name, ((dim_name, dim_value),)) in published, f"{widget['properties']['title']}: {name}"
            charted.add(name)
    # Throughput, latency, errors, GPU utilisation and cost all appear.
    assert {
        mn.ROWS_PROCESSED.name, mn.OUTPUT_TOKENS_PER_SECOND.name, mn.BATCH_LATENCY_P95.name,
        mn.ROWS_FAILED.name, mn.GPU_UTILIZATION.name, mn.COST_PER_MILLION_OUTPUT_TOKENS.name,
    } <= charted  # fmt: skip


def test_dashboard_draws_thresholds_alarms_and_slow_batches() -> None:
    arns = [
        "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:b",
        "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:a",
    ]
    widgets = _by_title(_body(arns))
    assert widgets["Batch latency (s)"]["properties"]["annotations"]["horizontal"][0]["value"] == 90
    assert widgets["GPU utilisation (%)"]["properties"]["annotations"]["horizontal"][0]["value"] == 40
    assert widgets["Errors"]["properties"]["annotations"]["horizontal"][0]["value"] == 0.1
    assert widgets["Alarms"]["properties"]["alarms"] == sorted(arns)
    query = widgets["Slow batches"]["properties"]["query"]
    assert query.startswith(f"SOURCE '{GROUP}' | fields") and "#" not in query and "\n" not in query
    assert all(widget["properties"].get("region", "eu-west-1") == "eu-west-1" for widget in widgets.values())
    # Widgets never overlap on the 24-column grid.
    cells = set()
    for widget in widgets.values():
        assert widget["x"] + widget["width"] <= 24
        for x in range(widget["x"], widget["x"] + widget["width"]):
            for y in range(widget["y"], widget["y"] + widget["height"]):
                assert (x, y) not in cells
                cells.add((x, y))


def test_cloudwatch_stores_the_dashboard(moto_reset: str) -> None:
    client = boto3.client("cloudwatch", region_name="eu-west-1")
    body = json.dumps(_body())
    client.put_dashboard(DashboardName=f"{STACK}-batch", DashboardBody=body)
    assert json.loads(client.get_dashboard(DashboardName=f"{STACK}-batch")["DashboardBody"]) == json.loads(body)


def test_a_starved_engine_shows_as_free_slots_while_rows_wait() -> None:
    """The feed's line: each engine's empty slots, drawn only in periods where the run still had rows."""
    widget = _by_title(_body())["Engine: free slots while rows wait"]
    lines = widget["properties"]["metrics"]
    ids = {line[-1].get("id"): line[1] for line in lines if not isinstance(line[0], dict) and "id" in line[-1]}
    assert ids == {"free": mn.ENGINE_FREE_SLOTS.name, "rows": mn.ROWS_PROCESSED.name}
    (expression,) = [line[0] for line in lines if isinstance(line[0], dict)]
    assert expression["expression"] == "IF(rows > 0, free)"


def test_free_slots_are_max_num_seqs_less_the_busy_slots_averaged_over_time() -> None:
    """vLLM's own stats objects: a step's busy slots are its running requests plus those it ended, weighted by the
    time since the step before; an engine left with nothing to do counts every slot free until it steps again,
    so an engine idle for want of rows shows. The clock is a list of instants standing in for time.monotonic."""
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    from workload.telemetry.engine_stats import EngineStats

    instants = iter([0.0, 0.0, 2.0, 3.0, 4.0, 5.0, 14.0, 24.0])
    stats = EngineStats(max_num_seqs=512, clock=lambda: next(instants))
    ended = IterationStats()
    ended.finished_requests = [FinishedRequestStats(finish_reason=None) for _ in range(12)]
    stats.record(SchedulerStats(num_running_reqs=500, num_waiting_reqs=0), ended)  # at 0: full, 500 + 12 ended
    stats.record(SchedulerStats(num_running_reqs=500, num_waiting_reqs=0), ended)  # 0-2: full
    stats.record(SchedulerStats(num_running_reqs=256, num_waiting_reqs=0), IterationStats())  # 2-3: 256 free
    first = stats.take()  # 3-4: 256 free, as the last step left it
    # (0 x 2 s + 256 x 1 s + 256 x 1 s) / 4 s; the mean over the three steps would be 85.3.
    assert first is not None and first.free_slots_mean == 128.0
    everything_ended = IterationStats()
    everything_ended.finished_requests = [FinishedRequestStats(finish_reason=None) for _ in range(256)]
    stats.record(SchedulerStats(num_running_reqs=0, num_waiting_reqs=0), everything_ended)  # 4-5: 256 free
    idle = stats.take()  # 5-14: nothing running, nothing waiting: all 512 free
    assert idle is not None and idle.free_slots_mean == (256 * 1 + 512 * 9) / 10  # the mean over steps: 256
    no_step = stats.take()  # 14-24: no step at all, still published: the engine's slots stood empty
    assert no_step is not None and no_step.free_slots_mean == 512.0 and no_step.running_requests == 0
    assert EngineStats().take() is None  # no step and no max_num_seqs: nothing to say
