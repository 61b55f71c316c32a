"""Sharded, resumable output of the corpus job.

While a job runs, everything lives in `<out>.partial/`: one shard per window of input rows (`part-00000.parquet` or
`.npy`) and `_manifest.json`, each written to a temporary name and renamed when whole, the manifest after its shard.
An interrupted job leaves complete shards and a manifest that names them; `resume` continues after the last one.
When every row is written the output takes its final name: a `.parquet` output is the folder of shards (a parquet
dataset: `pyarrow.parquet.read_table(out)`) with its manifest; a `.npy` output is one (rows, hidden) float32 array
in input order, assembled from the shards one at a time (bounded memory), skipped rows as NaN rows.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "_manifest.json"  # "_" prefix: parquet readers skip it
OUT_FORMATS = (".parquet", ".npy")


def out_format(out: Path) -> str:
    fmt = out.suffix.lower()
    if fmt not in OUT_FORMATS:
        raise ValueError(f"embed: out {str(out)!r} must end in .parquet or .npy, got {fmt or '(no extension)'!r}")
    return fmt


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def check_target(out: Path, resume: bool, overwrite: bool) -> None:
    """Before any work: an existing final output needs `overwrite`; a `.partial` folder needs `resume` (continue)
    or `overwrite` (start over)."""
    out_format(out)
    wd = work_dir(out)
    if resume and overwrite:
        raise ValueError("embed: give resume or overwrite, not both")
    if out.exists():
        if not overwrite:
            what = "a finished output" if not resume else "a finished output (nothing to resume)"
            raise FileExistsError(f"embed: out {str(out)!r} exists ({what}); pass overwrite=True / --overwrite "
                                  "to replace it")
    if wd.exists() and not (resume or overwrite):
        raise FileExistsError(f"embed: {str(wd)!r} holds an interrupted run; pass resume=True / --resume to "
                              "continue it or overwrite=True / --overwrite to start over")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"embed: the folder of out {str(out)!r} does not exist")


def prepare(out: Path, params: dict[str, Any], resume: bool, overwrite: bool) -> dict[str, Any]:
    """The manifest to continue from (a fresh one unless resuming); resuming with other parameters than the
    interrupted run's is refused, naming them."""
    check_target(out, resume, overwrite)
    wd = work_dir(out)
    manifest = {"version": 1, "params": params, "shards": [], "done": False}
    if resume and wd.exists():
        try:
            old = json.loads((wd / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"embed: cannot resume: {str(wd / MANIFEST)!r} is missing or unreadable ({e})") from None
        diff = sorted(k for k in set(old.get("params", {})) | set(params) if old.get("params", {}).get(k) != params.get(k))
        if diff:
            raise ValueError(f"embed: cannot resume: the interrupted run used other settings for {diff} "
                             f"(then {[old.get('params', {}).get(k) for k in diff]}, now {[params.get(k) for k in diff]})")
        for s in old["shards"]:
            if not (wd / s["file"]).is_file():
                raise ValueError(f"embed: cannot resume: shard {s['file']!r} named in the manifest is missing")
        manifest = old
    return manifest


def start(out: Path, manifest: dict[str, Any], overwrite: bool) -> Path:
    """Create (or reuse, when resuming) the work folder; `overwrite` removes an old output and work folder."""
    wd = work_dir(out)
    if overwrite:
        _remove(out)
        if not manifest["shards"]:
            _remove(wd)
    wd.mkdir(parents=True, exist_ok=True)
    # files of a shard whose manifest entry was never written (interrupted between the two renames) are stale
    known = {s["file"] for s in manifest["shards"]} | {MANIFEST}
    for p in wd.iterdir():
        if p.name not in known:
            _remove(p)
    save_manifest(wd, manifest)
    return wd


def discard(wd: Path) -> None:
    """Remove a work folder whose run cannot be resumed."""
    _remove(wd)


def save_manifest(wd: Path, manifest: dict[str, Any]) -> None:
    _write_atomic(wd / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))


def write_shard(wd: Path, fmt: str, index: int, ids: list, emb: np.ndarray, keep: np.ndarray) -> str:
    """Write one shard: `emb` (rows, hidden) float32 of every input row of the window, `keep` which rows are real
    (False: a skipped bad row: left out of parquet, NaN in npy). Returns the shard's file name."""
    name = f"part-{index:05d}{fmt}"
    if fmt == ".npy":
        data = emb.copy()
        data[~keep] = np.nan
        _write_atomic(wd / name, lambda p: np.save(open(p, "wb"), data))
    else:
        from fastenc.corpus.readers import parquet

        pq = parquet()
        import pyarrow as pa

        rows = np.flatnonzero(keep)
        kept_ids = [ids[i] for i in rows]
        id_arr = pa.array(kept_ids, type=pa.string() if any(isinstance(i, str) for i in kept_ids) else pa.int64())
        flat = pa.array(np.ascontiguousarray(emb[rows], dtype=np.float32).reshape(-1))
        table = pa.table({"id": id_arr, "embedding": pa.FixedSizeListArray.from_arrays(flat, emb.shape[1])})
        _write_atomic(wd / name, lambda p: pq.write_table(table, p))
    return name


def finish(out: Path, wd: Path, fmt: str, manifest: dict[str, Any], hidden: int) -> None:
    """All rows written: give the output its final name."""
    manifest["done"] = True
    save_manifest(wd, manifest)
    if fmt == ".parquet":
        os.replace(wd, out)
        return
    total = sum(s["rows_read"] for s in manifest["shards"])
    tmp = out.with_name(out.name + ".tmp")
    # Header, then each shard's rows appended with plain writes: one shard in memory at a time, and no mapping of
    # the output (a memory map's written pages count in the process's resident set, growing with the corpus).
    try:
        with open(tmp, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                      "fortran_order": False, "shape": (total, hidden)})
            for s in manifest["shards"]:
                part = np.load(wd / s["file"])
                if part.dtype != np.float32 or part.shape != (s["rows_read"], hidden):
                    raise ValueError(f"embed: shard {s['file']!r} holds {part.dtype} {part.shape}, expected float32 "
                                     f"{(s['rows_read'], hidden)} as its manifest entry says")
                np.ascontiguousarray(part).tofile(fh)
    except BaseException:
        _remove(tmp)  # the shards stay: nothing is half-written under the final name
        raise
    os.replace(tmp, out)
    shutil.rmtree(wd)
