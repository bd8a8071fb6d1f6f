"""The stack's CloudWatch dashboard body: throughput, latency, errors, GPU utilisation, cost, alarms, logs.

It charts the `Stack`-only series, so each night's run appears on one continuous graph; thresholds are drawn
as the alarms use them.
"""

from __future__ import annotations

from typing import Any

from monitoring.alarms import AlarmThresholds, ServeWatch
from monitoring.queries import SavedQuery, strip_comments
from workload.contract import metric_names as mn

_WIDTH = 12
_HEIGHT = 6
_DAY_S = 86400


def _metric(namespace: str, stack: str, metric: mn.MetricName, stat: str, period: int, **options: Any) -> list[Any]:
    if (mn.DIM_STACK,) not in metric.dimension_sets():
        raise ValueError(f"{metric.name} is not published with the Stack dimension alone")
    return [namespace, metric.name, mn.DIM_STACK, stack, {"stat": stat, "period": period, **options}]


def _graph(title: str, region: str, metrics: list[list[Any]], **properties: Any) -> dict[str, Any]:
    return {
        "type": "metric",
        "width": _WIDTH,
        "height": _HEIGHT,
        "properties": {
            "title": title,
            "region": region,
            "view": "timeSeries",
            "stacked": False,
            "metrics": metrics,
            **properties,
        },
    }


def dashboard_body(
    stack: str,
    namespace: str,
    region: str,
    thresholds: AlarmThresholds,
    log_group: str,
    slow_batches: SavedQuery,
    alarm_arns: list[str],
    serve: ServeWatch | None = None,
    batch_api: bool = False,
) -> dict[str, Any]:
    """The dashboard as CloudWatch's PutDashboard takes it (serialise with `json.dumps`); with `serve`, the
    online endpoint's latency, requests and error ratio, and replicas too; with `batch_api`, the Batch API's
    queue."""
    period = mn.ALARM_PERIOD_S
    widgets = [
        _graph(
            "Throughput",
            region,
            [
                _metric(namespace, stack, mn.ROWS_PROCESSED, "Sum", period, label="rows per 5 min"),
                _metric(
                    namespace,
                    stack,
                    mn.OUTPUT_TOKENS_PER_SECOND,
                    "Maximum",
                    _DAY_S,
                    label="output tokens/s (each run)",
                    yAxis="right",
                ),
            ],
        ),
        _graph(
            "Batch latency (s)",
            region,
            [
                _metric(namespace, stack, mn.BATCH_LATENCY_P50, "Maximum", period, label="p50"),
                _metric(namespace, stack, mn.BATCH_LATENCY_P95, "Maximum", period, label="p95"),
            ],
            annotations={"horizontal": [{"label": "p95 alarm", "value": thresholds.batch_latency_p95_max_s}]},
        ),
        _graph(
            "Errors",
            region,
            [
                _metric(namespace, stack, mn.ROWS_FAILED, "Sum", period, id="failed", label="failed rows"),
                _metric(namespace, stack, mn.ROWS_OK, "Sum", period, id="ok", visible=False),
                [
                    {
                        "expression": "IF((ok + failed) > 0, failed / (ok + failed))",
                        "id": "ratio",
                        "label": "error ratio",
                        "yAxis": "right",
                    }
                ],
            ],
            annotations={
                "horizontal": [{"label": "error ratio alarm", "value": thresholds.error_ratio_max, "yAxis": "right"}]
            },
        ),
        _graph(
            "GPU utilisation (%)",
            region,
            [_metric(namespace, stack, mn.GPU_UTILIZATION, "Average", period, label="mean over GPUs")],
            yAxis={"left": {"min": 0, "max": 100}},
            annotations={"horizontal": [{"label": "low-utilisation alarm", "value": thresholds.gpu_util_min_percent}]},
        ),
        engine_feed_widget(stack, namespace, region),
        _graph(
            "Cost per million output tokens (USD, each run)",
            region,
            [
                _metric(namespace, stack, mn.COST_PER_MILLION_OUTPUT_TOKENS, "Maximum", _DAY_S, label="USD/M"),
                _metric(namespace, stack, mn.RUN_DURATION, "Maximum", _DAY_S, label="run (s)", yAxis="right"),
            ],
        ),
        {
            "type": "alarm",
            "width": _WIDTH,
            "height": _HEIGHT,
            "properties": {"title": "Alarms", "alarms": sorted(alarm_arns)},
        },
        {
            "type": "log",
            "width": 2 * _WIDTH,
            "height": _HEIGHT,
            "properties": {
                "title": "Slow batches",
                "region": region,
                "view": "table",
                "query": f"SOURCE '{log_group}' | " + " ".join(strip_comments(slow_batches.text).split()),
            },
        },
    ]
    if serve is not None:
        widgets[-1:-1] = serve_widgets(stack, namespace, region, serve)
    if batch_api:
        widgets[-1:-1] = batch_api_widgets(stack, namespace, region)
    # Two widgets a row, in the order above; a full-width one (the log table) starts a row of its own.
    x = y = 0
    for widget in widgets:
        if x + widget["width"] > 2 * _WIDTH:
            x, y = 0, y + _HEIGHT
        widget["x"], widget["y"] = x, y
        x += widget["width"]
    return {"start": "-P7D", "periodOverride": "inherit", "widgets": widgets}


