"""The endpoint's config and app wiring, without starting Ray or an engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.workload.serve_results import bench_result
from workload.cli.commands import EXIT_BAD_CONFIG, main
from workload.contract.config import ConfigError, build_config
from workload.contract.serve_config import DEFAULT_MODEL_ID, build_serve_config, load_serve_config

JOB_CONFIG = {
    "input": {"uri": "data/prompts.jsonl"},
    "output": {"uri": "out/run", "shard_rows": 50},
    "model": {"source": "Qwen/Qwen3-0.6B", "load_format": "dummy"},
    "engine": {"max_model_len": 1024, "max_num_seqs": 32, "enforce_eager": True, "extra": {"block_size": 32}},
    "stages": {"batch_size": 16},
    "sampling": {"max_tokens": 32},
    "metrics": {"sink": "none"},
    "resume": {"mode": "restart"},
    "device": "cpu",
    "replicas": 1,
    "max_replicas": 2,
    "batch_size": 8,
}


def test_no_config_file_serves_the_tiny_model_on_loopback() -> None:
    config = load_serve_config(None)
    assert config.model.source is None  # the embedded tiny model
    assert (config.device, config.serve.host, config.serve.port) == ("cpu", "127.0.0.1", 8000)
    assert config.serve.model_id == DEFAULT_MODEL_ID
    assert config.serve.haproxy and config.serve.direct_streaming  # the configuration that met issue 22's targets


def test_direct_streaming_follows_haproxy_unless_set() -> None:
    assert not build_serve_config({"serve": {"haproxy": False}}).serve.direct_streaming
    settings = build_serve_config({"serve": {"direct_streaming": False}}).serve
    assert settings.haproxy and not settings.direct_streaming


def test_a_job_config_file_serves_the_same_model_and_engine(tmp_path: Path) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(yaml.safe_dump(JOB_CONFIG))
    config = load_serve_config(file, {"serve.port": 9001})
    job = build_config(JOB_CONFIG)
    assert config.model == job.model
    assert config.engine == job.engine
    assert (config.device, config.replicas, config.max_replicas) == (job.device, job.replicas, job.max_replicas)
    assert config.serve.port == 9001


def test_the_app_gets_the_batch_jobs_own_engine_arguments() -> None:
    from workload.engine.pipeline import engine_env, engine_kwargs
    from workload.serve.app import llm_config_fields

    config = build_serve_config(JOB_CONFIG)
    fields = llm_config_fields(config)
    job = build_config(JOB_CONFIG)
    assert fields["engine_kwargs"] == engine_kwargs(job)
    assert fields["runtime_env"] == {"env_vars": engine_env(job)}
    assert fields["model_loading_config"] == {"model_id": DEFAULT_MODEL_ID, "model_source": "Qwen/Qwen3-0.6B"}
    assert fields["deployment_config"]["autoscaling_config"] == {
        "min_replicas": 1,
        "initial_replicas": 1,
        "max_replicas": 2,
    }
    assert fields["placement_group_config"] == {"bundles": [{"CPU": 1}]}  # never a GPU request on the CPU


def test_ray_serve_llm_accepts_the_config_as_a_cpu_deployment() -> None:
    from ray.serve.llm import LLMConfig

    from workload.serve.app import llm_config_fields

    llm_config = LLMConfig(**llm_config_fields(build_serve_config({})))
    assert llm_config.accelerator_config is not None
    assert llm_config.accelerator_config.kind == "cpu"
    assert llm_config.max_request_context_length == 2048


def test_a_gpu_config_leaves_placement_to_serve_llm() -> None:
    from workload.serve.app import llm_config_fields

    fields = llm_config_fields(build_serve_config({"device": "gpu"}))
    assert "placement_group_config" not in fields
    assert fields["engine_kwargs"]["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"serve": {"prot": 1}}, "serve.prot"),
        ({"servr": {}}, "servr"),
        ({"serve": {"port": 70000}}, "serve.port"),
        ({"serve": {"haproxy": False, "direct_streaming": True}}, "serve.direct_streaming needs serve.haproxy"),
        ({"device": "cpu", "engine": {"tensor_parallel_size": 2}}, "tensor_parallel_size"),
    ],
)
def test_a_bad_config_is_refused_naming_the_key(data: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        build_serve_config(data)


def test_serve_with_a_bad_config_exits_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "serve.yaml"
    file.write_text(yaml.safe_dump({"serve": {"port": "eighty"}}))
    assert main(["serve", "--config", str(file)]) == EXIT_BAD_CONFIG
    assert "serve.port" in capsys.readouterr().err


def test_haproxy_switches_and_its_files_stay_in_the_endpoints_scratch(tmp_path: Path) -> None:
    from workload.serve.endpoint import feature_env

    env = feature_env(build_serve_config({"serve": {"haproxy": True, "direct_streaming": True}}), str(tmp_path))
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] == "1"
    haproxy_paths = [
        value for key, value in env.items() if key.startswith("RAY_SERVE_HAPROXY_") and not key.endswith("_PORT")
    ]
    assert haproxy_paths and all(path.startswith(str(tmp_path)) for path in haproxy_paths)
    plain = feature_env(build_serve_config({"serve": {"haproxy": False}}), str(tmp_path))
    assert plain["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert not any(key.startswith("RAY_SERVE_HAPROXY_") for key in plain)


def test_a_loopback_endpoint_keeps_ray_on_loopback_but_a_cluster_driver_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes a private local Ray take 127.0.0.1 as its node address (its servers
    then bind loopback: tests/workload/test_serve_endpoint.py checks the sockets); never for 0.0.0.0 or a cluster."""
    from workload.serve.endpoint import feature_env

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert feature_env(build_serve_config({}), str(tmp_path))["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    public = build_serve_config({"serve": {"host": "0.0.0.0"}})
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in feature_env(public, str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "ray-head:6379")
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in feature_env(build_serve_config({}), str(tmp_path))


def test_a_replicas_grpc_server_binds_the_node_address_not_every_interface() -> None:
    from workload.serve.bind_hosts import grpc_binder

    bound: list[str] = []
    add_port = grpc_binder(lambda server, address: bound.append(address) or 4321, "127.0.0.1")
    assert add_port(object(), "[::]:0") == 4321
    add_port(object(), "10.0.0.5:7000")  # an explicit address is left as it is
    assert bound == ["127.0.0.1:0", "10.0.0.5:7000"]


def test_haproxys_stats_and_metrics_listeners_follow_the_http_host() -> None:
    """The setup hook's rewrite of Ray 2.60's HAProxy template, rendered as Serve renders it."""
    import jinja2
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

    from workload.serve.bind_hosts import rebind

    class Config:
        frontend_host, metrics_port, stats_port = "127.0.0.1", 9101, 8404

    def binds(template: str) -> list[str]:  # the stats and metrics bind lines, rendered
        lines = [line.strip() for line in template.splitlines() if line.strip().startswith("bind")]
        ours = [line for line in lines if "metrics_port" in line or "stats_port" in line]
        return [jinja2.Environment().from_string(line).render(config=Config) for line in ours]

    assert {"bind :9101", "bind *:8404"} <= set(binds(HAPROXY_CONFIG_TEMPLATE))
    rebound = rebind(HAPROXY_CONFIG_TEMPLATE)
    assert "bind 127.0.0.1:9101" in binds(rebound) and "bind 127.0.0.1:8404" in binds(rebound)
    assert not {"bind :9101", "bind *:8404"} & set(binds(rebound))
    with pytest.raises(RuntimeError, match="bind_hosts"):
        rebind("frontend prometheus\n    bind 10.0.0.1:9101\n")


def test_vllm_cli_shim_runs_vllms_own_cli_on_the_cpu_build() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workload.serve.vllm_cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1].startswith("0.32.0")


