"""Images through the real job (issue 57): real Ray Data LLM and real vLLM on the tiny vision-language model
(workload/engine/tiny_vlm.py, an Idefics3 with random weights), one engine start for all of it.

The input is an OpenAI Batch file, the Batch API's format, with `image_url` parts (native rows' `images` column
meets the same path after validation: tests/workload/test_images.py). That the image reached the model is checked
by counts, not by the (random) text: the image line's `usage.prompt_tokens` is the text line's plus the image tokens
engine-plan predicts from the model's config, once per image; an image read from the configured prefix (a local
folder here) counts the same, and so does a Responses line's image named by `file_id`, read through
`input.image_files` (the mapping the Batch API hands a batch's job: tests/workload/test_batch_api_vision.py); an id
outside the mapping is its line's `invalid_image`. Every chat body parses as the official SDK's ChatCompletion,
every responses body as its Response. Every bad image is its
line's error (status 400, the error type as its code), nothing lost: too many and another host (found by the
validation stage), an undecodable PNG (found by the image stage on the workers).

The same engine start serves LoRA adapters (issue 57's part 2, "one engine start for both parts"): the tiny VLM is
the base of a tiny random adapter on its language model (workload/engine/tiny_adapter.py), and lines naming it run
on it beside base lines: an adapter line answers the same prompt differently (and a base line batched beside it
keeps its own answer: the CPU's spare LoRA slot, vllm#48421, workload/contract/adapter_config.py), every body
reports the name it ran on in `model`, an adapter's image line counts the image as the base's does, and an unknown
name is `model_not_found` listing the served names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseInputImageParam

from tests.workload.jobrun import run_job, write_config, write_jsonl
from tests.workload.test_images import data_url, png
from workload.contract.engine_sizing import read_model_config
from workload.contract.vision_shape import vision_plan
from workload.engine.tiny_adapter import ensure_tiny_adapter
from workload.engine.tiny_vlm import IMAGE_SIZE, TINY_VLM_VERSION, ensure_tiny_vlm

pytestmark = pytest.mark.slow


ADAPTER = "tiny-lora"


def _line(custom_id: str, *urls: str, model: str = "llm-batch", max_tokens: int = 2) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content = [{"type": "text", "text": "Describe it."}, *parts] if urls else "Describe it."
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _responses_line(custom_id: str, file_id: str) -> dict[str, Any]:
    part: ResponseInputImageParam = {"type": "input_image", "file_id": file_id, "detail": "auto"}
    item = {"role": "user", "content": [{"type": "input_text", "text": "Describe it."}, part]}
    body = {"model": "llm-batch", "input": [item], "max_output_tokens": 2}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


UPLOADED, NOT_MAPPED = "file-" + "1" * 24, "file-" + "2" * 24


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_an_image_reaches_the_model_counted_in_its_prompt_tokens(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    model = ensure_tiny_vlm(cache)
    adapter = ensure_tiny_adapter(tmp_path / "adapters", rank=8, base=TINY_VLM_VERSION)
    images = tmp_path / "images"
    images.mkdir()
    (images / "cat.png").write_bytes(png(48, 24))
    uploads = tmp_path / "files"  # where the Batch API keeps uploads (files/<id>.jsonl), outside the prefix
    uploads.mkdir()
    (uploads / f"{UPLOADED}.jsonl").write_bytes(png(16, 40))
    inputs = tmp_path / "in"
    inputs.mkdir()
    picture = data_url(png(20, 30))
    write_jsonl(
        inputs / "requests.jsonl",
        [
            _line("text"),
            # The base and the adapter on one prompt, side by side so the engine batches them together; 8 tokens:
            # enough for the adapter's delta to show (the probe of 2026-12-07 differed from the first token).
            _line("base-same", max_tokens=8),
            _line("lora-same", model=ADAPTER, max_tokens=8),
            _line("lora-one", picture, model=ADAPTER),
            _line("wrong-model", model="gpt-5"),
            _line("one", picture),
            _line("two", picture, str(images / "cat.png")),
            _line("many", picture, picture, picture),
            _line("broken", data_url(b"\x89PNG not really")),
            _line("elsewhere", "https://example.com/cat.png"),
            _responses_line("uploaded", UPLOADED),
            _responses_line("unmapped", NOT_MAPPED),
        ],
    )
    image_files = {UPLOADED: str(uploads / f"{UPLOADED}.jsonl")}
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "job.yaml",
        str(inputs),
        str(out),
        cache,
        input={"uri": str(inputs), "image_prefix": str(images), "max_images_per_row": 2, "image_files": image_files},
        model={
            "source": str(model),
            "cache_dir": str(cache),
            "adapters": {ADAPTER: {"source": str(adapter), "rank": 8}},
        },
        sampling={"max_tokens": 2, "temperature": 0.0},
        # The GPUs' layout: Ray's tokenize stage on, whose token ids an image row drops (image_stage.with_images).
        stages={"batch_size": 4, "tokenize_on_cpu": True},
    )

    code, log = run_job(["run", "--config", str(config)])
    assert code == 0, log

    answers, errors = _lines(out / "output.jsonl"), _lines(out / "errors.jsonl")
    chats = [a for a in answers if a["custom_id"] != "uploaded"]
    bodies = {a["custom_id"]: ChatCompletion.model_validate(a["response"]["body"]) for a in chats}
    assert set(bodies) == {"text", "base-same", "lora-same", "lora-one", "one", "two"}, (answers, errors)
    prompt = {name: body.usage.prompt_tokens for name, body in bodies.items() if body.usage is not None}
    per_image = vision_plan(read_model_config(model), 1, IMAGE_SIZE).tokens_per_image
    assert prompt["one"] == prompt["text"] + per_image
    assert prompt["two"] == prompt["text"] + 2 * per_image
    # Adapters: each body names what it ran on; the adapter changed the answer (and the base line beside it kept the
    # base's: without the spare slot it got the adapter's); an adapter's image costs what the base's does.
    assert {name: body.model for name, body in bodies.items()} == {
        name: ADAPTER if name.startswith("lora") else "llm-batch" for name in bodies
    }
    base_text, lora_text = (bodies[name].choices[0].message.content for name in ("base-same", "lora-same"))
    assert base_text != lora_text, (base_text, lora_text)
    assert prompt["lora-one"] == prompt["one"] and prompt["base-same"] == prompt["lora-same"] == prompt["text"]
    (uploaded,) = [Response.model_validate(a["response"]["body"]) for a in answers if a["custom_id"] == "uploaded"]
    assert uploaded.usage is not None and uploaded.usage.input_tokens == prompt["one"]  # the same prompt, one image
    refused = {e["custom_id"]: (e["response"]["status_code"], e["response"]["body"]["error"]) for e in errors}
    assert {name: (status, error["code"]) for name, (status, error) in refused.items()} == {
        "many": (400, "too_many_images"),
        "broken": (400, "invalid_image"),
        "elsewhere": (400, "invalid_image"),
        "unmapped": (400, "invalid_image"),
        "wrong-model": (400, "model_not_found"),
    }
    assert f"(served: llm-batch, {ADAPTER})" in refused["wrong-model"][1]["message"], refused["wrong-model"]
    assert NOT_MAPPED in refused["unmapped"][1]["message"]
    assert "max_images_per_row=2" in refused["many"][1]["message"]
    assert "not a readable image" in refused["broken"][1]["message"]