def engine_feed_widget(stack: str, namespace: str, region: str) -> dict[str, Any]:
    """Rows waiting in the job while the engine has free slots: each engine's empty sequence slots (mean over
    time: an engine idle for want of rows counts every slot free), drawn only in periods where the run still
    processed rows, beside vLLM's running and waiting counts. A line well above 0 mid-run is a starved engine: the
    job's feed, not the GPU, bounds the night (docs/benchmark.md: the feed); a queue (waiting) with free slots is
    the KV cache instead (preemptions)."""
    period = mn.ALARM_PERIOD_S
    return _graph(
        "Engine: free slots while rows wait",
        region,
        [
            _metric(namespace, stack, mn.ENGINE_FREE_SLOTS, "Average", period, id="free", visible=False),
            _metric(namespace, stack, mn.ROWS_PROCESSED, "Sum", period, id="rows", visible=False),
            [{"expression": "IF(rows > 0, free)", "id": "starved", "label": "free slots while rows wait"}],
            _metric(namespace, stack, mn.ENGINE_RUNNING, "Average", period, label="running", yAxis="right"),
            _metric(namespace, stack, mn.ENGINE_WAITING, "Average", period, label="waiting", yAxis="right"),
        ],
        yAxis={"left": {"min": 0}, "right": {"min": 0}},
    )


def serve_widgets(stack: str, namespace: str, region: str, serve: ServeWatch) -> list[dict[str, Any]]:
    """The endpoint's graphs, thresholds drawn as its alarms use them (monitoring.alarms.serve_alarms)."""
    period = 60  # the reporter publishes every minute; alarms read 5-minute periods
    return [
        _graph(
            "Endpoint latency p95 (ms)",
            region,
            [_metric(namespace, stack, mn.SERVE_LATENCY_P95, "Maximum", period, label="p95")],
            annotations={"horizontal": [{"label": "latency alarm", "value": serve.latency_p95_max_ms}]},
        ),
        _graph(
            "Endpoint requests and errors",
            region,
            [
                _metric(namespace, stack, mn.SERVE_REQUESTS, "Sum", period, id="requests", label="requests"),
                _metric(namespace, stack, mn.SERVE_ERRORS, "Sum", period, id="errors", label="5xx"),
                [
                    {
                        "expression": "IF(requests > 0, errors / requests)",
                        "id": "ratio",
                        "label": "error ratio",
                        "yAxis": "right",
                    }
                ],
            ],
            annotations={
                "horizontal": [{"label": "error ratio alarm", "value": serve.error_ratio_max, "yAxis": "right"}]
            },
        ),
        _graph(
            "Endpoint replicas",
            region,
            [_metric(namespace, stack, mn.SERVE_REPLICAS, "Maximum", period, label="healthy engine replicas")],
            yAxis={"left": {"min": 0}},
            annotations={"horizontal": [{"label": "serve.max_replicas", "value": serve.max_replicas}]},
        ),
    ]


def batch_api_widgets(stack: str, namespace: str, region: str) -> list[dict[str, Any]]:
    """The Batch API's queue: batches waiting, running and at risk of missing their window (each tick's count; the
    last is what the batch-api-at-risk alarm reads), and those that failed or expired (each period's sum, what the
    batch-api-failed / batch-api-expired alarms read)."""
    period = mn.ALARM_PERIOD_S  # a tick every 1 to 60 minutes (batch_api.tick_minutes): one period holds one
    return [
        _graph(
            "Batch API: queued and running batches",
            region,
            [
                _metric(namespace, stack, mn.BATCH_API_QUEUED, "Maximum", period, label="queued (validating)"),
                _metric(namespace, stack, mn.BATCH_API_RUNNING, "Maximum", period, label="running"),
                _metric(namespace, stack, mn.BATCH_API_AT_RISK, "Maximum", period, label="at risk of expiring"),
            ],
            yAxis={"left": {"min": 0}},
        ),
        _graph(
            "Batch API: failed and expired batches",
            region,
            [
                _metric(namespace, stack, mn.BATCH_API_FAILED, "Sum", period, label="failed"),
                _metric(namespace, stack, mn.BATCH_API_EXPIRED, "Sum", period, label="expired"),
            ],
            yAxis={"left": {"min": 0}},
        ),
    ]
