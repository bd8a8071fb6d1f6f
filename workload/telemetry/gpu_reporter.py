"""`python -m workload.telemetry.gpu_reporter --config job.yaml`: publish this node's GPU utilisation until stopped.

The job's metrics sink runs in the Ray driver. On the small tier that is the GPU node, but on the EKS tiers the
driver sits on the CPU head, so the GPU workers run this beside the engine (a sidecar or a per-node process):
the same config, the same metric names and log lines (`GPUUtilization`, `gpu_sample`), and no row counts, so
it never looks like a run making no progress. Without a GPU or a CloudWatch sink it says so and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from types import FrameType

from workload.contract.config import ConfigError, JobConfig, load_config
from workload.telemetry.cloudwatch import CloudWatchMetrics
from workload.telemetry.gpu import GpuSampler


def serve(config: JobConfig, run_id: str, sampler: GpuSampler, stop: threading.Event) -> None:
    """Publish the sampler's readings every `metrics.publish_interval_s` until `stop` is set."""
    reporter = CloudWatchMetrics(config.metrics, run_id, gpu_sampler=sampler, heartbeat=False)
    try:
        stop.wait()
    finally:
        reporter.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workload.telemetry.gpu_reporter", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", required=True, help="the job's YAML or JSON config file")
    parser.add_argument("--run-id", help="the Run dimension; default: metrics.run_id, else the node's name")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.metrics.sink != "cloudwatch":
        print("gpu_reporter: metrics.sink is not 'cloudwatch'; nothing to publish", file=sys.stderr)
        return 0
    sampler = GpuSampler.open()
    if sampler is None:
        print("gpu_reporter: no NVIDIA GPU on this node; nothing to publish", file=sys.stderr)
        return 0
    stop = threading.Event()

    def _stop(number: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    run_id = args.run_id or config.metrics.run_id or socket.gethostname()
    print(f"gpu_reporter: {sampler.gpu_count} GPU(s), publishing to {config.metrics.namespace}", file=sys.stderr)
    serve(config, run_id, sampler, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