def test_scorecard_holds_serve_to_the_issues_two_targets(tmp_path: Path) -> None:
    import math

    from workload.serve.bench_profiles import SERVE_PROFILES
    from workload.serve.scorecard import build_scorecard, plot_scorecard, render_table

    profile = SERVE_PROFILES["cpu"].model_copy(update={"rates": [2.0, 8.0, math.inf]})
    runs = [
        {
            "target": "vllm",
            "features": None,
            "error": None,
            "points": {"2": bench_result(250, 40), "8": bench_result(1000, 50), "inf": bench_result(4000, 900)},
        },
        {
            "target": "serve",
            "features": {"haproxy": False, "direct_streaming": False},
            "error": None,
            "points": {
                "2": bench_result(250, 45),
                "8": bench_result(990, 70, completed=39),
                "inf": {"error": "vllm bench serve exited 1"},
            },
        },
    ]
    scorecard = build_scorecard(profile, runs)
    assert (scorecard["saturation_rate"], scorecard["middle_rate"]) == ("inf", "8")
    check = scorecard["checks"]["serve"]
    assert check["throughput_ratio_at_inf"] is None and not check["throughput_ok"]  # no figure: not a pass
    assert check["ttft_p99_ratio_at_8"] == 1.4 and not check["ttft_ok"]
    assert scorecard["results"]["serve"]["points"]["8"]["failures"] == 1
    table = render_table(scorecard)
    assert "| serve | inf |" in table and "vllm bench serve exited 1" in table
    assert plot_scorecard(scorecard, tmp_path / "plot.png").stat().st_size > 0


def test_a_leftover_haproxy_of_this_endpoint_is_stopped_and_no_other_process(tmp_path: Path) -> None:
    """A stand-in process (python sleeping) whose command line names the endpoint's HAProxy folder, as HAProxy's
    `-f FOLDER/.../haproxy.cfg` does; a second one naming another folder must survive."""
    from workload.serve.endpoint import stop_leftover_haproxy

    ours = tmp_path / "lsv-1" / "h"
    other = tmp_path / "lsv-2" / "h"
    sleeper = "import time; time.sleep(60)"
    mine = subprocess.Popen([sys.executable, "-c", sleeper, "-f", str(ours / "x" / "haproxy.cfg")])
    theirs = subprocess.Popen([sys.executable, "-c", sleeper, "-f", str(other / "x" / "haproxy.cfg")])
    try:
        assert stop_leftover_haproxy(str(ours)) == [mine.pid]
        assert mine.wait(timeout=10) != 0
        assert theirs.poll() is None
    finally:
        for process in (mine, theirs):
            process.kill()
            process.wait()
