"""The corpus job's manifest (`_manifest.json` in the work folder and in a finished .parquet output) and what a
resumed run checks with it: the settings, per input the rows consumed and a running sha256 over them, per shard the
sha256 of its file and the digest of the input rows it came from. A resume whose inputs differ from the interrupted
run's is refused (ResumeError, naming the input and what changed), so an output never mixes two inputs; a shard
that fails its check is recomputed from the verified rows, never trusted.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from fastenc.corpus.readers import Record, Source

VERSION = 2
MANIFEST = "_manifest.json"  # "_" prefix: parquet readers skip it


# settings added after a manifest version's first release: the value an interrupted run without them used
PARAM_DEFAULTS = {"output": "dense", "top_k": None, "vector_dim": None}


class ResumeError(ValueError):
    """An interrupted run cannot be resumed: its inputs or settings differ, or its manifest cannot be verified."""


def input_entries(sources: list[Source] | None) -> list[dict[str, Any]]:
    """The `inputs` of a fresh manifest: one per source (None: in-memory texts), nothing consumed yet."""
    if sources is None:
        return [{"name": "<texts>", "rows": 0, "sha256": ""}]
    out = []
    for s in sources:
        if s.path is None:
            out.append({"name": "<stdin>", "rows": 0, "sha256": ""})
        else:
            st = s.path.stat()
            out.append({"name": str(s.path), "path": str(s.path.resolve()), "size": st.st_size,
                        "mtime_ns": st.st_mtime_ns, "rows": 0, "sha256": ""})
    return out


def model_digest(model) -> str:
    """sha256 over the model's state (each tensor's name, dtype, shape and bytes): a resumed run must embed with
    the very weights of the interrupted one, whether they came from a folder or from memory."""
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t = t.detach().to("cpu").contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def new_manifest(params: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"version": VERSION, "params": params, "inputs": inputs, "shards": [], "done": False}


def _row_bytes(r: Record) -> bytes:
    text = "\x00" if r.text is None else r.text
    return f"{r.row}\x1f{r.id!r}\x1f{r.bad}\x1f".encode() + text.encode("utf-8", "surrogatepass") + b"\x1e"


class Digest:
    """Running digests of the rows consumed from each input (starting from `inputs` with nothing consumed)."""

    def __init__(self, inputs: list[dict[str, Any]]):
        self.inputs = copy.deepcopy(inputs)
        for e in self.inputs:
            e["rows"], e["sha256"] = 0, ""
        self.pos = 0

    def _index(self, name: str) -> int:
        for j in range(self.pos, len(self.inputs)):
            if self.inputs[j]["name"] == name:
                self.pos = j
                return j
        raise ValueError(f"embed: row of {name!r} read after the inputs that follow it")

    def pieces(self, records: Iterable[Record]) -> list[dict[str, Any]]:
        """The digest of one window: per run of its rows from one input {source (index), first_row, rows, sha256};
        the running digests advance past it."""
        pieces: list[dict[str, Any]] = []
        h = None
        for r in records:
            if not pieces or r.source != self.inputs[pieces[-1]["source"]]["name"]:
                if h is not None:
                    pieces[-1]["sha256"] = h.hexdigest()
                pieces.append({"source": self._index(r.source), "first_row": r.row, "rows": 0, "sha256": ""})
                h = hashlib.sha256()
            h.update(_row_bytes(r))
            pieces[-1]["rows"] += 1
        if h is not None:
            pieces[-1]["sha256"] = h.hexdigest()
        for p in pieces:
            e = self.inputs[p["source"]]
            e["rows"] += p["rows"]
            e["sha256"] = hashlib.sha256((e["sha256"] + p["sha256"]).encode()).hexdigest()
        return pieces

    def state(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.inputs)


def _changed(name: str, why: str) -> ResumeError:
    return ResumeError(f"embed: cannot resume: input {name!r} changed since the interrupted run ({why}); start over "
                       "with overwrite=True / --overwrite, or resume with the original input")


def check_window(entry: dict[str, Any], pieces: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> None:
    """Refuse (ResumeError) when a re-read window's digest differs from the one its shard was computed from."""
    old_pieces = entry["input"]
    for k in range(max(len(old_pieces), len(pieces))):
        old = old_pieces[k] if k < len(old_pieces) else None
        new = pieces[k] if k < len(pieces) else None
        if old == new:
            continue
        if old is None:
            name = inputs[new["source"]]["name"]
            raise _changed(name, f"row {new['first_row']} of it was not read at this point before")
        name = inputs[old["source"]]["name"]
        end = old["first_row"] + old["rows"]
        if new is None or new["source"] != old["source"] or new["first_row"] != old["first_row"]:
            raise _changed(name, f"it now ends before row {end - 1}, which the interrupted run read")
        if new["rows"] < old["rows"]:
            raise _changed(name, f"it now ends after {new['first_row'] + new['rows']} rows; the interrupted run "
                                 f"read {end} rows of it")
        if new["rows"] > old["rows"]:
            raise _changed(name, f"it now holds more than the {end} rows the interrupted run read of it before "
                                 "the next input")
        raise _changed(name, f"content hash of the first {end} rows differs")


