"""What one more read of the input costs, against what keeping its rows between passes would hold (issue 50):
`python -m tools.parse_cost [--rows N]`.

Writes the scale bench's input (workload/bench/scale.py: short prompts over 10 JSONL files, a few percent malformed
lines and repeated ids) to a temporary folder and runs, in this one process, what a read task of the main stream
runs: the pinned read and the split into records (RecordReader), then validation (the stage's `_validated`). No Ray
and no engine, so the CPU seconds are the read's own. Prints one JSON object: CPU and wall seconds of each step and
per row, and the bytes that keeping the rows would hold instead (the validated rows as the engine's Arrow input,
or the raw records as read).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def measure(rows: int, folder: Path) -> dict[str, Any]:
    from workload.bench.scale import write_input
    from workload.contract.config import InputConfig, SamplingParams
    from workload.job.input_plan import plan_input
    from workload.job.input_stream import RecordReader, _validated
    from workload.job.rejects import RejectsCollector

    write_input(folder, rows)
    listed = plan_input(InputConfig(uri=str(folder)))
    first, files = 0, []
    for file in listed.files:  # counted here as the id pass counts them: one record per non-blank line
        records = sum(1 for line in Path(file.path).read_bytes().splitlines() if line.strip())
        files.append(replace(file, first=first, records=records))
        first += records
    reader = RecordReader(files, shard_rows=1 << 40, shards=None, max_record_bytes=listed.max_record_bytes)
    wall, cpu = time.monotonic(), time.process_time()
    blocks: list[Any] = []
    for file in files:
        with reader._open_input_source(None, file.path) as stream:
            blocks.extend(reader._read_stream(stream, file.path))
    read_wall, read_cpu = time.monotonic() - wall, time.process_time() - cpu
    collector = RejectsCollector()
    wall, cpu = time.monotonic(), time.process_time()
    valid = [_validated(block, SamplingParams(), {}, collector.put) for block in blocks]
    check_wall, check_cpu = time.monotonic() - wall, time.process_time() - cpu
    return {
        "rows": rows,
        "input_bytes": sum(p.stat().st_size for p in folder.iterdir()),
        "read_and_split": {"cpu_s": round(read_cpu, 2), "wall_s": round(read_wall, 2)},
        "validate": {"cpu_s": round(check_cpu, 2), "wall_s": round(check_wall, 2)},
        "cpu_us_per_row": round((read_cpu + check_cpu) / rows * 1e6, 1),
        "kept_as_engine_input_bytes": sum(table.nbytes for table in valid),
        "kept_as_raw_records_bytes": sum(block.nbytes for block in blocks),
        "rejected_rows": sum(table.num_rows for table in collector.drain()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmb-parse-cost-") as folder:
        print(json.dumps(measure(args.rows, Path(folder) / "input"), indent=2))


if __name__ == "__main__":
    main()
