"""Reading a finished output of the corpus job: read_output opens a `.parquet` folder (its shards in the order its
manifest lists them) or a `.npy` array and returns the rows as numpy, the ragged outputs (sparse, multi_vector, m3)
as offsets + flat arrays (fastenc.corpus.outputs)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastenc.corpus import outputs
from fastenc.corpus.manifest import MANIFEST


class Output(NamedTuple):
    """A finished output read back (read_output): ids in input order and the rows of its kind: dense -> float32
    (rows, width); sparse -> SparseRows; multi_vector -> MultiVectorRows; m3 -> {"dense", "sparse", "colbert"}.
    params: the manifest's settings (None for a .npy output, which carries none)."""
    ids: list
    embeddings: Any
    output: str
    params: dict | None


def read_output(path: str | Path) -> Output:
    """Open a finished output of fastenc.embed: a `.parquet` folder (its shards in order, as its manifest lists
    them) or a `.npy` array. Returns Output(ids, embeddings, output, params): the rows in input order, the ragged
    outputs as offsets + flat arrays (see Output). A .npy's ids are its row positions (a skipped row is a NaN row)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        emb = np.load(path, allow_pickle=False)
        return Output(list(range(len(emb))), emb, "dense", None)
    if path.suffix.lower() != ".parquet" or not path.is_dir():
        raise ValueError(f"read_output: path must be a finished .parquet folder or a .npy file, got {str(path)!r}")
    from fastenc.corpus.readers import parquet

    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"read_output: {str(path / MANIFEST)!r} is missing or unreadable ({e})") from None
    if not manifest.get("done"):
        raise ValueError(f"read_output: {str(path)!r} is not a finished output (its manifest is not done)")
    params = manifest.get("params", {})
    layout = outputs.layout_of_params(params)
    ids: list = []
    parts = []
    for s in manifest["shards"]:
        table = parquet().read_table(path / s["file"])
        ids.extend(table.column("id").to_pylist())
        parts.append(outputs.from_arrow(table, layout))
    return Output(ids, outputs.public(outputs.concat(parts, layout), layout), layout.output, params)