def check_ended(entry: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
    """Refuse: the inputs ended before the rows of an interrupted run's shard."""
    first = entry["input"][0]
    raise _changed(inputs[first["source"]]["name"], f"it now ends before row {first['first_row']}, which the "
                                                    "interrupted run read")


def _check_inputs(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    then, now = [e["name"] for e in old], [e["name"] for e in new]
    if [e.get("path", e["name"]) for e in old] != [e.get("path", e["name"]) for e in new]:
        raise ResumeError(f"embed: cannot resume: the inputs differ from the interrupted run's (then {then}, now "
                          f"{now})")
    for o, n in zip(old, new):
        if "path" not in o or not o["rows"]:
            continue  # in-memory texts and standard input are verified by content alone; unread files need nothing
        for key, unit in (("size", " bytes"), ("mtime_ns", " ns")):
            if o.get(key) != n.get(key):
                raise _changed(o["name"], f"{key.replace('_ns', '')} {o.get(key)}{unit} then, {n.get(key)}{unit} now")


def load_for_resume(path: Path, params: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The interrupted run's manifest at `path`, after checking that it can be verified, that its settings are
    these and that its inputs are these files, unchanged in size and mtime where it read them."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"embed: cannot resume: {str(path)!r} is missing or unreadable ({e}); start over with "
                          "overwrite=True / --overwrite") from None
    if not isinstance(old, dict) or old.get("version") != VERSION or not isinstance(old.get("inputs"), list) \
            or not all(isinstance(s, dict) and "input" in s and "sha256" in s for s in old.get("shards", [])):
        raise ResumeError(f"embed: cannot resume: {str(path)!r} holds no digest of the inputs and shards to verify "
                          f"(manifest version {old.get('version') if isinstance(old, dict) else None!r}, expected "
                          f"{VERSION}); start over with overwrite=True / --overwrite")
    then = {**PARAM_DEFAULTS, **old.get("params", {})}
    diff = sorted(k for k in set(then) | set(params) if then.get(k) != params.get(k))
    if diff:
        raise ResumeError(f"embed: cannot resume: the interrupted run used other settings for {diff} "
                          f"(then {[then.get(k) for k in diff]}, now {[params.get(k) for k in diff]})")
    _check_inputs(old["inputs"], inputs)
    return old


def shard_schema(hidden, id_type: str):
    """The schema of every parquet shard: id (string or int64, one type per output) and embedding (hidden: its
    width), or the columns of another output kind (hidden: its fastenc.corpus.outputs.Layout)."""
    from fastenc.corpus import outputs

    return outputs.schema(outputs.as_layout(hidden), id_type)


def _expected_ids(records: list[Record], keep: np.ndarray, id_type: str) -> list:
    return [str(r.id) if id_type == "string" else r.id for r, k in zip(records, keep) if k]


def verify_shard(wd: Path, entry: dict[str, Any], fmt: str, hidden, id_type: str, records: list[Record],
                 keep: np.ndarray) -> str | None:
    """None when shard `entry['file']` holds what its entry says for the window `records` (checksum, rows, ids,
    skipped rows, and for the ragged outputs rows whose lists agree); else why not. hidden: the width of a dense
    output, or the output's fastenc.corpus.outputs.Layout."""
    from fastenc.corpus import outputs

    layout = outputs.as_layout(hidden)
    hidden = layout.width
    path = wd / entry["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        return f"its checksum differs from the manifest's ({len(data)} bytes: truncated or corrupted)"
    if entry.get("rows_read") != len(records) or entry.get("texts") != int(keep.sum()):
        return "its manifest entry does not match the window's rows"
    try:
        if fmt == ".npy":
            arr = np.load(io.BytesIO(data), allow_pickle=False)
            if arr.dtype != np.float32 or arr.shape != (len(records), hidden):
                return f"it holds {arr.dtype} {arr.shape}, expected float32 {(len(records), hidden)}"
            if not np.isnan(arr[~keep]).all():
                return "its skipped rows are not NaN"
            return None
        import pyarrow as pa

        from fastenc.corpus.readers import parquet

        table = parquet().read_table(pa.BufferReader(data))
    except Exception as e:  # noqa: BLE001 (numpy and pyarrow raise several types for a bad file)
        return f"unreadable ({e})"

    if not table.schema.equals(shard_schema(layout, id_type)):
        return f"its schema is {table.schema}, expected {shard_schema(layout, id_type)}"
    if table.column("id").to_pylist() != _expected_ids(records, keep, id_type):
        return "its ids differ from the window's rows"
    if layout.output != "dense":
        try:
            return outputs.check_rows(outputs.from_arrow(table, layout))
        except Exception as e:  # noqa: BLE001 (pyarrow raises several types for a bad column)
            return f"unreadable ({e})"
    return None
