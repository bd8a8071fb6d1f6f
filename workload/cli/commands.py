"""`python -m workload run|validate|show|bench|serve|bench-serve|batch-api|engine-plan|engine-calibration`: flags
override the config file, one config model."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from workload.contract.config import ConfigError, JobConfig, build_config, load_config
from workload.contract.entrypoint import ENTRYPOINT

__all__ = ["ENTRYPOINT", "main"]

EXIT_BAD_CONFIG = 2
EXIT_OUTPUT_MISMATCH = 3
EXIT_LEASE_HELD = 4  # another live attempt holds the output: this one changed nothing (retry later, or wait)
EXIT_LEASE_LOST = 5  # this attempt lost the output's lease mid-run and stopped writing; another one owns it now


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON job config file")
    parser.add_argument("--input", help="input.uri: local path or s3:// URI")
    parser.add_argument("--output", help="output.uri: local folder or s3:// URI")
    parser.add_argument("--model", help="model.source: local path, s3:// prefix or hub id")
    parser.add_argument("--input-format", choices=["auto", "jsonl", "parquet"], help="input.format")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="device")
    parser.add_argument("--task", choices=["generate", "embed"], help="task: answer prompts, or embed texts")
    parser.add_argument("--restart", action="store_true", help="delete earlier output instead of resuming")
    parser.add_argument(
        "--no-image-prefix",
        action="store_true",
        help="leave input.image_prefix unset: a Batch API batch's run on a tier, whose images are its own, never "
        "the nightly's prefix",
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "input.uri": args.input,
        "output.uri": args.output,
        "model.source": args.model,
        "input.format": args.input_format,
        "device": args.device,
        "task": args.task,
        "resume.mode": "restart" if args.restart else None,
    }


# `validate` writes nothing, so it needs no output; the report says so instead of showing a made-up one.
NO_OUTPUT = "(none: validate writes nothing)"

EXAMPLES = """examples:
  python -m workload validate --input data/sample.jsonl
  python -m workload run --config examples/demo.yaml
  python -m workload run --config job.yaml --input s3://bucket/input/2026-11-29/ --output s3://bucket/output/2026-11-29/
  python -m workload show s3://bucket/output/2026-11-29/

