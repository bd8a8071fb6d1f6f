"""The per-node GPU reporter against moto: GPU figures and log lines, never row counts."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
import yaml

from workload.contract import metric_names as mn
from workload.contract.config import build_config
from workload.telemetry.gpu import GpuSampler
from workload.telemetry.gpu_reporter import main, serve

GROUP = "/llm-batch/gpu-test/job"


class _FakeNvml:
    """Stands in for pynvml: this machine has no NVIDIA driver, so no real NVML reading can happen here."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=88)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=1, total=2)

    def nvmlShutdown(self) -> None:
        pass


def _job(tmp_path: Path, sink: str = "cloudwatch") -> dict[str, object]:
    return {
        "input": {"uri": str(tmp_path / "in.jsonl")},
        "output": {"uri": str(tmp_path / "out")},
        "metrics": {
            "sink": sink,
            "stack": "gpu-test",
            "log_group": GROUP,
            "region": "us-east-1",
            "publish_interval_s": 0.2,
            "gpu_sample_interval_s": 0.05,
        },
    }


def test_reporter_publishes_gpu_only(moto_reset: str, tmp_path: Path) -> None:
    boto3.client("logs", region_name="us-east-1").create_log_group(logGroupName=GROUP)
    stop = threading.Event()
    worker = threading.Thread(
        target=serve, args=(build_config(_job(tmp_path)), "node-a", GpuSampler(_FakeNvml(), [0, 1]), stop)
    )
    worker.start()
    time.sleep(0.7)
    stop.set()
    worker.join(timeout=30)
    assert not worker.is_alive()

    listed = boto3.client("cloudwatch", region_name="us-east-1").list_metrics(Namespace="RayDataLLM/BatchInference")
    names = {metric["MetricName"] for metric in listed["Metrics"]}
    assert names == {mn.GPU_UTILIZATION.name}  # no RowsProcessed: the no-progress alarm only hears the driver
    logs = boto3.client("logs", region_name="us-east-1")
    stream = logs.describe_log_streams(logGroupName=GROUP)["logStreams"][0]["logStreamName"]
    lines = [
        json.loads(event["message"])
        for event in logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)["events"]
    ]
    assert lines and {line["event"] for line in lines} == {mn.LogEvent.GPU_SAMPLE}
    assert all(line["gpu_util_pct"] == 88.0 and line["gpu_count"] == 2 for line in lines)


def test_main_exits_cleanly_where_there_is_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "job.yaml"
    config_file.write_text(yaml.safe_dump(_job(tmp_path, sink="none")))
    assert main(["--config", str(config_file)]) == 0
    assert "not 'cloudwatch'" in capsys.readouterr().err
    if GpuSampler.open() is None:  # this CPU machine: the real NVML finds no driver
        config_file.write_text(yaml.safe_dump(_job(tmp_path)))
        assert main(["--config", str(config_file)]) == 0
        assert "no NVIDIA GPU" in capsys.readouterr().err
    config_file.write_text("metrics: {sink: kafka}\n")
    assert main(["--config", str(config_file)]) == 2
    assert "metrics.sink" in capsys.readouterr().err
