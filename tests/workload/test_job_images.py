"""Images through the real job (issue 57): real Ray Data LLM and real vLLM on the tiny vision-language model
(workload/engine/tiny_vlm.py, an Idefics3 with random weights), one engine start for all of it.

That the image reached the model is checked by counts, not by the (random) text: the image row's prompt tokens are
the text row's plus the image tokens engine-plan predicts for the model's config, once per image. A row with an
image from the configured prefix (a local folder here) counts the same. Every bad image is its row's error, named:
too many, too large (both found by the validation stage), and an undecodable one (found by the image stage on the
workers); nothing is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import run_job, write_config, write_jsonl
from tests.workload.test_images import data_url, png
from workload.contract.engine_sizing import read_model_config
from workload.contract.vision_shape import vision_plan
from workload.engine.tiny_vlm import IMAGE_SIZE, ensure_tiny_vlm

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Describe it."}]


def test_an_image_reaches_the_model_counted_in_its_prompt_tokens(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    model = ensure_tiny_vlm(cache)
    images = tmp_path / "images"
    images.mkdir()
    (images / "cat.png").write_bytes(png(48, 24))
    inputs = tmp_path / "in"
    inputs.mkdir()
    picture = data_url(png(20, 30))
    write_jsonl(
        inputs / "rows.jsonl",
        [
            {"id": "text", "messages": QUESTION},
            {"id": "one", "messages": QUESTION, "images": [picture]},
            {"id": "two", "messages": QUESTION, "images": [picture, str(images / "cat.png")]},
            {"id": "many", "messages": QUESTION, "images": [picture] * 3},
            {"id": "big", "messages": QUESTION, "images": [data_url(png(8, 8) + b"\0" * 5000)]},
            {"id": "broken", "messages": QUESTION, "images": [data_url(b"\x89PNG not really")]},
            {"id": "elsewhere", "messages": QUESTION, "images": ["https://example.com/cat.png"]},
        ],
    )
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "job.yaml",
        str(inputs),
        str(out),
        cache,
        input={"uri": str(inputs), "image_prefix": str(images), "max_images_per_row": 2, "max_image_bytes": 4096},
        model={"source": str(model), "cache_dir": str(cache)},
        sampling={"max_tokens": 2, "temperature": 0.0},
    )

    code, log = run_job(["run", "--config", str(config)])
    assert code == 0, log

    results = pq.read_table(out / "results").to_pylist()
    prompt = {row["id"]: row["num_input_tokens"] for row in results}
    errors = {
        e["id"]: e
        for f in sorted((out / "errors").glob("*.jsonl"))
        for e in map(json.loads, f.read_text().splitlines())
    }
    assert set(prompt) == {"text", "one", "two"}, (prompt, errors)
    per_image = vision_plan(read_model_config(model), 1, IMAGE_SIZE).tokens_per_image
    assert prompt["one"] == prompt["text"] + per_image
    assert prompt["two"] == prompt["text"] + 2 * per_image
    assert {k: e["error_type"] for k, e in errors.items()} == {
        "many": "too_many_images",
        "big": "image_too_large",
        "broken": "invalid_image",
        "elsewhere": "invalid_image",
    }
    assert "max_images_per_row=2" in errors["many"]["error_message"]
    assert "not a readable image" in errors["broken"]["error_message"]
