"""What the job's Ray node is set up with: workers at the driver's priority, usage stats and Ray Data LLM's
telemetry actor off, the pipeline's imports done while Ray starts. A real private Ray (workload.runtime)."""

from __future__ import annotations

import os
import sys

import pytest
import ray

from workload.contract import entrypoint
from workload.engine.pipeline import usage_telemetry_off_when_disabled
from workload.runtime import _import_in_background, ray_session


@ray.remote
def _worker_view() -> dict[str, object]:
    return {"nice": os.nice(0), "usage_stats": os.environ.get("RAY_USAGE_STATS_ENABLED")}


def test_the_private_ray_runs_workers_at_nice_0_without_usage_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in entrypoint.RAY_NODE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    sys.modules.pop("json.tool", None)
    with ray_session("cpu", preload=("json.tool",)):
        assert "json.tool" in sys.modules  # imported while Ray started
        view = ray.get(_worker_view.remote())
    # Ray's own default is 15 (RAY_worker_niceness): the engine would lose the CPU to the driver.
    assert view == {"nice": 0, "usage_stats": "0"}
    assert all(name not in os.environ for name in entrypoint.RAY_NODE_SETTINGS), "the session restores the caller's"


def test_a_failing_preload_is_left_to_the_callers_own_import() -> None:
    _import_in_background(("workload.no_such_module",)).join(timeout=30)
    with pytest.raises(ModuleNotFoundError):
        __import__("workload.no_such_module")


def test_without_usage_stats_the_processor_gets_no_telemetry_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.llm._internal.batch.processor import vllm_engine_proc

    upstream = vllm_engine_proc.get_or_create_telemetry_agent
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    with usage_telemetry_off_when_disabled():
        agent = vllm_engine_proc.get_or_create_telemetry_agent()
        assert not hasattr(agent, "remote_telemetry_agent")  # no actor: nothing to start and wait on
        agent.push_telemetry_report(object())
    assert vllm_engine_proc.get_or_create_telemetry_agent is upstream
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    with usage_telemetry_off_when_disabled():  # a user who keeps usage stats on keeps upstream's reporting
        assert vllm_engine_proc.get_or_create_telemetry_agent is upstream
