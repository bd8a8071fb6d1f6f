"""`python -m workload bench-serve`: Ray Serve LLM against `vllm serve`, both driven by vLLM's own client.

For each target (native vLLM, then Ray Serve LLM with each feature set) one server is started on 127.0.0.1 with
the same model and engine arguments, `vllm bench serve` sends vLLM's random dataset at each offered rate up to
saturation, the server is stopped, and the next starts: one server at a time, so none steals the other's cores.
With `repeat` > 1 the targets are measured round after round, interleaved (`round_orders`), and the scorecard holds
every round and takes the median per target and rate. Every `vllm bench serve` result JSON is kept; the scorecard
(JSON, Markdown) and a plot are made from them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from workload.auth.keys import ENV_KEY
from workload.bench.profiles import materialise_model
from workload.contract.serve_config import DEFAULT_MODEL_ID, ServeConfig, build_serve_config
from workload.engine.pipeline import engine_env, engine_kwargs
from workload.serve.bench_profiles import NATIVE, SERVE_TARGETS, ServeBenchProfile, round_orders

START_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_config(profile: ServeBenchProfile, model_path: Path, target: str, port: int) -> ServeConfig:
    return build_serve_config(
        {
            "model": {"source": str(model_path), "load_format": profile.model.load_format},
            "engine": profile.engine.model_dump(),
            "device": profile.device,
            "serve": {"port": port, "model_id": DEFAULT_MODEL_ID, **SERVE_TARGETS.get(target, {})},
        }
    )


def _server_command(
    target: str, config: ServeConfig, model_path: Path, folder: Path
) -> tuple[list[str], dict[str, str]]:
    settings = config.serve
    if target == NATIVE:
        job = config.job_view()
        engine_file = folder / "vllm-engine.yaml"
        # vLLM's --config file: one key per engine argument, the very dict the job and the endpoint use.
        engine_file.write_text(yaml.safe_dump(engine_kwargs(job)))
        command = [
            sys.executable,
            "-m",
            "workload.serve.vllm_cli",
            "serve",
            str(model_path),
            "--config",
            str(engine_file),
            "--host",
            settings.host,
            "--port",
            str(settings.port),
            "--served-model-name",
            settings.model_id,
        ]
        return command, engine_env(job)
    config_file = folder / f"{target}.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return [sys.executable, "-m", "workload", "serve", "--config", str(config_file)], {}


def key_env(target: str, key: str) -> tuple[dict[str, str], dict[str, str]]:
    """Every target behind an API key, as a client meets it: the server's environment, and the client's
    (`vllm bench serve` sends OPENAI_API_KEY as a bearer key). `vllm serve` checks its own (VLLM_API_KEY)."""
    server = {"VLLM_API_KEY": key} if target == NATIVE else {ENV_KEY: key}
    return server, {"OPENAI_API_KEY": key}


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], timeout_s: float, key: str) -> float:
    started = time.monotonic()
    request = urllib.request.Request(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as response:
            if response.status == 200:
                return time.monotonic() - started
        time.sleep(2)
    raise RuntimeError(f"the server was not ready within {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=150)  # a graceful stop also stops Serve's HAProxy, which the group kill below misses
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the engine and Ray workers share the group
    process.wait()


def _rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _bench_command(profile: ServeBenchProfile, base_url: str, model_path: Path, rate: float, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "workload.serve.vllm_cli",
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        DEFAULT_MODEL_ID,
        "--tokenizer",
        str(model_path),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(profile.input_len),
        "--random-output-len",
        str(profile.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(profile.prompts_at(rate)),
        "--request-rate",
        _rate_label(rate),
        "--num-warmups",
        str(profile.warmups),
        "--seed",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,95,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]


def _stamp() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


def run_target(
    profile: ServeBenchProfile, target: str, model_path: Path, out_dir: Path, round_number: int | None = None
) -> dict[str, Any]:
    """Start one server, measure every rate against it, stop it. Failures are recorded, not raised.

    `round_number` (from 1) names the files of a repeated run (`TARGET.round-N-rate-R.json`) so no round overwrites
    another; None keeps a single run's names."""
    port = _free_port()
    config = serve_config(profile, model_path, target, port)
    base_url = f"http://127.0.0.1:{port}"
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = target if round_number is None else f"{target}.round-{round_number}"
    record: dict[str, Any] = {"target": target, "features": SERVE_TARGETS.get(target), "points": {}, "error": None}
    if round_number is not None:
        record["round"] = round_number
    # The machine's 1-minute load average as each rate starts: on shared cores it explains much of the spread.
    record["load_average"] = {}
    server_key_env, client_env = key_env(target, secrets.token_urlsafe(32))
    with tempfile.TemporaryDirectory(prefix="llmb-bench-", dir="/tmp") as scratch:
        command, extra_env = _server_command(target, config, model_path, Path(scratch))
        env = {
            **os.environ,
            **extra_env,
            **server_key_env,
            "TMPDIR": scratch,
            "VLLM_CACHE_ROOT": os.path.join(scratch, "vllm"),
        }
        with (logs / f"{stem}.server.log").open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                ready_s = _wait_ready(base_url, process, START_TIMEOUT_S, client_env["OPENAI_API_KEY"])
                record["ready_s"] = round(ready_s, 1)
                for rate in profile.rates:
                    result_file = out_dir / "raw" / f"{stem}-rate-{_rate_label(rate)}.json"
                    result_file.parent.mkdir(parents=True, exist_ok=True)
                    record["load_average"][_rate_label(rate)] = round(os.getloadavg()[0], 2)
                    # A timestamp per point, so samples taken beside the run (top, ps) can be matched to it.
                    print(f"[bench-serve] {_stamp()} {stem}: rate {_rate_label(rate)}", flush=True)
                    with (logs / f"{stem}-rate-{_rate_label(rate)}.bench.log").open("wb") as bench_log:
                        done = subprocess.run(
                            _bench_command(profile, base_url, model_path, rate, result_file),
                            stdout=bench_log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, **client_env},
                            timeout=1800,
                            check=False,
                        )
                    if done.returncode != 0 or not result_file.is_file():
                        record["points"][_rate_label(rate)] = {"error": f"vllm bench serve exited {done.returncode}"}
                        continue
                    record["points"][_rate_label(rate)] = json.loads(result_file.read_text())
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                record["error"] = str(error)
            finally:
                _stop(process)
    return record


def run_serve_bench(
    profile: ServeBenchProfile, targets: list[str], out_dir: Path, model_cache: Path, repeat: int = 1
) -> dict[str, Any]:
    from workload.serve.scorecard import build_scorecard, plot_scorecard, render_table

    orders = round_orders(targets, repeat)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = materialise_model(profile.model, model_cache)
    runs = []
    for number, order in enumerate(orders, start=1):
        for target in order:
            round_number = number if repeat > 1 else None
            name = target if round_number is None else f"{target} (round {number}/{repeat})"
            print(f"[bench-serve] {_stamp()} {name}: starting", flush=True)
            runs.append(run_target(profile, target, model_path, out_dir, round_number))
            print(f"[bench-serve] {_stamp()} {name}: done ({runs[-1]['error'] or 'ok'})", flush=True)
            # Rewritten after every server: a run cut short (a timeout, a lost lock) still leaves what it measured.
            scorecard = build_scorecard(profile, runs, targets)
            (out_dir / "scorecard.json").write_text(json.dumps(scorecard, indent=2))
            (out_dir / "scorecard.md").write_text(render_table(scorecard))
    plot_scorecard(scorecard, out_dir / "serve_vs_vllm.png")
    return scorecard
