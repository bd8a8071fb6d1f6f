"""`python -m workload serve [--config FILE] [--port N] [--host ADDR]`: the OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import sys

from workload.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON config: a job config file works as is (its model and engine)")
    parser.add_argument("--port", type=int, help="serve.port (default 8000)")
    parser.add_argument("--host", help="serve.host (default 127.0.0.1)")
    parser.add_argument("--model", help="model.source: local path, s3:// prefix or hub id")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="device")


def run(args: argparse.Namespace, exit_bad_config: int) -> int:
    from workload.model_source import ModelSourceError
    from workload.serve.config import load_serve_config

    overrides = {"serve.port": args.port, "serve.host": args.host, "model.source": args.model, "device": args.device}
    try:
        config = load_serve_config(args.config, overrides)
        from workload.serve.endpoint import serve_until_stopped

        return serve_until_stopped(config)
    except (ConfigError, ModelSourceError) as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return exit_bad_config
