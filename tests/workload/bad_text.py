"""One input file holding every bad-text, chat and BOM case, with the outcome each row must have; and a copy of the
tiny model whose chat template is as strict as real models' (Llama-2/Mistral style), so template failures are real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from workload.engine.tiny_model import ensure_tiny_model

BOM = b"\xef\xbb\xbf"

# Writes the BOS itself, forbids a system role, wants user/assistant turns in turn.
STRICT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# (row, outcome): "ok", or the error type. json.dumps writes a lone surrogate as an ASCII escape: valid JSON.
MIXED_ROWS: list[tuple[dict, str]] = [
    ({"id": "bom-first", "prompt": "the file starts with a byte order mark"}, "ok"),
    ({"id": "sur-prompt", "prompt": "bad \ud800 text"}, "invalid_text"),
    ({"id": "sur-message", "messages": [{"role": "user", "content": "x\udc00"}]}, "invalid_text"),
    ({"id": "sur-id-\ud83d", "prompt": "fine"}, "invalid_text"),
    ({"id": "sur-column", "prompt": "fine", "note": {"deep": "\udfff"}}, "invalid_text"),
    ({"id": "emoji", "prompt": "a surrogate pair \ud83d\ude00 is one character"}, "ok"),
    ({"id": "chat-ok", "messages": [{"role": "user", "content": "hi"}]}, "ok"),
    (
        {
            "id": "chat-turns",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
        },
        "ok",
    ),
    (
        {"id": "chat-repeat", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        "chat_template_error",
    ),
    (
        {"id": "chat-system", "messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "hi"}]},
        "chat_template_error",
    ),
]


def mixed_file_bytes() -> bytes:
    return BOM + b"".join(json.dumps(row).encode() + b"\n" for row, _ in MIXED_ROWS)


def expected_outcomes() -> dict[str | None, str]:
    """Row id (None where the id itself is not valid text) -> outcome."""
    return {(None if "\ud83d" in row["id"] else row["id"]): outcome for row, outcome in MIXED_ROWS}


def strict_chat_model(cache_dir: Path, target: Path) -> Path:
    """The tiny model, copied, with STRICT_TEMPLATE as its chat template."""
    shutil.copytree(ensure_tiny_model(cache_dir), target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = STRICT_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target
