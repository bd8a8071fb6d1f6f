"""The scale profile's parts without the job: its seeded input (every kind of row counted right), its projection
and the counting S3 server of `scale_input: s3`."""

from __future__ import annotations

import json
from pathlib import Path

from workload.bench.counted_s3 import BUCKET, counted_s3
from workload.bench.profiles import get_profile
from workload.bench.scale import FILES, project_memory, write_input


def test_the_input_counts_match_its_rows_and_every_repeat_repeats_a_good_id(tmp_path: Path) -> None:
    counts = write_input(tmp_path, 5000)
    seen: set[str] = set()
    good = bad = repeated = 0
    for file in sorted(tmp_path.iterdir()):
        for line in file.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if row["id"] in seen:
                repeated += 1
            else:
                seen.add(row["id"])
                good += 1
    assert len(list(tmp_path.iterdir())) == FILES
    assert counts == {"good": good, "bad": bad, "duplicate": repeated}
    assert good + bad + repeated == 5000 and bad > 100 and repeated > 100


def test_projection_is_the_line_through_the_two_sizes() -> None:
    sizes = {
        "20000": {"rows": 20_000, "driver_peak_rss_gib": 0.60},
        "200000": {"rows": 200_000, "driver_peak_rss_gib": 0.618},
    }
    projected = project_memory(sizes)
    assert projected["gib_per_million_rows"] == 0.1
    assert projected["10000000"] == round(0.60 + 0.1 * 9.98, 3)


def test_the_scale_profile_runs_the_two_sizes() -> None:
    assert get_profile("scale").scale_rows == [20_000, 200_000]


def test_the_counting_server_counts_a_read_and_starts_again_after_each_take(tmp_path: Path) -> None:
    """What `scale_input: s3` adds (workload/bench/counted_s3.py): a real moto server, a request tally per command."""
    import boto3

    (tmp_path / "a.jsonl").write_bytes(b"x" * 5000)
    with counted_s3() as s3:
        uri = s3.upload(tmp_path, "in")  # the upload's own requests are not counted
        assert uri == f"s3://{BUCKET}/in/" and s3.take() == {"object_get_bytes": 0}
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1", **keys)
        assert len(client.get_object(Bucket=BUCKET, Key="in/a.jsonl")["Body"].read()) == 5000
        client.head_object(Bucket=BUCKET, Key="in/a.jsonl")
        client.list_objects_v2(Bucket=BUCKET, Prefix="in/")
        assert s3.take() == {"object_get": 1, "object_get_bytes": 5000, "object_head": 1, "list": 1}
        assert s3.take() == {"object_get_bytes": 0}
