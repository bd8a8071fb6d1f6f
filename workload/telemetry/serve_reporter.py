"""`python -m workload.telemetry.serve_reporter --namespace NS --stack S --region R`: the endpoint's CloudWatch metrics.

Beside the RayService's head (a sidecar), it reads Ray's Prometheus export on the head node every interval and
publishes what the dashboard and the alarms watch (`workload.contract.metric_names`: ServeRequests, ServeErrors,
ServeLatencyP95, ServeReplicas), under the `Stack` dimension. Serve's HTTP proxy runs on the head only
(`proxy_location: HeadOnly`) and Serve's controller too, so the head's export holds every request and the
replica count. Counters are cumulative in the export: each interval publishes the increase since the last read,
and the p95 comes from the increase of the latency histogram's buckets in that interval.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from workload.contract import metric_names as mn

REQUESTS = "ray_serve_num_http_requests"
LATENCY = "ray_serve_http_request_latency_ms"
REPLICAS = "ray_serve_deployment_replica_healthy"
# Ray Serve LLM's engine deployments (workload/serve/app.py builds one); the ingress replicas are not counted.
ENGINE_DEPLOYMENT_PREFIX = "LLMServer:"
DEFAULT_URL = "http://127.0.0.1:8080/metrics"


@dataclass(frozen=True)
class Snapshot:
    """One read of the export: cumulative counts, and the healthy engine replicas right now."""

    requests: float = 0.0
    errors: float = 0.0  # 5xx answers: the endpoint's failures, not the clients' (4xx)
    buckets: dict[float, float] = field(default_factory=dict)  # latency upper bound (ms) -> cumulative count
    replicas: float = 0.0


def parse(text: str) -> Snapshot:
    """The snapshot in a Prometheus text export (every series summed over the labels not used here)."""
    requests = errors = replicas = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name in (REQUESTS, f"{REQUESTS}_total"):
                requests += value
                if str(labels.get("status_code", "")).startswith("5"):
                    errors += value
            elif name == f"{LATENCY}_bucket":
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif name == REPLICAS and str(labels.get("deployment", "")).startswith(ENGINE_DEPLOYMENT_PREFIX):
                replicas += value
    return Snapshot(requests=requests, errors=errors, buckets=buckets, replicas=replicas)


def _increase(now: float, before: float) -> float:
    # A counter that went down was reset (the head restarted): all it holds is new.
    return now - before if now >= before else now


def percentile_from_buckets(increase: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile of an interval's requests; None without requests.

    Past the last finite bound (`+Inf`) the last finite bound is returned: the histogram knows no more."""
    total = increase.get(math.inf, max(increase.values(), default=0.0))
    if total <= 0:
        return None
    finite = sorted(bound for bound in increase if bound != math.inf)
    for bound in finite:
        if increase[bound] >= q * total:
            return bound
    return finite[-1] if finite else None


def interval_values(before: Snapshot, now: Snapshot) -> dict[mn.MetricName, float]:
    """What one interval publishes: requests and 5xx answers in it, its p95 latency (if any request), replicas."""
    values = {
        mn.SERVE_REQUESTS: _increase(now.requests, before.requests),
        mn.SERVE_ERRORS: _increase(now.errors, before.errors),
        mn.SERVE_REPLICAS: now.replicas,
    }
    increase = {bound: _increase(count, before.buckets.get(bound, 0.0)) for bound, count in now.buckets.items()}
    p95 = percentile_from_buckets(increase, 0.95)
    if p95 is not None:
        values[mn.SERVE_LATENCY_P95] = p95
    return values


def datums(values: dict[mn.MetricName, float], stack: str) -> list[dict[str, Any]]:
    return [
        {
            "MetricName": metric.name,
            "Dimensions": [{"Name": mn.DIM_STACK, "Value": stack}],
            "Value": value,
            "Unit": metric.unit,
        }
        for metric, value in values.items()
    ]


def read(url: str, timeout_s: float = 5.0) -> Snapshot:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode())


def report(
    url: str, put: Any, stack: str, interval_s: float, stop: threading.Event, reads: Iterable[int] | None = None
) -> None:
    """Every `interval_s` until `stop`: read the export, publish the interval's values with `put(datums)`.

    A failed read (Ray not up yet, the head restarting) is said on stderr and skipped: nothing is published for
    it, which the alarms treat as no traffic. `reads` bounds the loop (tests)."""
    before: Snapshot | None = None
    for _ in reads if reads is not None else iter(int, 1):
        try:
            now = read(url)
        except OSError as error:
            print(f"serve_reporter: cannot read {url}: {error}", file=sys.stderr, flush=True)
            now = None
        if now is not None and before is not None:
            try:
                put(datums(interval_values(before, now), stack))
            except Exception as error:  # a failed put loses one interval, not the sidecar
                print(f"serve_reporter: publishing failed: {error}", file=sys.stderr, flush=True)
        before = now or before
        if stop.wait(interval_s):
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workload.telemetry.serve_reporter", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--namespace", required=True, help="CloudWatch namespace (the stack's metrics namespace)")
    parser.add_argument("--stack", required=True, help="the Stack dimension")
    parser.add_argument("--region", required=True)
    parser.add_argument("--url", default=DEFAULT_URL, help=f"Ray's Prometheus export (default {DEFAULT_URL})")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between publishes (default 60)")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.interval > mn.ALARM_PERIOD_S:
        print(f"error: --interval must be in (0, {mn.ALARM_PERIOD_S}] s (the alarms' period)", file=sys.stderr)
        return 2
    import boto3

    client = boto3.client("cloudwatch", region_name=args.region)
    stop = threading.Event()

    def _stop(number: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"serve_reporter: {args.url} -> {args.namespace} every {args.interval:g} s", file=sys.stderr, flush=True)
    report(
        args.url,
        lambda data: client.put_metric_data(Namespace=args.namespace, MetricData=data),
        args.stack,
        args.interval,
        stop,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
