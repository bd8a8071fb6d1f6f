"""One error boundary for every command (`python -m workload ...`, `python -m infra.<tool>`).

An operator who mistypes a path or runs without AWS credentials gets one line naming the problem and the fix and a
documented exit code, never a 40-line traceback; `--debug` (anywhere on the command line) or LLM_BATCH_DEBUG=1
adds the traceback.

Exit codes (docs/cli.md):
    0   done
    1   the thing checked or run failed (a short quota, a failed run, a policy violation), or an unexpected error
    2   bad input: usage, a missing or malformed file, an invalid config, an unknown stack, a missing price
    69  AWS or the network: no credentials, an unreachable endpoint, an AWS API error (sysexits' EX_UNAVAILABLE;
        a number no command uses for anything else)

Imports nothing but the standard library at module level (the deploy-time tools import it; botocore and PyYAML are
looked up only when an error needs classifying), so it belongs to neither the job nor the infrastructure.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_AWS = 69
DEBUG_FLAG = "--debug"
PROJECT_PACKAGES = frozenset({"infra", "workload", "monitoring"})

HELP_EPILOG = (
    "exit codes: 0 done; 1 failed (the check or the run); 2 bad input (usage, file, config, stack, price); "
    "69 AWS or network (credentials, endpoint, API error); `workload run` also 3, 4, 5 (docs/cli.md). "
    "Add --debug for a traceback."
)


class CommandError(Exception):
    """An error a command raises for the boundary to print: the problem, the fix and the exit code."""

    def __init__(self, problem: str, fix: str = "", exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.exit_code = exit_code

    def line(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _aws(error: BaseException) -> CommandError | None:
    try:
        from botocore import exceptions as boto
    except ImportError:  # a tool without boto3 installed has no AWS errors to classify
        return None
    if isinstance(error, boto.NoCredentialsError | boto.PartialCredentialsError):
        return CommandError(
            "no AWS credentials found",
            "set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or run `aws sso login`",
            EXIT_AWS,
        )
    if isinstance(error, boto.NoRegionError):
        return CommandError("no AWS region set", "set AWS_REGION or the stack's llm-batch:region", EXIT_AWS)
    if isinstance(error, boto.EndpointConnectionError | boto.ConnectTimeoutError | boto.ReadTimeoutError):
        return CommandError(
            f"cannot reach AWS: {_one_line(str(error))}",
            "check the network, the region and AWS_ENDPOINT_URL if set",
            EXIT_AWS,
        )
    if isinstance(error, boto.ClientError):
        details = error.response.get("Error", {})
        code = details.get("Code", "Error")
        fix = {
            "ExpiredToken": "your session expired: log in again (`aws sso login`)",
            "ExpiredTokenException": "your session expired: log in again (`aws sso login`)",
            "AccessDenied": "give the identity this permission, or use one that has it",
            "AccessDeniedException": "give the identity this permission, or use one that has it",
            "UnrecognizedClientException": "the credentials are not valid in this account or region",
            "InvalidClientTokenId": "the credentials are not valid in this account or region",
        }.get(code, "check the identity's permissions and the stack's outputs")
        operation = getattr(error, "operation_name", "a request")
        return CommandError(f"AWS refused {operation}: {code}: {_one_line(details.get('Message', ''))}", fix, EXIT_AWS)
    if isinstance(error, boto.BotoCoreError):
        return CommandError(f"AWS client error: {_one_line(str(error))}", "rerun with --debug for details", EXIT_AWS)
    return None


def describe(error: BaseException) -> CommandError:
    """The line and exit code for an error that reached the boundary."""
    if isinstance(error, CommandError):
        return error
    found = _aws(error)
    if found is not None:
        return found
    if isinstance(error, FileNotFoundError):
        return CommandError(f"no such file: {error.filename or error}", "check the path")
    if isinstance(error, IsADirectoryError):
        return CommandError(f"expected a file, found a folder: {error.filename or error}", "name a file")
    if isinstance(error, PermissionError):
        return CommandError(f"not allowed to read or write {error.filename or error}", "check its permissions")
    if isinstance(error, json.JSONDecodeError):
        return CommandError(f"malformed JSON: {error}", "fix the file")
    try:
        import yaml
    except ImportError:
        yaml = None  # type: ignore[assignment]
    if yaml is not None and isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or _one_line(str(error))
        return CommandError(f"malformed YAML{where}: {problem}", "fix the file")
    if type(error).__module__.split(".")[0] in PROJECT_PACKAGES:
        # The project's own errors (PlanError, OutputsError, ConfigError, ...) are written to be read: their
        # message names the problem and the fix. Most are bad input; a failure of the run itself says so with its
        # own `exit_code` (EngineCrashLoopError).
        return CommandError(_one_line(str(error)), exit_code=getattr(error, "exit_code", EXIT_BAD_INPUT))
    if isinstance(error, ConnectionError | TimeoutError):
        return CommandError(f"network error: {_one_line(str(error))}", "check the network and the endpoint", EXIT_AWS)
    return CommandError(
        f"unexpected error: {type(error).__name__}: {_one_line(str(error))}",
        "rerun with --debug for the traceback and report it",
        EXIT_FAILED,
    )


def run_command(prog: str, main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run `main(argv)` behind the boundary: any error becomes one line on stderr and its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    # LLM_BATCH_DEBUG=1 does the same where the command line is fixed (a container's CMD, a RayJob's entrypoint).
    debug = DEBUG_FLAG in args or os.environ.get("LLM_BATCH_DEBUG") == "1"
    args = [arg for arg in args if arg != DEBUG_FLAG]
    try:
        return int(main(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BrokenPipeError:
        # The reader went away (`... | head`): nothing to report. Point stdout at devnull so the interpreter's
        # own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # argparse's usage errors (2) and --help (0) already said what they had to say
    except Exception as error:
        if debug:
            traceback.print_exc()
        print(f"{prog}: {describe(error).line()}", file=sys.stderr)
        return describe(error).exit_code