exit codes: 0 done; 1 the run failed; 2 bad config or input (or no output to show); 3 the output holds another
config's results (--restart replaces them); 69 AWS or network (credentials, endpoint, API error); 143 stopped by
SIGTERM (rerun to resume). Add --debug for a traceback."""


def load_job_config(args: argparse.Namespace) -> JobConfig:
    """The job's config from `args` (add_config_flags' flags): the file, with the flags put over it."""
    if args.command == "validate":
        config = load_config(args.config, _overrides(args), defaults={"output.uri": NO_OUTPUT})
    else:
        config = load_config(args.config, _overrides(args))
    if args.no_image_prefix and config.input.image_prefix is not None:
        # A batch run on a tier starts from the nightly's settings; the stack's image prefix is no tenant's.
        data = config.model_dump(mode="json")
        data["input"]["image_prefix"] = None
        config = build_config(data)
    return config


def _validate(config: JobConfig) -> int:
    from workload.files.rows import InputError
    from workload.job.pool import is_pool, member_config, read_spec

    if not is_pool(config.input.uri):
        print(json.dumps(_report(config), indent=2))
        return 0
    # A pool: its spec, then each member's input as a lone job's (a member's bad input is its own, as in a run).
    spec = read_spec(config.input.uri, config.output.uri)
    members: dict[str, Any] = {}
    for member in spec.members:
        try:
            members[member.name] = _report(member_config(config, member))
        except InputError as error:
            members[member.name] = {"error": str(error)}
    print(json.dumps({"pool": spec.pool, "members": members}, indent=2))
    return 0


def _report(config: JobConfig) -> dict[str, Any]:
    from workload.files.rows import read_input
    from workload.job.input_plan import plan_input

    model = config.model
    plan = plan_input(config.input, None, model.names(), config.task, model.tools, model.adapter_names())
    validated = read_input(config.input, config.sampling, plan.openai, plan.task, plan.tool_parser)
    kinds = Counter(e.error_type for e in validated.errors)
    return {
        "config": "ok",
        "config_hash": config.model_copy(update={"task": plan.task}).output_hash(),
        "rows_in": validated.rows_in,
        "rows_valid": len(validated.rows),
        "rows_invalid": len(validated.errors),
        "invalid_by_type": dict(sorted(kinds.items())),
        "first_invalid": [e.as_record() for e in validated.errors[:5]],
    }


def _run(config: JobConfig, verbose: bool = False) -> int:
    # run_job leaves `_failed.json` beside the output for every failure it raises (while it holds the output's
    # lease), a refused output (exit 3) included, so a scheduler waiting for summary.json learns why at once; a
    # refused or lost lease leaves none.
    from workload.engine.adapters import check_adapters
    from workload.engine.model_source import ModelSourceError, check_model_source
    from workload.files.rows import InputError
    from workload.files.storage import StorageError
    from workload.job.attempt import OutputMismatchError, run_job
    from workload.job.lease import LeaseHeldError, LeaseLostError
    from workload.job.pool import is_pool, run_pool

    # The nodes fetch the model themselves, once their engines start: a source that cannot be a model is refused
    # here, before the lease, Ray or any engine (one LIST for an s3:// prefix, nothing downloaded).
    check_model_source(config.model)
    check_adapters(config.model)
    from workload.telemetry.terminal import run_display

    try:
        with run_display(verbose):
            # A `.pool.json` input: several batches on one engine (workload/job/pool.py).
            outcome = run_pool(config) if is_pool(config.input.uri) else run_job(config)
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
    parser = argparse.ArgumentParser(
        prog="python -m workload",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run (or resume) the batch job", epilog=EXAMPLES)
    add_config_flags(run)
    run.add_argument(
        "--verbose",
        action="store_true",
        help="at a terminal, show Ray's and vLLM's own log lines here instead of in the run's log file",
    )
    add_config_flags(
        commands.add_parser("validate", help="check the config and the input; start no engine", epilog=EXAMPLES)
    )
    show = commands.add_parser("show", help="a run's summary, errors by type and first results", epilog=EXAMPLES)
    show.add_argument("output", help="the run's output: local folder or s3:// URI")
    show.add_argument("--limit", type=int, default=5, help="how many results to print")
    from workload.bench import cli as bench_cli

    bench_cli.add_arguments(commands.add_parser("bench", help="benchmark: synchronous vs continuous vs the job"))
    from workload.serve import cli as serve_cli

    serve_cli.add_arguments(commands.add_parser("serve", help="OpenAI-compatible endpoint (Ray Serve LLM)"))
    serve_cli.add_bench_arguments(commands.add_parser("bench-serve", help="benchmark: Ray Serve LLM vs vllm serve"))
    from workload.batch_api import cli as batch_api_cli
    from workload.cli import engine_calibration, engine_plan

    batch_api_cli.add_arguments(
        commands.add_parser("batch-api", help="OpenAI's Files and Batches API on this machine (docs/batch-api.md)")
    )
    engine_plan.add_arguments(
        commands.add_parser("engine-plan", help="vLLM's settings for a model on a GPU, from its config.json alone")
    )
    engine_calibration.add_arguments(
        commands.add_parser("engine-calibration", help="vLLM's KV-cache sizes from run logs beside the plan's")
    )
    args = parser.parse_args(argv)
    if args.command == "engine-calibration":
        return engine_calibration.run(args)
    if args.command == "batch-api":
        return batch_api_cli.run(args, EXIT_BAD_CONFIG)
    if args.command == "engine-plan":
        return engine_plan.run(args)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "serve":
        return serve_cli.run(args, EXIT_BAD_CONFIG)
    if args.command == "bench-serve":
        return serve_cli.run_bench(args)

    from workload.contract.cli_errors import EXIT_AWS, describe
    from workload.engine.model_source import ModelSourceError
    from workload.files.rows import InputError
    from workload.files.storage import StorageError

    try:
        if args.command == "show":
            from workload.cli.show import render

            print(render(args.output, args.limit))
            return 0
        config = load_job_config(args)
        return _validate(config) if args.command == "validate" else _run(config, args.verbose)
    except (ConfigError, InputError, ModelSourceError, StorageError) as error:
        cause = describe(error.__cause__) if error.__cause__ is not None else None
        if cause is not None and cause.exit_code == EXIT_AWS:  # S3 without credentials or reach: say how to fix it
            print(f"llm-batch: {error}; {cause.fix}", file=sys.stderr)
            return EXIT_AWS
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
