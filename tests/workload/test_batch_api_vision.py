"""Images uploaded as `vision` files and named from a batch's Responses lines (issue 57), without the engine: the
official openai client against the real app on a real uvicorn server (upload, the create's ownership check, the
delete refused while a batch names the file), the executor's job config holding exactly the checked files, and
the job's reader and image stage resolving a file_id through that mapping alone. The engine's side (the uploaded
image reaching the tiny VLM, counted in its prompt tokens) runs in tests/workload/test_job_images.py."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseInputImageParam

from tests.workload.test_batch_api import KEY_A, KEY_B, Server
from workload.batch_api.executor import job_config
from workload.batch_api.objects import Limits
from workload.contract.config import ConfigError, build_config
from workload.engine.image_stage import ImageFetcher
from workload.files.images import FILE_REF, ImageRefused, ImageRules
from workload.files.openai_batch import OpenAIDialect, RequestRefused, to_row
from workload.files.responses import RESPONSES_URL

MAX_IMAGE_BYTES = 4096


def png(side: int = 8) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def image_line(custom_id: str, file_id: str) -> str:
    part: ResponseInputImageParam = {"type": "input_image", "file_id": file_id, "detail": "auto"}
    item = {"role": "user", "content": [{"type": "input_text", "text": "What is it?"}, part]}
    body = {"model": "llm-batch", "input": [item], "max_output_tokens": 4}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": RESPONSES_URL, "body": body}) + "\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("vision"), "key", Limits(max_image_bytes=MAX_IMAGE_BYTES))
    yield running
    running.stop()


def _batch(client: openai.OpenAI, lines: str) -> Any:
    source = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint="/v1/responses", completion_window="24h")


def test_a_vision_upload_is_an_image_within_the_bound(server: Server) -> None:
    client = server.client()
    made = client.files.create(file=("cat.png", png()), purpose="vision")
    assert (made.purpose, made.bytes) == ("vision", len(png()))
    assert made.id in [f.id for f in client.files.list(purpose="vision")]
    with pytest.raises(openai.BadRequestError) as junk:
        client.files.create(file=("cat.png", b"not an image at all"), purpose="vision")
    assert junk.value.param == "file" and "Pillow" in junk.value.message
    with pytest.raises(openai.BadRequestError) as large:
        client.files.create(file=("big.png", png(8) + b"\0" * MAX_IMAGE_BYTES), purpose="vision")
    assert large.value.param == "file" and f"max_image_bytes of {MAX_IMAGE_BYTES}" in large.value.message
    with pytest.raises(openai.BadRequestError) as declared:  # the Uploads API's declared size, before any part
        client.uploads.create(bytes=MAX_IMAGE_BYTES + 1, filename="b.png", mime_type="image/png", purpose="vision")
    assert declared.value.param == "bytes"
    stored = {f.id for f in client.files.list(purpose="vision")}
    assert stored == {made.id}  # nothing refused was kept


def test_a_vision_upload_through_parts_is_checked_too(server: Server, tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(png())
    upload = server.client().uploads.upload_file_chunked(file=path, mime_type="image/png", purpose="vision")
    assert upload.status == "completed" and upload.file is not None and upload.file.purpose == "vision"
    path.write_bytes(b"x" * 100)
    with pytest.raises(openai.BadRequestError) as junk:
        server.client().uploads.upload_file_chunked(file=path, mime_type="image/png", purpose="vision")
    assert "Pillow" in junk.value.message


def test_a_batch_naming_its_owners_vision_file_is_taken_and_its_job_gets_exactly_that_file(server: Server) -> None:
    client = server.client()
    image = client.files.create(file=("cat.png", png()), purpose="vision")
    batch = _batch(client, image_line("r1", image.id) + image_line("r2", image.id))
    assert (batch.status, batch.request_counts.total) == ("validating", 2)
    record = server.service.batches.get(batch.id)
    assert record is not None and record.image_files == {image.id: f"files/{image.id}.jsonl"}
    assert "_image_files" not in client.batches.retrieve(batch.id).model_dump()  # never in a response
    run = server.service.scheduler._batch_run(record)
    config = build_config(job_config({}, run))
    assert config.input.image_files == {image.id: server.store.uri(f"files/{image.id}.jsonl")}
    assert config.input.image_prefix is None
    with pytest.raises(openai.ConflictError) as named:  # its job reads it: kept until the batch has finished
        client.files.delete(image.id)
    assert named.value.param == "file_id" and batch.id in named.value.message
    assert client.batches.cancel(batch.id).status == "cancelled"
    assert client.files.delete(image.id).deleted


def test_a_line_naming_another_keys_file_or_no_vision_file_fails_the_batch_at_create(server: Server) -> None:
    mine, theirs = server.client(KEY_A), server.client(KEY_B)
    own = mine.files.create(file=("cat.png", png()), purpose="vision")
    other = theirs.files.create(file=("dog.png", png()), purpose="vision")
    text_file = mine.files.create(file=("t.jsonl", b"{}\n"), purpose="batch")
    for named, words in [
        (other.id, f"no vision file {other.id!r} of yours"),  # as if it did not exist: no probing
        ("file-000000000000000000000000", "no vision file"),
        (text_file.id, "purpose 'batch'"),
    ]:
        failed = _batch(mine, image_line("r1", own.id) + image_line("r2", named))
        assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
        error = failed.errors.data[0]
        assert (error.code, error.line, error.param) == ("invalid_file_id", 2, "body.input[0].content[1].file_id")
        assert error.message is not None and words in error.message
    assert theirs.files.delete(other.id).deleted  # a failed batch holds nothing


def test_a_server_without_the_image_bound_serves_no_vision_files(tmp_path: Path) -> None:
    """Limits() without max_image_bytes: the AWS front whose function lacks LLM_BATCH_MAX_IMAGE_BYTES (deployed
    before the stack set it). With it, the front serves them (test_batch_api_lambda.py)."""
    running = Server(tmp_path, "key", Limits())
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            running.client().files.create(file=("cat.png", png()), purpose="vision")
        assert refused.value.param == "purpose" and "data: URLs" in refused.value.message
    finally:
        running.stop()


def test_the_job_resolves_a_file_id_through_its_mapping_alone(tmp_path: Path) -> None:
    file_id, other = "file-" + "a" * 24, "file-" + "b" * 24
    (tmp_path / "img.bin").write_bytes(png(12))
    dialect = OpenAIDialect(RESPONSES_URL, frozenset({"llm-batch"}))
    row = to_row(json.loads(image_line("r1", file_id)), dialect)
    assert row["_image_urls"] == [FILE_REF + file_id]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "idefics3", "vision_config": {}}))
    rules = ImageRules(None, 4, MAX_IMAGE_BYTES, {file_id: str(tmp_path / "img.bin")})
    assert ImageFetcher(str(model), rules).fetch(json.dumps(row["_image_urls"])) == [png(12)]
    for url in (FILE_REF + other, str(tmp_path / "img.bin")):  # an id it was not given; a path, even the file's
        with pytest.raises(ImageRefused) as refused:
            ImageFetcher(str(model), rules).fetch(json.dumps([url]))
        assert refused.value.error_type == "invalid_image"
    both: dict[str, Any] = json.loads(image_line("r1", file_id))
    both["body"]["input"][0]["content"][1]["image_url"] = "data:image/png;base64,AA=="
    with pytest.raises(RequestRefused, match="both image_url and file_id"):
        to_row(both, dialect)


def test_the_mapping_takes_only_file_ids_and_store_places() -> None:
    base = {"input": {"uri": "in/"}, "output": {"uri": "out/"}}
    for files, words in [({"../x": "/a"}, "not a file id"), ({"file-" + "a" * 24: "https://h/x"}, "s3:// URI")]:
        with pytest.raises(ConfigError, match=words):
            build_config({**base, "input": {"uri": "in/", "image_files": files}})
