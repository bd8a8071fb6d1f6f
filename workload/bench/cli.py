"""`python -m workload bench`: the benchmark's command line (also `python -m workload.bench`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from workload.bench.profiles import PROFILES, BenchProfile, get_profile
from workload.contract.config import ModelConfig


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
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override any profile field by dotted key, e.g. engine.max_num_seqs=64, job.batch_size=64, "
        "workload.long_fraction=0.5 (value parsed as YAML); repeatable. Every mode gets the same engine args.",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="Full runs, round k into OUT/round-k/ (each a complete scorecard, table, plots, raw); OUT/scorecard.json "
        "and .md then hold every round's ratios and judge the targets on their medians (default: 1, a single run "
        "straight into OUT).",
    )
    parser.add_argument(
        "--groups",
        help="Run only these worker groups, comma-separated, of: engine (continuous and synchronous), "
        "engine_job_layout (the like-for-like bare engine, bimodal point), job (default: all three).",
    )
    parser.add_argument(
        "--run-batch",
        metavar="LINES",
        help="Instead of the engine modes: the job against `vllm run-batch` on one OpenAI chat batch file of each "
        "line count, comma-separated (e.g. 200,10000), same model and engine settings; writes OUT/run_batch.json "
        "and .md (workload/bench/run_batch.py).",
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
    data = {**profile.model_dump(), **update}
    for setting in args.settings:
        key, sep, raw = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {setting!r}")
        _set_dotted(data, key, yaml.safe_load(raw), setting)
    if data == profile.model_dump():
        return profile
    # Re-validate: an override must pass the same checks (e.g. fitting max_model_len) as a built-in profile.
    return BenchProfile.model_validate(data)


def _set_dotted(data: dict[str, Any], key: str, value: Any, setting: str) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise SystemExit(f"--set {setting!r}: {part!r} is not a section of the profile")
        node = node[part]
    if parts[-1] not in node:
        raise SystemExit(f"--set {setting!r}: the profile has no field {key!r}")
    node[parts[-1]] = value


def line_counts(value: str) -> list[int]:
    """--run-batch's line counts: positive integers, comma-separated."""
    try:
        counts = [int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        raise SystemExit(f"--run-batch takes comma-separated line counts, got {value!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"--run-batch takes line counts of at least 1, got {value!r}")
    return counts


def groups(value: str | None) -> tuple[str, ...]:
    """--groups: a comma-separated subset of the runner's worker groups, in the runner's order."""
    from workload.bench.runner import GROUPS

    if value is None:
        return GROUPS
    chosen = {item.strip() for item in value.split(",") if item.strip()}
    unknown = sorted(chosen - set(GROUPS))
    if unknown or not chosen:
        raise SystemExit(f"--groups takes a comma-separated subset of {', '.join(GROUPS)}; got {value!r}")
    return tuple(group for group in GROUPS if group in chosen)


def run(args: argparse.Namespace) -> int:
    from workload.bench.runner import run_bench

    if args.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1 (the number of full runs), got {args.repeat}")
    profile = profile_from_args(args)
    if profile.scale_rows and args.repeat > 1:
        raise SystemExit(
            f"--repeat is for the engine-comparison profiles; {profile.name!r} is a scale run (scale_rows set)"
        )
    if args.groups is not None and (args.repeat > 1 or profile.scale_rows or args.run_batch is not None):
        raise SystemExit("--groups is for a single engine-comparison run (not with --repeat, --run-batch or scale)")
    if args.run_batch is not None:
        from workload.bench.run_batch import markdown, run_comparison

        if args.repeat > 1 or profile.scale_rows:
            raise SystemExit("--run-batch runs once, on an engine-comparison profile (no --repeat, no scale profile)")
        results = run_comparison(profile, line_counts(args.run_batch), args.out, args.model_cache)
        print(markdown(results))
        failed = [r for r in results for tool in ("run_batch", "job") if r[tool]["returncode"] != 0]
        return 1 if failed else 0
    if args.repeat > 1:
        from workload.bench.rounds import ratio_lines, run_rounds

        combined = run_rounds(profile, args.out, args.model_cache, args.repeat)
        print("\n".join(ratio_lines(combined)))
        print(f"scorecard: {args.out / 'scorecard.json'}\ntable: {args.out / 'scorecard.md'}")
        return 1 if combined["errors"] else 0
    if profile.scale_rows:
        from workload.bench.scale import run_scale

        scorecard = run_scale(profile, args.out, args.model_cache)
        print(f"scorecard: {args.out / 'scorecard.json'}")
        return 1 if scorecard["errors"] else 0
    outputs = run_bench(profile, args.out, args.model_cache, groups(args.groups))
    print(f"scorecard: {outputs.scorecard_json}\ntable: {outputs.table_md}")
    print("plots: " + ", ".join(str(path) for path in outputs.plots))
    return 1 if outputs.scorecard["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
