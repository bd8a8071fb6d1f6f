"""Embedding vectors between the engine, the committed Parquet shards and OpenAI's embedding bodies.

In Parquet a vector is float32, never float64: the engine computes and returns float32 (Ray Data LLM widens a
bfloat16 model's output to float32, no further), so float64 would double the bytes of the largest column of the
output and add no information. The native format's `embedding` column is a fixed-size list of float32: the type
itself says every vector of the output has the model's one size, and a reader gets an (rows, size) matrix from it
without a copy (`column.combine_chunks().flatten().to_numpy().reshape(-1, size)`); Arrow's schema, stored in the
file, keeps the fixed size when the file is read back. An OpenAI line may carry several inputs and ask for fewer
`dimensions`, so there the column is `embeddings`, a list of float32 lists, one per input in index order.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import numpy as np
import pyarrow as pa

VECTORS_COLUMN = "_vectors"  # a row's vectors as little-endian float32 bytes, one after another
SIZES_COLUMN = "_vector_sizes"  # their sizes, as a JSON list
ONE_VECTOR = "embedding"  # native format: the row's vector, fixed_size_list<float32, size>
SEVERAL_VECTORS = "embeddings"  # OpenAI format: the line's vectors, list<list<float32>>


def pack_vectors(vectors: list[np.ndarray]) -> bytes:
    return b"".join(np.asarray(v, dtype="<f4").tobytes() for v in vectors)


def unpack_vectors(data: bytes, sizes_json: str) -> list[np.ndarray]:
    flat = np.frombuffer(data, dtype="<f4")
    sizes = [int(n) for n in json.loads(sizes_json)]
    if sum(sizes) != flat.size:
        raise ValueError(f"{flat.size} floats for vectors of sizes {sizes}")
    starts = np.cumsum([0, *sizes])
    return [flat[a:b] for a, b in itertools.pairwise(starts)]


def result_columns(rows: list[dict[str, Any]], several: bool) -> dict[str, pa.Array]:
    """A shard's embed results (`rows` in input order, each with `vectors`), as Arrow columns."""
    columns: dict[str, pa.Array] = {"id": pa.array([r["id"] for r in rows], pa.string())}
    if several:
        lists = [[v.tolist() for v in r["vectors"]] for r in rows]
        columns[SEVERAL_VECTORS] = pa.array(lists, pa.list_(pa.list_(pa.float32())))
    else:
        vectors = [r["vectors"][0] for r in rows]
        size = len(vectors[0]) if vectors else 0
        for row, vector in zip(rows, vectors, strict=True):
            if len(row["vectors"]) != 1 or len(vector) != size:
                raise ValueError(f"row {row['id']!r}: a vector of size {len(vector)} beside ones of size {size}")
        flat = pa.array(np.concatenate(vectors) if vectors else np.zeros(0, np.float32), pa.float32())
        columns[ONE_VECTOR] = pa.FixedSizeListArray.from_arrays(flat, size)
    columns["num_input_tokens"] = pa.array([r["num_input_tokens"] for r in rows], pa.int64())
    return columns


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # OpenAI's and vLLM's: the float32 array's little-endian bytes
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def embedding_body(row: dict[str, Any], facts: dict[str, Any], model: str) -> dict[str, Any]:
    """OpenAI's embedding response (`list` of `embedding` objects) for one answered line read back from Parquet."""
    encoding = facts.get("encoding_format", "float")
    tokens = int(row["num_input_tokens"])
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)}
            for index, vector in enumerate(row[SEVERAL_VECTORS])
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
