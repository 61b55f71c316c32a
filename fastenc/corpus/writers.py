"""Sharded, resumable output of the corpus job. While a job runs everything lives in `<out>.partial/`: one shard per
window (`part-00000.parquet` or `.npy`) and the manifest, each written to a temporary name, flushed and renamed when
whole, so an interrupt leaves complete shards that a resume verifies and continues after. When every row is written
the output takes its final name: the .parquet folder of shards with its manifest, or one (rows, hidden) float32 .npy
in input order assembled a shard at a time (skipped rows as NaN rows), checked to open before it is renamed. A
failed write raises WriteError naming the folder, the operation and the OS's reason.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fastenc.corpus import outputs
from fastenc.corpus.manifest import MANIFEST, load_for_resume, new_manifest, shard_schema
from fastenc.corpus.outputs import Layout

OUT_FORMATS = (".parquet", ".npy")


class WriteError(OSError):
    """Writing the job's output failed: the message names the folder, the operation and the OS's reason."""


@contextmanager
def _writing(op: str, folder: Path, cleanup: Path | None = None):
    """Turn an OSError in the block into a WriteError naming `op` and `folder`; remove `cleanup` if it was left."""
    try:
        yield
    except OSError as e:
        if cleanup is not None:
            try:
                _remove(cleanup)
            except OSError:
                pass
        if isinstance(e, WriteError):
            raise
        err = WriteError(f"embed: cannot {op} in {str(folder)!r}: {e.strerror or e}")
        err.errno = e.errno
        raise err from e


def out_format(out: Path) -> str:
    fmt = out.suffix.lower()
    if fmt not in OUT_FORMATS:
        raise ValueError(f"embed: out {str(out)!r} must end in .parquet or .npy, got {fmt or '(no extension)'!r}")
    return fmt


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _write_bytes(path: Path, data: bytes, what: str) -> None:
    """`data` to `path`, whole or not at all: a temporary file, flushed to disk, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with _writing(f"write {what}", path.parent, cleanup=tmp):
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
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


def check_apart(out: Path, inputs) -> None:
    """Before any work: the output (and its work folder) lies neither inside an input folder nor is an input (its
    shards would be read back as input, or the input replaced)."""
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    targets = [out.resolve(), work_dir(out).resolve()]
    for item in items:
        if not isinstance(item, (str, Path)) or str(item) == "-":
            continue
        p = Path(item).resolve()
        for t in targets:
            if p.is_dir() and (t == p or p in t.parents):
                raise ValueError(f"embed: out {str(out)!r} is inside the input folder {str(item)!r}: its files would "
                                 "be read back as input; write the output outside the input folders")
            if t == p or t in p.parents:
                raise ValueError(f"embed: out {str(out)!r} would replace the input {str(item)!r}; write the output "
                                 "elsewhere")


def prepare(out: Path, params: dict[str, Any], inputs: list[dict[str, Any]], resume: bool,
            overwrite: bool) -> dict[str, Any]:
    """The manifest to continue from: a fresh one, or when resuming the interrupted run's, once its settings and
    inputs are checked (manifest.load_for_resume; each window and shard is verified as the job re-reads it)."""
    check_target(out, resume, overwrite)
    wd = work_dir(out)
    if resume and wd.exists():
        return load_for_resume(wd / MANIFEST, params, inputs)
    return new_manifest(params, inputs)


def start(out: Path, manifest: dict[str, Any], overwrite: bool) -> Path:
    """Create (or reuse, when resuming) the work folder; `overwrite` removes an old output and work folder."""
    wd = work_dir(out)
    with _writing("prepare the work folder", out.parent):
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
    _write_bytes(wd / MANIFEST, json.dumps(manifest, indent=1).encode(), "the manifest")


def _parquet_bytes(ids: list, cols: dict[str, Any], layout: Layout, id_type: str) -> bytes:
    import pyarrow as pa

    from fastenc.corpus.readers import parquet

    schema = shard_schema(layout, id_type)
    if id_type == "string":
        ids = [str(i) for i in ids]
    table = pa.Table.from_arrays([pa.array(ids, type=schema.field("id").type)] + outputs.arrow_columns(cols, layout),
                                 schema=schema)
    sink = pa.BufferOutputStream()
    parquet().write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_shard(wd: Path, fmt: str, index: int, ids: list, emb, keep: np.ndarray, id_type: str,
                layout: Layout | None = None) -> dict[str, Any]:
    """Write one shard: `emb` (rows, hidden) float32 of every input row of the window, or for another output kind
    its columns (fastenc.corpus.outputs: `layout` says which), `keep` which rows are real (False: a skipped bad row:
    left out of parquet, NaN in npy), ids as `id_type` ('string' | 'int64'). Returns the manifest's fields of the
    shard: its file name and the sha256 of its bytes."""
    name = f"part-{index:05d}{fmt}"
    if isinstance(emb, np.ndarray):
        layout, emb = outputs.as_layout(emb.shape[1]), {"embedding": emb}
    elif layout is None or fmt != ".parquet":
        raise ValueError(f"embed: a {layout.output if layout else 'ragged'} shard is written as parquet with its "
                         f"layout, got format {fmt!r}")
    if fmt == ".npy":
        emb = emb["embedding"]
        data = emb.copy()
        data[~keep] = np.nan
        buf = io.BytesIO()
        np.save(buf, data)
        blob = buf.getvalue()
    else:
        rows = np.flatnonzero(keep)
        blob = _parquet_bytes([ids[i] for i in rows], outputs.take(emb, rows), layout, id_type)
    _write_bytes(wd / name, blob, f"shard {name}")
    return {"file": name, "sha256": hashlib.sha256(blob).hexdigest()}


