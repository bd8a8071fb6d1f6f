"""The scale profile's pure parts: its seeded input (every kind of row counted right) and its projection."""

from __future__ import annotations

import json
from pathlib import Path

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
