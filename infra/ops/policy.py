"""`python -m infra.policy`: every policy rule for a stack's tier over its plan, one line each.

    python -m infra.policy small              # the stack's offline plan; exit 1 on a violation
    python -m infra.policy --plan plan.json   # a plan saved by `python -m infra.plan STACK --json`

The rules themselves live in infra/rules/ (`infra.rules.registry.RULES`), which the policy pack runs too; the
last line names the rules whose offline verdict rests on mock ids and ARNs (`preview_line`).
"""

from __future__ import annotations

import argparse
import json
import sys

from infra.rules.registry import preview_line, report


def main(argv: list[str] | None = None) -> int:
    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.policy",
        description="Policy checks over a plan.",
        epilog="examples: python -m infra.policy small; python -m infra.policy --plan out/plan-large.json. "
        f"Exit 1: a check failed. {HELP_EPILOG}",
    )
    parser.add_argument("stack", nargs="?", help="stack name: stacks/Pulumi.<stack>.yaml holds its config")
    parser.add_argument("--plan", metavar="FILE", help="a plan saved by `python -m infra.plan STACK --json`")
    args = parser.parse_args(argv)
    if bool(args.stack) == bool(args.plan):
        parser.error("give a stack name or --plan FILE (one of them)")
    if args.plan:
        try:
            with open(args.plan, encoding="utf-8") as handle:
                plan = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            print(f"error: cannot read plan {args.plan}: {error}", file=sys.stderr)
            return 2
        if not isinstance(plan, list):
            print(f"error: {args.plan} is not a plan (a JSON list of resources)", file=sys.stderr)
            return 2
    else:
        from infra.ops.plan_capture import capture_plan

        plan = capture_plan(args.stack)
    lines, clean = report(plan)
    print("\n".join(lines))
    line = preview_line(plan)
    if line:
        print(line)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