def _check_parquet(wd: Path, hidden, id_type: str, rows: int) -> str | None:
    """None when the folder `wd` opens as one parquet dataset of `rows` rows of the shard schema (hidden: the dense
    width, or the output's Layout); else why not."""
    from fastenc.corpus.readers import parquet

    pq = parquet()
    want = shard_schema(hidden, id_type)
    files = sorted(p for p in wd.iterdir() if not p.name.startswith(("_", ".")))
    if not files:
        return "it holds no shard"
    total = 0
    for p in files:
        try:
            f = pq.ParquetFile(p)
        except Exception as e:  # noqa: BLE001 (pyarrow raises several types for a bad file)
            return f"{p.name} is not a readable parquet file ({e})"
        if not f.schema_arrow.equals(want):
            return f"{p.name} has the schema {f.schema_arrow}, expected {want}"
        total += f.metadata.num_rows
    if total != rows:
        return f"it holds {total} rows, expected {rows}"
    return None


def finish(out: Path, wd: Path, fmt: str, manifest: dict[str, Any], hidden) -> None:
    """All rows written: check that the output opens with the expected rows, then give it its final name.
    hidden: the width of a dense output, or the output's Layout (fastenc.corpus.outputs)."""
    manifest["done"] = True
    layout = outputs.as_layout(hidden)
    if fmt == ".parquet":
        id_type = manifest.get("params", {}).get("id_type", "int64")
        if not manifest["shards"]:  # an empty input: one empty shard, so the output opens as an empty table
            entry = write_shard(wd, fmt, 0, [], layout.empty(), np.zeros(0, bool), id_type, layout)
            manifest["shards"].append({**entry, "rows_read": 0, "texts": 0, "tokens": 0, "truncated": 0,
                                       "skipped": 0, "bad": [], "input": []})
        save_manifest(wd, manifest)
        why = _check_parquet(wd, layout, id_type, sum(s["texts"] for s in manifest["shards"]))
        if why:
            raise ValueError(f"embed: the output in {str(wd)!r} does not open as one table: {why}")
        with _writing(f"rename the finished output to {out.name!r}", out.parent):
            os.replace(wd, out)
        return
    if layout.output != "dense":
        raise ValueError(f"embed: output={layout.output!r} writes ragged rows: out must be a .parquet folder")
    hidden = layout.width
    save_manifest(wd, manifest)
    total = sum(s["rows_read"] for s in manifest["shards"])
    tmp = out.with_name(out.name + ".tmp")
    # Header, then each shard's rows appended with plain writes: one shard in memory at a time, and no mapping of
    # the output (a memory map's written pages count in the process's resident set, growing with the corpus).
    try:
        with _writing(f"assemble {out.name!r} from the shards", out.parent, cleanup=tmp):
            with open(tmp, "wb") as fh:
                np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                          "fortran_order": False, "shape": (total, hidden)})
                for s in manifest["shards"]:
                    part = np.load(wd / s["file"])
                    if part.dtype != np.float32 or part.shape != (s["rows_read"], hidden):
                        raise ValueError(f"embed: shard {s['file']!r} holds {part.dtype} {part.shape}, expected "
                                         f"float32 {(s['rows_read'], hidden)} as its manifest entry says")
                    if part.size:  # a plain write: its OSError carries errno and reason
                        fh.write(memoryview(np.ascontiguousarray(part)).cast("B"))
                fh.flush()
                os.fsync(fh.fileno())
        why = _check_npy(tmp, total, hidden)
        if why:
            raise ValueError(f"embed: the assembled {str(tmp)!r} does not open as expected: {why}")
        with _writing(f"rename the finished output to {out.name!r}", out.parent, cleanup=tmp):
            os.replace(tmp, out)
    except BaseException:
        _remove(tmp)  # the shards stay: nothing is half-written under the final name
        raise
    shutil.rmtree(wd, ignore_errors=True)


def _check_npy(path: Path, rows: int, hidden: int) -> str | None:
    """None when `path` opens with np.load as float32 (rows, hidden) holding every byte of it; else why not."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as fh:
            version = fmt.read_magic(fh)
            shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(fh)
            offset = fh.tell()
    except Exception as e:  # noqa: BLE001 (numpy raises several types for a bad header)
        return f"np.load fails ({e})"
    if dtype != np.float32 or shape != (rows, hidden) or fortran:
        return f"it holds {dtype} {shape}, expected float32 {(rows, hidden)}"
    size = path.stat().st_size
    if size != offset + rows * hidden * 4:
        return f"it holds {size} bytes, expected {offset + rows * hidden * 4}"
    return None
