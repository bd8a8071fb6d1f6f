"""Images on chat rows (issue 57) without an engine: OpenAI `image_url` parts and the native `images` column read
into the template's image parts and the row's urls; the config's prefix, count and size limits, each a named error
row; the image stage's fetch and decode (data: URLs and files under a local prefix, real PNGs by Pillow); the
engine-plan's image tokens by family. The engine's side (the image reaching the tiny VLM, counted in its prompt
tokens) runs in tests/workload/test_job_images.py."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from workload.contract.config import ConfigError, SamplingParams, build_config
from workload.contract.model_shape import SizingError
from workload.contract.vision_shape import vision_plan
from workload.engine.image_stage import ImageFetcher, error_text, multimodal_data, with_images
from workload.files.images import ImageRefused, ImageRules
from workload.files.openai_batch import CHAT_URL, OpenAIDialect
from workload.files.results import classify_inference_error
from workload.files.rows import Origin, Record, RowError, ValidRow, validate_record

BASE = {"input": {"uri": "in/"}, "output": {"uri": "out/"}}
CHAT = OpenAIDialect(CHAT_URL, frozenset({"llm-batch"}))


def png(width: int = 8, height: int = 8) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _line(content: Any) -> bytes:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": content}]}
    return json.dumps({"custom_id": "r1", "method": "POST", "url": CHAT_URL, "body": body}).encode()


def _validated(raw: bytes, rules: ImageRules = ImageRules.DEFAULT, openai: bool = True) -> ValidRow | RowError:
    record = Record(0, Origin("f", 0, 1), raw)
    return validate_record(record, SamplingParams(), CHAT if openai else None, image_rules=rules)


def test_an_image_url_part_stays_in_place_and_its_url_rides_on_the_row() -> None:
    url = data_url(png())
    row = _validated(_line([{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": url}}]))
    assert isinstance(row, ValidRow)
    assert row.messages == [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, {"type": "image"}]}]
    assert row.images == [url]
    assert "_image_urls" not in row.passthrough


def test_an_image_rows_other_messages_become_text_parts_for_templates_that_loop_over_parts() -> None:
    raw = {"id": "n1", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    row = _validated(json.dumps({**raw, "images": [data_url(png())]}).encode(), openai=False)
    assert isinstance(row, ValidRow) and row.messages is not None
    assert row.messages[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    plain = _validated(json.dumps(raw).encode(), openai=False)
    assert isinstance(plain, ValidRow) and plain.messages == raw["messages"]  # a text row renders as before


def test_a_responses_input_image_is_read_as_chats_image_url_part() -> None:
    from workload.files.openai_batch import to_row
    from workload.files.responses import RESPONSES_URL

    url = data_url(png())
    item = {
        "role": "user",
        "content": [{"type": "input_text", "text": "What?"}, {"type": "input_image", "image_url": url}],
    }
    line = {"custom_id": "r1", "method": "POST", "url": RESPONSES_URL, "body": {"model": "llm-batch", "input": [item]}}
    row = to_row(line, OpenAIDialect(RESPONSES_URL, frozenset({"llm-batch"})))
    assert row["messages"] == [{"role": "user", "content": [{"type": "text", "text": "What?"}, {"type": "image"}]}]
    assert row["_image_urls"] == [url]


def test_a_text_only_parts_array_reads_as_before() -> None:
    row = _validated(_line([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
    assert isinstance(row, ValidRow) and row.messages == [{"role": "user", "content": "ab"}] and row.images is None


def test_a_native_rows_images_go_before_the_last_user_messages_text() -> None:
    url = data_url(png())
    raw = json.dumps({"id": "n1", "messages": [{"role": "user", "content": "Caption."}], "images": [url, url]})
    row = _validated(raw.encode(), openai=False)
    assert isinstance(row, ValidRow)
    assert row.messages == [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Caption."}]}
    ]
    assert row.images == [url, url] and "images" not in row.passthrough


@pytest.mark.parametrize(
    ("row", "error_type", "words"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "images": ["https://example.com/a.png"]}, "invalid_image",
         "no other hosts"),
        ({"messages": [{"role": "user", "content": "x"}], "images": ["s3://other/a.png"]}, "invalid_image",
         "input.image_prefix"),
        ({"messages": [{"role": "user", "content": "x"}], "images": ["s3://img/../secret/a.png"]}, "invalid_image",
         "no other hosts"),
        ({"messages": [{"role": "user", "content": "x"}], "images": "data:image/png;base64,AA"}, "invalid_image",
         "list of url strings"),
        ({"prompt": "x", "images": ["s3://img/a.png"]}, "invalid_image", "need 'messages'"),
        ({"messages": [{"role": "user", "content": "x"}], "images": ["s3://img/a.png"] * 3}, "too_many_images",
         "max_images_per_row=2"),
        ({"messages": [{"role": "user", "content": "x"}], "images": ["data:image/png;base64," + "A" * 4000]},
         "image_too_large", "max_image_bytes=1024"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "invalid_messages", "1 image parts for 0"),
    ],
)  # fmt: skip
def test_a_bad_image_is_the_rows_error_naming_the_limit(row: dict[str, Any], error_type: str, words: str) -> None:
    rules = ImageRules("s3://img/", 2, 1024)
    outcome = _validated(json.dumps({"id": "n1", **row}).encode(), rules, openai=False)
    assert isinstance(outcome, RowError), outcome
    assert outcome.error_type == error_type and words in outcome.error_message, outcome.error_message


def test_an_openai_line_with_an_unknown_part_or_bad_image_url_names_it() -> None:
    audio = _validated(_line([{"type": "input_audio", "input_audio": {}}]))
    assert isinstance(audio, RowError) and "'input_audio' part" in audio.error_message
    bad = _validated(_line([{"type": "image_url", "image_url": "data:image/png;base64,AA"}]))
    assert isinstance(bad, RowError) and bad.error_type == "invalid_image" and "image_url" in bad.error_message
    many = _validated(_line([{"type": "image_url", "image_url": {"url": data_url(png())}}] * 5))
    assert isinstance(many, RowError) and many.error_type == "too_many_images"


def test_the_config_takes_the_image_settings_and_refuses_another_host() -> None:
    config = build_config(
        {**BASE, "input": {"uri": "in/", "image_prefix": "s3://bucket/images", "max_images_per_row": 2}}
    )
    assert config.input.image_prefix == "s3://bucket/images/" and config.input.max_images_per_row == 2
    with pytest.raises(ConfigError, match="image_prefix"):
        build_config({**BASE, "input": {"uri": "in/", "image_prefix": "https://example.com/"}})
    with pytest.raises(ConfigError, match="max_images_per_row"):
        build_config({**BASE, "input": {"uri": "in/", "max_images_per_row": 0}})
    with pytest.raises(ConfigError, match="image_dir"):
        build_config({**BASE, "input": {"uri": "in/", "image_dir": "x"}})  # a typo stops the run, as elsewhere


def _fetcher(tmp_path: Path, vision: bool = True, max_bytes: int = 1 << 20) -> ImageFetcher:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    config: dict[str, Any] = {"model_type": "idefics3", "architectures": ["Idefics3ForConditionalGeneration"]}
    if not vision:
        config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    return ImageFetcher(str(folder), ImageRules(str(tmp_path / "images") + "/", 4, max_bytes))


def test_the_stage_fetches_data_urls_and_files_under_the_prefix_and_decodes_them(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(png(12, 6))
    fetcher = _fetcher(tmp_path)
    fetched = fetcher.fetch(json.dumps([data_url(png()), str(tmp_path / "images" / "a.png")]))
    row: dict[str, Any] = {"_image_bytes": fetched, "tokenized_prompt": [1, 2], "prompt": "p"}
    with_images(row)
    assert [image.size for image in row["multimodal_data"]["image"]] == [(8, 8), (12, 6)]
    assert "tokenized_prompt" not in row and row["prompt"] == "p"  # the engine's processor tokenizes image rows
    assert multimodal_data(None) is None


@pytest.mark.parametrize(
    ("data", "error_type", "words"),
    [
        (b"not an image at all", "invalid_image", "not a readable image"),
        (png()[:40], "invalid_image", "not a readable image"),  # a truncated PNG fails at decode, not at open
        (png(64, 64) + b"\0" * 2048, "image_too_large", "max_image_bytes=1024"),
    ],
    ids=["not-an-image", "truncated", "too-large"],
)
def test_a_bad_file_is_its_rows_error(tmp_path: Path, data: bytes, error_type: str, words: str) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "bad.png").write_bytes(data)
    fetcher = _fetcher(tmp_path, max_bytes=1024)
    with pytest.raises(ImageRefused) as refused:
        fetcher.fetch(json.dumps([str(tmp_path / "images" / "bad.png")]))
    assert refused.value.error_type == error_type and words in refused.value.message
    kind, message = classify_inference_error(error_text(refused.value))
    assert kind == error_type and words in message


def test_a_text_only_model_refuses_images_as_the_rows_error(tmp_path: Path) -> None:
    with pytest.raises(ImageRefused) as refused:
        _fetcher(tmp_path, vision=False).fetch(json.dumps([data_url(png())]))
    assert refused.value.error_type == "images_not_supported"


def test_the_plan_counts_image_tokens_by_family() -> None:
    idefics = {
        "model_type": "idefics3",
        "scale_factor": 4,  # SmolVLM-256M's shape: 512-pixel tiles of 16-pixel patches
        "vision_config": {"image_size": 512, "patch_size": 16, "hidden_size": 768, "num_hidden_layers": 12},
        "text_config": {"hidden_size": 576},
    }
    assert vision_plan(idefics, 1, 512).tokens_per_image == 64 + 3
    assert vision_plan(idefics, 2, 1024).image_tokens_per_row == 2 * (64 + 3) * 5  # 2x2 tiles and the global one
    qwen = {"model_type": "qwen2_5_vl", "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "depth": 32}}
    assert vision_plan(qwen, 1, 448).tokens_per_image == 16 * 16 + 2
    with pytest.raises(SizingError, match="text-only"):
        vision_plan({"model_type": "llama"}, 1, 512)
    with pytest.raises(SizingError, match="mllama"):
        vision_plan({"model_type": "mllama", "vision_config": {}}, 1, 512)


def test_a_batch_api_batch_never_reads_the_servers_image_prefix() -> None:
    from workload.batch_api.executor import BatchRun, job_config

    base = {**BASE, "input": {"uri": "x", "image_prefix": "s3://shared/images/"}}
    config = build_config(job_config(base, BatchRun("batch_1", "/in.jsonl", "/out", CHAT_URL)))
    assert config.input.image_prefix is None  # data: URLs only: no tenant reads another's objects


def test_engine_plan_with_images_sizes_the_encoder_and_the_rows_image_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from workload.cli import engine_plan

    config = {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "scale_factor": 4,
        "vision_config": {"image_size": 512, "patch_size": 16, "hidden_size": 768, "num_hidden_layers": 12},
        "text_config": {
            "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 49280, "max_position_embeddings": 8192,
        },
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    parser = argparse.ArgumentParser()
    engine_plan.add_arguments(parser)
    base = ["--model", str(tmp_path), "--gpu", "l4"]
    assert engine_plan.run(parser.parse_args(base)) == 0
    text = json.loads(capsys.readouterr().out)
    assert "vision" not in text
    assert engine_plan.run(parser.parse_args([*base, "--images-per-row", "2", "--image-size", "512"])) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["vision"]["image_tokens_per_row"] == 2 * 67
    assert plan["row_tokens"] == text["row_tokens"] + 2 * 67
    assert plan["vision"]["encoder_parameters_m"] > 80  # SigLIP-base's 12 layers of 768: about 86 M
    assert plan["kv_cache_tokens"] < text["kv_cache_tokens"]  # the encoder's weights take their share


def test_the_image_settings_change_the_output_hash_only_when_set() -> None:
    base = build_config({**BASE, "input": {"uri": "in/"}})
    assert "image_prefix" not in base.output_affecting()["input"]  # a night begun before images still resumes
    limited = build_config({**BASE, "input": {"uri": "in/", "max_images_per_row": 1}})
    assert limited.output_hash() != base.output_hash()
