"""`python -m workload run|validate|bench`: flags override the config file, and both map onto one JobConfig."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from workload.config import ConfigError, JobConfig, load_config
from workload.entrypoint import ENTRYPOINT

__all__ = ["ENTRYPOINT", "main"]

EXIT_BAD_CONFIG = 2
EXIT_OUTPUT_MISMATCH = 3
EXIT_LEASE_HELD = 4  # another live attempt holds the output: this one changed nothing (retry later, or wait)
EXIT_LEASE_LOST = 5  # this attempt lost the output's lease mid-run and stopped writing; another one owns it now


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON job config file")
    parser.add_argument("--input", help="input.uri: local path or s3:// URI")
    parser.add_argument("--output", help="output.uri: local folder or s3:// URI")
    parser.add_argument("--model", help="model.source: local path, s3:// prefix or hub id")
    parser.add_argument("--input-format", choices=["auto", "jsonl", "parquet"], help="input.format")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="device")
    parser.add_argument("--restart", action="store_true", help="delete earlier output instead of resuming")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "input.uri": args.input,
        "output.uri": args.output,
        "model.source": args.model,
        "input.format": args.input_format,
        "device": args.device,
        "resume.mode": "restart" if args.restart else None,
    }


def _load(args: argparse.Namespace) -> JobConfig:
    return load_config(args.config, _overrides(args))


def _validate(config: JobConfig) -> int:
    from workload.rows import read_input

    validated = read_input(config.input, config.sampling)
    kinds = Counter(e.error_type for e in validated.errors)
    report = {
        "config": "ok",
        "config_hash": config.output_hash(),
        "rows_in": validated.rows_in,
        "rows_valid": len(validated.rows),
        "rows_invalid": len(validated.errors),
        "invalid_by_type": dict(sorted(kinds.items())),
        "first_invalid": [e.as_record() for e in validated.errors[:5]],
    }
    print(json.dumps(report, indent=2))
    return 0


def _run(config: JobConfig) -> int:
    # run_job leaves `_failed.json` beside the output for every failure it raises (while it holds the output's
    # lease), so a scheduler waiting for summary.json learns why at once; a refused or lost lease leaves none.
    from workload.job import OutputMismatchError, run_job
    from workload.lease import LeaseHeldError, LeaseLostError
    from workload.model_source import ModelSourceError
    from workload.rows import InputError
    from workload.storage import StorageError

    try:
        outcome = run_job(config)
    except LeaseHeldError as error:
        print(f"llm-batch: refused: {error}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except LeaseLostError as error:
        print(f"llm-batch: stopped: {error}; nothing was written after the loss", file=sys.stderr)
        return EXIT_LEASE_LOST
    except OutputMismatchError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_OUTPUT_MISMATCH
    except (InputError, ModelSourceError, StorageError):
        raise
    except Exception as error:
        print(f"llm-batch: the run failed: {type(error).__name__}: {error}", file=sys.stderr)
        raise
    return outcome.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_config_flags(commands.add_parser("run", help="run (or resume) the batch job"))
    _add_config_flags(commands.add_parser("validate", help="check the config and the input; start no engine"))
    from workload.bench import cli as bench_cli

    bench_cli.add_arguments(commands.add_parser("bench", help="benchmark: synchronous vs continuous vs the job"))
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench_cli.run(args)

    from workload.model_source import ModelSourceError
    from workload.rows import InputError
    from workload.storage import StorageError

    try:
        config = _load(args)
        return _validate(config) if args.command == "validate" else _run(config)
    except (ConfigError, InputError, ModelSourceError, StorageError) as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
