"""The environment a worker runs in: every cache and temp folder inside one scratch folder the run owns.

vLLM leaves IPC socket files in $TMPDIR after each engine start and Ray keeps sessions in its temp dir;
pointing all of them at the run's scratch folder keeps a run from filling /tmp or reading another run's
caches. The scratch folder lives under the system temp dir because Ray's socket paths must stay under 107
characters.
"""

from __future__ import annotations

import os
from pathlib import Path

from workload.contract.config import EngineConfig


def worker_env(scratch: Path, engine: EngineConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for name, sub in (
        ("TMPDIR", "tmp"),
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("HF_HOME", "hf"),
        ("TRITON_CACHE_DIR", "triton"),
    ):
        path = scratch / sub
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kvcache_space_gib)
    # The benchmark's own progress lines are the ones to read; vLLM's per-step INFO lines would bury them.
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
