"""`python -m workload bench`: the benchmark's command line (also `python -m workload.bench`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workload.bench.profiles import PROFILES, BenchProfile, get_profile
from workload.config import ModelConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="Folder for scorecard.json, scorecard.md, plots.")
    parser.add_argument(
        "--profile",
        default="cpu",
        choices=sorted(PROFILES),
        help="Model, engine args and workload (default: cpu).",
    )
    parser.add_argument("--requests", type=int, help="Override the number of requests per point.")
    parser.add_argument("--seed", type=int, help="Override the workload seed.")
    parser.add_argument(
        "--sweep",
        help="Override the sweep's long-decode lengths, comma-separated (empty: the bimodal point only).",
    )
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(ModelConfig().cache_dir),
        help="Where models are built/cached.",
    )


def profile_from_args(args: argparse.Namespace) -> BenchProfile:
    profile = get_profile(args.profile)
    workload_update: dict[str, int] = {}
    if args.requests is not None:
        workload_update["num_requests"] = args.requests
    if args.seed is not None:
        workload_update["seed"] = args.seed
    update: dict[str, object] = {}
    if workload_update:
        update["workload"] = profile.workload.model_copy(update=workload_update).model_dump()
    if args.sweep is not None:
        try:
            update["sweep_long_tokens"] = [int(item) for item in args.sweep.split(",") if item.strip()]
        except ValueError:
            raise SystemExit(f"--sweep must be comma-separated token counts, got {args.sweep!r}") from None
    if not update:
        return profile
    # Re-validate: an override must pass the same checks (e.g. fitting max_model_len) as a built-in profile.
    return BenchProfile.model_validate({**profile.model_dump(), **update})


def run(args: argparse.Namespace) -> int:
    from workload.bench.runner import run_bench

    outputs = run_bench(profile_from_args(args), args.out, args.model_cache)
    print(f"scorecard: {outputs.scorecard_json}\ntable: {outputs.table_md}")
    print("plots: " + ", ".join(str(path) for path in outputs.plots))
    return 1 if outputs.scorecard["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
