"""The real job (Ray Data LLM + vLLM on the CPU, the embedded tiny model) publishing to moto's CloudWatch:
what operators see on a real run, read back over HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from workload.contract import metric_names as mn
from workload.contract.config import build_config

REPO = Path(__file__).resolve().parents[2]
GROUP = "/llm-batch/e2e/job"
ROWS = 24


def _sum(metric: mn.MetricName, dimensions: dict[str, str], stat: str = "Sum") -> float:
    now = datetime.now(UTC)
    result = boto3.client("cloudwatch", region_name="us-east-1").get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": "RayDataLLM/BatchInference",
                        "MetricName": metric.name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
                    },
                    "Period": 60,
                    "Stat": stat,
                },
            }
        ],
        StartTime=now - timedelta(minutes=30),
        EndTime=now + timedelta(minutes=5),
    )
    return float(sum(result["MetricDataResults"][0]["Values"]))


@pytest.mark.slow
def test_a_real_run_publishes_what_the_alarms_watch(moto_reset: str, tmp_path: Path) -> None:
    from workload.job.attempt import run_job

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((REPO / "data" / "sample.jsonl").read_text().splitlines(keepends=True)[:ROWS]))
    boto3.client("logs", region_name="us-east-1").create_log_group(logGroupName=GROUP)
    config = build_config(
        {
            "input": {"uri": str(prompts)},
            "output": {"uri": str(tmp_path / "out"), "shard_rows": 8},
            "device": "cpu",
            "engine": {"max_model_len": 2048, "max_num_seqs": 32, "enforce_eager": True},
            "sampling": {"max_tokens": 16, "seed": 1},
            "batch_size": 8,
            "metrics": {
                "sink": "cloudwatch",
                "stack": "e2e",
                "run_id": "night-1",
                "log_group": GROUP,
                "region": "us-east-1",
                "price_per_hour_usd": 1.006,
            },
        }
    )
    outcome = run_job(config)
    summary: dict[str, Any] = outcome.summary or {}
    assert outcome.exit_code == 0 and summary["rows_in"] == ROWS

    stack = {mn.DIM_STACK: "e2e"}
    run = {**stack, mn.DIM_RUN: "night-1"}
    # Rows answered by the engine reach the alarm-facing series; the heartbeat counts the same rows.
    assert _sum(mn.ROWS_OK, stack) == _sum(mn.ROWS_OK, run) > 0
    assert _sum(mn.ROWS_PROCESSED, stack) == _sum(mn.ROWS_OK, stack) + _sum(mn.ROWS_FAILED, stack)
    assert _sum(mn.BATCH_LATENCY_P95, stack, "Maximum") > 0
    assert _sum(mn.RUN_DURATION, run, "Maximum") == pytest.approx(summary["wall_s"])
    cost = 1.006 * summary["wall_s"] / 3600 / summary["output_tokens"] * 1e6
    assert _sum(mn.COST_PER_MILLION_OUTPUT_TOKENS, stack, "Maximum") == pytest.approx(cost)
    assert _sum(mn.GPU_UTILIZATION, stack, "SampleCount") == 0  # a CPU run publishes no GPU figure

    logs = boto3.client("logs", region_name="us-east-1")
    lines = []
    for stream in logs.describe_log_streams(logGroupName=GROUP)["logStreams"]:
        events = logs.get_log_events(logGroupName=GROUP, logStreamName=stream["logStreamName"], startFromHead=True)
        lines += [json.loads(event["message"]) for event in events["events"]]
    batches = [line for line in lines if line["event"] == mn.LogEvent.BATCH_COMPLETE]
    assert batches and all(line["duration_ms"] > 0 and line["total_tokens"] > 0 for line in batches)
    # Every input row is counted once: engine batches, plus rows refused by validation before any engine saw them
    # (the sample's first 24 lines hold one malformed line), which count as failed with no batch of their own.
    assert _sum(mn.ROWS_PROCESSED, stack) == summary["rows_in"]
    assert _sum(mn.ROWS_FAILED, stack) == summary["rows_failed"] >= 1
    assert sum(line["rows_ok"] for line in batches) == summary["rows_ok"]
    (done,) = [line for line in lines if line["event"] == mn.LogEvent.RUN_COMPLETE]
    assert done["rows_ok"] == summary["rows_ok"] and done["config_hash"] == summary["config_hash"]
    assert done["batches"] == len(batches)
