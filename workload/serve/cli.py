"""`python -m workload serve [--config FILE] [--port N] [--host ADDR]`: the OpenAI-compatible endpoint;
`python -m workload bench-serve --out DIR [--repeat N]`: the endpoint against `vllm serve`, measured by
`vllm bench serve`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from workload.contract.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON config: a job config file works as is (its model and engine)")
    parser.add_argument("--port", type=int, help="serve.port (default 8000)")
    parser.add_argument("--host", help="serve.host (default 127.0.0.1)")
    parser.add_argument("--model", help="model.source: local path, s3:// prefix or hub id")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="device")


def run(args: argparse.Namespace, exit_bad_config: int) -> int:
    from workload.auth.keys import KeyConfigError
    from workload.contract.serve_config import load_serve_config
    from workload.engine.model_source import ModelSourceError
    from workload.serve.endpoint import PortBusyError, serve_until_stopped

    overrides = {"serve.port": args.port, "serve.host": args.host, "model.source": args.model, "device": args.device}
    try:
        config = load_serve_config(args.config, overrides)
        return serve_until_stopped(config)
    except (ConfigError, ModelSourceError, KeyConfigError, PortBusyError) as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return exit_bad_config


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from workload.contract.config import ModelConfig
    from workload.serve.bench_profiles import SERVE_PROFILES, TARGETS

    parser.add_argument("--out", required=True, type=Path, help="Folder for scorecard.json/.md, the plot, raw results")
    parser.add_argument("--profile", default="cpu", choices=sorted(SERVE_PROFILES), help="default: cpu")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"Comma-separated, measured in this order (default: {','.join(TARGETS)})",
    )
    parser.add_argument("--rates", help="Comma-separated request rates in req/s, 'inf' for saturation")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="Rounds: every target once per round, interleaved (the order rotates each round); "
        "the scorecard keeps every round and judges the medians (default: 1)",
    )
    parser.add_argument("--model-cache", type=Path, default=Path(ModelConfig().cache_dir).expanduser())


def run_bench(args: argparse.Namespace) -> int:
    from workload.serve.bench import run_serve_bench
    from workload.serve.bench_profiles import SERVE_PROFILES, TARGETS

    profile = SERVE_PROFILES[args.profile]
    targets = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        print(f"llm-batch: --targets: unknown {unknown}; choose from {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"llm-batch: --repeat must be at least 1, got {args.repeat}", file=sys.stderr)
        return 2
    if args.rates:
        try:
            rates = sorted(float(rate) for rate in args.rates.split(","))
        except ValueError:
            print(f"llm-batch: --rates must be numbers or 'inf', got {args.rates!r}", file=sys.stderr)
            return 2
        if any(rate <= 0 or math.isnan(rate) for rate in rates):
            print("llm-batch: --rates must be positive", file=sys.stderr)
            return 2
        profile = profile.model_copy(update={"rates": rates})
    scorecard = run_serve_bench(profile, targets, args.out, args.model_cache, args.repeat)
    print((args.out / "scorecard.md").read_text())
    return 1 if scorecard["errors"] else 0
