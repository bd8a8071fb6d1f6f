"""The endpoint's metrics reporter: Ray's Prometheus export in, the interval's CloudWatch values out.

The export is made by prometheus_client (the library Ray's metrics agent exposes its metrics with) under Ray
Serve's metric names and labels (ray 2.60, serve/_private/request_ingress_metrics.py and deployment_state.py,
with Ray's `ray_` prefix), served over HTTP and read by the reporter; CloudWatch is a moto server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from workload.contract import metric_names as mn
from workload.telemetry.serve_reporter import interval_values, parse, percentile_from_buckets, report

BUCKETS_MS = (50, 100, 500, 1000, 5000)


class RayExport:
    """A registry holding Serve's HTTP proxy and controller metrics as Ray's head exports them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("route", "method", "application", "status_code")
        self.requests = Counter("ray_serve_num_http_requests", "requests", labels, registry=self.registry)
        self.latency = Histogram(
            "ray_serve_http_request_latency_ms", "latency", labels, buckets=BUCKETS_MS, registry=self.registry
        )
        self.replicas = Gauge(
            "ray_serve_deployment_replica_healthy", "healthy", ("deployment", "application"), registry=self.registry
        )

    def answer(self, status: str, latency_ms: float, count: int = 1) -> None:
        for _ in range(count):
            tags = {"route": "/", "method": "POST", "application": "llm-batch", "status_code": status}
            self.requests.labels(**tags).inc()
            self.latency.labels(**tags).observe(latency_ms)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_an_interval_publishes_its_requests_5xx_p95_and_replicas() -> None:
    export = RayExport()
    export.replicas.labels(deployment="LLMServer:llm-batch", application="llm-batch").set(2)
    export.replicas.labels(deployment="Ingress", application="llm-batch").set(1)  # not an engine replica
    export.answer("200", 40, count=50)
    before = parse(export.text())
    export.answer("200", 80, count=90)
    export.answer("200", 900, count=5)
    export.answer("500", 3000, count=4)
    export.answer("400", 30, count=1)  # the client's mistake, not the endpoint's
    values = interval_values(before, parse(export.text()))
    assert values[mn.SERVE_REQUESTS] == 100 and values[mn.SERVE_ERRORS] == 4
    assert values[mn.SERVE_REPLICAS] == 2
    # 91 of the interval's 100 requests took <= 100 ms, 96 <= 1000 ms: the p95 lies in the 1000 ms bucket.
    assert values[mn.SERVE_LATENCY_P95] == 1000


def test_a_quiet_interval_publishes_zero_requests_and_no_latency_and_a_reset_counts_as_new() -> None:
    export = RayExport()
    export.answer("200", 40, count=10)
    snapshot = parse(export.text())
    quiet = interval_values(snapshot, snapshot)
    assert quiet[mn.SERVE_REQUESTS] == 0 and mn.SERVE_LATENCY_P95 not in quiet
    restarted = RayExport()  # the head restarted: its counters begin again below the last reading
    restarted.answer("200", 40, count=3)
    assert interval_values(snapshot, parse(restarted.text()))[mn.SERVE_REQUESTS] == 3
    assert percentile_from_buckets({}, 0.95) is None


@pytest.fixture
def served_export() -> Iterator[tuple[RayExport, str]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    export = RayExport()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=export.registry)
    yield export, f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join(5)


def test_the_reporter_reads_the_export_over_http_and_puts_to_cloudwatch(served_export, moto_endpoint: str) -> None:
    import boto3

    export, url = served_export
    client = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=moto_endpoint)
    export.replicas.labels(deployment="LLMServer:llm-batch", application="llm-batch").set(1)
    published: list[list[dict]] = []

    def put(datums: list[dict]) -> None:
        published.append(datums)
        client.put_metric_data(Namespace="LLMBatch/ServeTest", MetricData=datums)
        export.answer("200", 70, count=5)  # traffic between this read and the next

    report(url, put, "medium", 0.01, threading.Event(), reads=range(3))
    assert len(published) == 2  # the first read is the baseline
    values = {d["MetricName"]: d["Value"] for d in published[-1]}
    assert values == {"ServeRequests": 5, "ServeErrors": 0, "ServeReplicas": 1, "ServeLatencyP95": 100}
    listed = client.list_metrics(Namespace="LLMBatch/ServeTest")["Metrics"]
    assert {m["MetricName"] for m in listed} == {metric.name for metric in mn.SERVE_METRICS}
    assert all(m["Dimensions"] == [{"Name": "Stack", "Value": "medium"}] for m in listed)


def test_an_unreadable_export_is_skipped_not_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    published: list[object] = []
    report("http://127.0.0.1:9/metrics", published.append, "s", 0.01, threading.Event(), reads=range(2))
    assert published == [] and "cannot read" in capsys.readouterr().err
