"""ONNX Runtime baseline of the model benchmarks: a transformers model exported with torch.onnx.export
(dynamo=True, dynamic batch and sequence axes), cached by a hash of its weights and the versions, and run by an
ONNX Runtime CPU session (the caller checks its outputs against transformers before timing)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

import torch


def session(name: str, kind: str, wrap: torch.nn.Module, example: tuple, hf_model, threads: int, workdir: Path,
            log: Callable[[str], None] = print):
    """Export `wrap` (hf_model's forward to its last hidden state) with torch.onnx.export(dynamo=True) and dynamic
    batch/sequence axes; an ONNX Runtime CPU session's fn(inputs) -> hidden states."""
    path = cache_path(name, hf_model, workdir)
    if path.exists():
        log(f"{name}: ONNX export from cache {path.parent}")
    else:
        log(f"{name}: exporting to ONNX (torch.onnx.export, dynamo=True) ...")
        _export(kind, wrap, example, path)
    names = ["pixel_values"] if kind == "vision" else ["input_ids", "attention_mask"]
    sess = cpu_session(path, threads)

    def run(inputs):
        feed = {n: inputs[n].numpy() for n in names}
        return torch.from_numpy(sess.run(None, feed)[0])
    return run


def cpu_session(path: Path, threads: int):
    """An ONNX Runtime CPU session of the model at `path`: `threads` intra-op threads, one inter-op thread, every graph
    optimization, and no busy-waiting after a run (ORT's spinning pool would take the cores from whichever provider
    runs next in the interleaved timing; a millisecond-long forward loses nothing to the wake-up)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def cache_path(name: str, hf_model, workdir: Path) -> Path:
    """Exports are cached by a hash of the weights and the torch/transformers versions (the outputs are still
    checked against transformers on every run): $FASTENC_CACHE_DIR or ~/.cache/fastenc, onnx/<model>-<hash>/.
    FASTENC_BENCH_NO_CACHE=1 exports into a temporary folder instead."""
    if os.environ.get("FASTENC_BENCH_NO_CACHE", "0") not in ("", "0"):
        return workdir / f"{name}.onnx"
    import transformers
    h = hashlib.sha1(f"{name}|{torch.__version__}|{transformers.__version__}".encode())
    for k, v in hf_model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    base = Path(os.environ.get("FASTENC_CACHE_DIR", Path.home() / ".cache" / "fastenc"))
    return base / "onnx" / f"{name}-{h.hexdigest()[:16]}" / f"{name}.onnx"


def _export(kind: str, wrap, ex: tuple, path: Path) -> None:
    if kind == "vision":
        names = ["pixel_values"]
        dyn = {"args": ({0: torch.export.Dim("batch", min=1, max=1024)},)}
    else:
        names = ["input_ids", "attention_mask"]
        bd, sd = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("seq", min=2, max=8192)
        dyn = {"args": ({0: bd, 1: sd}, {0: bd, 1: sd})}
    # export into a private folder, then rename it into place (the .onnx file names its external data file)
    tmp_dir = path.parent.with_name(path.parent.name + f".tmp{os.getpid()}")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / path.name
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.onnx._internal.exporter._registration", "onnxscript")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(wrap, ex, str(tmp), dynamo=True, input_names=names, output_names=["last_hidden_state"],
                              dynamic_shapes=dyn, external_data=True, verbose=False)
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
    try:
        tmp_dir.rename(path.parent)
    except OSError:  # another run got there first, or a stale folder: keep the fresh export where it is
        if not path.exists():
            shutil.rmtree(path.parent, ignore_errors=True)
            tmp_dir.rename(path.parent)
        else:
            shutil.rmtree(tmp_dir, ignore_errors=True)
