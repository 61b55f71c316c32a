"""The corpus job on Ray Data: each input file is split into blocks of `window` consecutive rows, which Ray tasks
read with the in-process job's readers, embedded by `map_batches` over a pool of actors that each load the model
once (so the actors share even a single big file), and streamed back to the driver in input order, which writes
the same shards and manifest as the in-process job. The driver reads the model's settings from the folder's config
files and never loads the weights. Ray is an optional extra (`pip install -e ".[ray]"`), imported only here; on a
cluster, pass address="auto" with the model folder at the same path on every node.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastenc.corpus import manifest as mf
from fastenc.corpus import outputs, quantization, writers
from fastenc.corpus.job import (EmbedInterrupted, Options, Summary, default_model_path, embed_ids,
                                tokenize)
from fastenc.corpus.memory import pin_mmap_threshold, release_between_windows
from fastenc.corpus.readers import (BadRowError, Block, Source, bad_row_error, check_fields, id_type, iter_block,
                                    resolve_sources, split_source)


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError("embed: engine='ray' needs Ray Data: pip install -e \".[ray]\" (or pip install 'ray[data]')") from None
    return ray


def _read_block(item: dict[str, Any], text_field: str, id_field: str | None, on_bad: str) -> list[dict[str, Any]]:
    """The rows of one block of an input file as dicts (id, text, bad, source, row): runs in a Ray task."""
    block = Block(Source(Path(item["path"]), item["fmt"], item["prefix"]), item["offset"], item["first_row"],
                  item["rows"])
    rows = []
    for r in iter_block(block, text_field, id_field, on_bad):
        rows.append({"id": str(r.id) if item["str_ids"] else int(r.id), "text": r.text or "",
                     "bad": r.bad, "source": r.source, "row": r.row})
    return rows


class _Embedder:
    """A Ray actor: the model loaded once, then one call per batch of rows."""

    def __init__(self, folder: str, device: str | None, dtype: str | None, threads: int, opts: dict[str, Any]):
        import torch

        import fastenc
        from fastenc.corpus.job import resolve_options

        pin_mmap_threshold()  # each actor is its own process
        self.threads = threads
        if threads > 0:
            torch.set_num_threads(threads)
        self.model = fastenc.from_pretrained(folder, device=device,
                                             dtype=getattr(torch, dtype) if dtype else None).eval()
        self.opts = Options(**opts)
        quantization.apply(self.model, self.opts.quantize, "embed: quantize")  # each actor its own model
        self.pooling, self.normalize, self.max_length = resolve_options(self.model, self.opts)
        from fastenc.corpus.job import output_layout

        self.layout = output_layout(self.model, self.opts)

    def __call__(self, batch):
        import pyarrow as pa
        import torch

        if self.threads > 0:
            # Again in the calling thread: Ray may run the calls on another thread than __init__'s, and the OpenMP
            # thread count the C++ kernels read is per thread (Ray sets OMP_NUM_THREADS to the actor's whole CPUs).
            torch.set_num_threads(self.threads)

        bad = batch.column("bad").to_pylist()
        texts = batch.column("text").to_pylist()
        good = [i for i, b in enumerate(bad) if not b]
        meta = {"bad": batch.column("bad"), "source": batch.column("source"), "row": batch.column("row")}
        if self.layout.output != "dense":
            return self._ragged(batch, texts, good, meta)
        hidden = self.opts.dimensions or self.model.config.hidden_size
        emb = np.zeros((len(bad), hidden), dtype=np.float32)
        tokens = np.zeros(len(bad), dtype=np.int64)
        cut = np.zeros(len(bad), dtype=bool)
        if good:
            seqs, flags = tokenize(self.model, [texts[i] for i in good], self.max_length)
            emb[good] = embed_ids(self.model, seqs, self.pooling, self.normalize, self.opts.max_batch_tokens,
                                  self.opts.max_batch_size, dimensions=self.opts.dimensions)
            tokens[good] = [len(s) for s in seqs]
            cut[good] = flags
            release_between_windows()  # each call is one window: the next starts from the same state
        flat = pa.array(emb.reshape(-1))
        return pa.table({"id": batch.column("id"), "embedding": pa.FixedSizeListArray.from_arrays(flat, hidden),
                         **meta, "tokens": pa.array(tokens), "truncated": pa.array(cut)})

    def _ragged(self, batch, texts, good, meta):
        """__call__ for the other output kinds: the layout's columns (fastenc.corpus.outputs), a bad row empty."""
        import pyarrow as pa

        n = len(texts)
        tokens = np.zeros(n, dtype=np.int64)
        cut = np.zeros(n, dtype=bool)
        seqs, flags = tokenize(self.model, [texts[i] for i in good], self.max_length) if good else ([], [])
        cols = outputs.compute(self.model, seqs, self.layout, self.opts.top_k, self.opts.max_batch_tokens,
                               self.opts.max_batch_size)
        keep = np.zeros(n, dtype=bool)
        keep[good] = True
        cols = outputs.expand(cols, keep, self.layout)
        if good:
            tokens[good] = [len(s) for s in seqs]
            cut[good] = flags
            release_between_windows()
        arrays = dict(zip(self.layout.columns, outputs.arrow_columns(cols, self.layout)))
        return pa.table({"id": batch.column("id"), **arrays, **meta, "tokens": pa.array(tokens),
                         "truncated": pa.array(cut)})


def run_ray(inputs, out, model=None, *, address: str | None = None, actors: int = 1, gpus_per_actor: float = 0.0,
            device: str | None = None, dtype=None, overwrite: bool = False, opts: Options | None = None) -> Summary:
    """The corpus job on Ray (see module docstring); returns the same Summary as the in-process job."""
    opts = opts or Options()
    opts.check()
    if not isinstance(actors, int) or isinstance(actors, bool) or actors < 1:
        raise ValueError(f"embed: actors must be a positive int, got {actors!r}")
    if isinstance(gpus_per_actor, bool) or not isinstance(gpus_per_actor, (int, float)) or gpus_per_actor < 0:
        raise ValueError(f"embed: gpus_per_actor must be a number >= 0, got {gpus_per_actor!r}")
    quantization.check_placement(opts.quantize, device, dtype, "embed: quantize")
    if opts.quantize and gpus_per_actor:
        raise ValueError(f"embed: quantize {opts.quantize} runs on the CPU, got gpus_per_actor={gpus_per_actor!r}")
    if not isinstance(inputs, (str, Path, list, tuple)) or str(inputs) == "-":
        raise ValueError("embed: engine='ray' reads files: give a file, a folder or a list of paths (not standard "
                         "input or in-memory texts)")
    sources = resolve_sources([Path(p) for p in inputs] if isinstance(inputs, (list, tuple)) else inputs)
    if any(s.path is None for s in sources):
        raise ValueError("embed: engine='ray' cannot read standard input")
    check_fields(sources, opts.text_field, opts.id_field)
    out = Path(out)
    if writers.out_format(out) != ".parquet":
        raise ValueError(f"embed: engine='ray' writes parquet shards: out must end in .parquet, got {str(out)!r}")
    writers.check_apart(out, inputs)
    writers.check_target(out, False, overwrite)
    folder = Path(model) if model is not None else default_model_path()
    if not isinstance(model, (str, Path, type(None))) or not folder.is_dir():
        raise ValueError("embed: engine='ray' loads the model in each actor: model must be a model folder path")
    pin_mmap_threshold()  # the driver's memory too: it collects and writes every window
    probe = probe_folder(folder)
    settings = folder_settings(folder, opts, probe)  # what the actors will use; before Ray starts, as the blocks
    # the output's columns; a model without the output is refused here, before Ray starts or any shard is written
    layout = outputs.layout_of(probe, opts.output, settings[3] if opts.output == "dense" else None)
    blocks = [b for s in sources for b in split_source(s, opts.window)]  # window rows each, as the local windows
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True,
                 **({"include_dashboard": False, "log_to_driver": False} if address else local_ray_options()))
        started = True
    try:
        return _run(ray, sources, blocks, settings, layout, out, folder, actors, gpus_per_actor, device, dtype,
                    overwrite, opts, time.perf_counter())
    finally:
        if started:
            ray.shutdown()


def local_ray_options() -> dict[str, Any]:
    """ray.init arguments of a local Ray the job starts itself. Ray starts its worker processes (the actors and read
    tasks) at nice 15 by default (its `worker_niceness`), below the driver and Ray's own daemons (nice 0): on a
    machine whose every core the actor's compute threads use, each wake-up of the driver or a daemon then preempts
    a compute thread and the whole OpenMP region waits for it (the one-actor job ran at 0.82 of the in-process
    job's speed on 2 cores). Workers at the driver's niceness share the CPUs as the in-process job's threads do. On
    a cluster started with `ray start`, set RAY_worker_niceness=0 in its environment for the same effect."""
    return {"num_cpus": os.cpu_count(), "include_dashboard": False, "log_to_driver": False,
            "_system_config": {"worker_niceness": 0}}


def folder_settings(folder: Path, opts: Options, probe=None) -> tuple[str, bool, int, int]:
    """(pooling, normalize, max_length, width) the job uses with the model in `folder`, as resolve_options gives
    them for the loaded model, from config.json and the sentence-transformers files alone: the model is built on
    the meta device (probe_folder; no weights read, no memory) only to read its defaults."""
    from fastenc.corpus.job import resolve_options

    probe = probe_folder(folder) if probe is None else probe
    pooling, normalize, max_length = resolve_options(probe, opts)
    from fastenc.models.base import check_dimensions

    hidden = int(probe.config.hidden_size)
    return pooling, normalize, max_length, check_dimensions("embed", opts.dimensions, hidden) or hidden


def probe_folder(folder: Path):
    """The model in `folder` as fastenc.from_pretrained builds it (the class of its config's architecture, the
    tokenizer and sentence-transformers settings, BGE-M3's small head files), its weights on the meta device: no
    weights read, no memory. The driver reads the job's settings and the output's needs from it."""
    import torch

    from fastenc.models import architecture
    from fastenc.models.loading import SkipMetaInit

    cfg_file = folder / "config.json"
    try:
        d = json.loads(cfg_file.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"embed: model folder {str(folder)!r} has no config.json") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"embed: {str(cfg_file)!r} is not a readable JSON config: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"embed: {str(cfg_file)!r} must hold a JSON object, got {type(d).__name__}")
    name = (d.get("architectures") or [None])[0]
    heads, encoders = architecture.hf_classes(), architecture.encoder_classes()
    arch = heads[name][0] if name in heads else encoders.get(name, d.get("model_type") if name is None else None)
    task = heads[name][1] if name in heads else "base"
    if arch not in architecture.architectures():
        raise ValueError(f"embed: {str(cfg_file)!r} describes {name or d.get('model_type')!r}, not a supported "
                         f"architecture ({', '.join(architecture.architectures())})")
    spec = architecture.get(arch)
    if spec.modality != "text":
        raise ValueError(f"embed: the corpus job embeds text; {str(folder)!r} holds a {arch} ({spec.modality}) model")
    cfg = spec.config.from_dict(d, **spec.overrides(task, False))
    with torch.device("meta"), SkipMetaInit():
        probe = spec.model_class(task)(cfg)
    probe.load_tokenizer(folder)
    from fastenc.models.bge_m3 import load_heads

    load_heads(probe, folder)
    return probe


def _run(ray, sources, blocks, settings, layout, out, folder, actors, gpus_per_actor, device, dtype, overwrite, opts,
         t0) -> Summary:
    import ray.data

    pooling, normalize, max_length, hidden = settings
    ids_type = id_type(sources, opts.id_field)  # one id column type for every shard, as the in-process job
    str_ids = ids_type == "string"
    params = {"engine": "ray", "model": str(folder.resolve()),
              "pooling": pooling, "normalize": normalize, "max_length": max_length, "format": ".parquet",
              "text_field": opts.text_field, "id_field": opts.id_field, "on_bad": opts.on_bad, "hidden": hidden,
              "id_type": ids_type, "quantize": {"mode": opts.quantize} if opts.quantize else None,
              "dimensions": opts.dimensions, "output": layout.output, "top_k": opts.top_k, "vector_dim": layout.dim}
    manifest = writers.prepare(out, params, mf.input_entries(sources), False, overwrite)
    wd = writers.start(out, manifest, overwrite)

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the job prints its own summary
    ctx.execution_options.preserve_order = True  # shards in input order, as the in-process job writes them
    cpus = float(ray.cluster_resources().get("CPU", 1))
    threads = max(1, int(cpus) // actors) if not gpus_per_actor else 1
    # Logical CPUs: the reading tasks keep 0.5 of them (Ray would otherwise hold them back behind the actors,
    # which take the rest); each actor runs `threads` torch threads whatever its logical share.
    actor_cpus = max(0.25, (cpus - 0.5) / actors)
    items = [{"path": str(b.source.path), "fmt": b.source.fmt, "prefix": b.source.prefix, "offset": b.offset,
              "first_row": b.first_row, "rows": b.rows, "str_ids": str_ids} for b in blocks]
    opt_dict = {k: getattr(opts, k) for k in ("max_batch_tokens", "max_batch_size", "window", "text_field",
                                               "id_field", "on_bad", "quantize", "dimensions", "output", "top_k")}
    opt_dict.update(max_length=max_length)  # the manifest's settings
    if opts.output == "dense":
        opt_dict.update(pooling=pooling, normalize=normalize)
    batches = iter(())
    if items:
        ds = ray.data.from_items(items, override_num_blocks=len(items)).flat_map(
            # bad rows come through marked (never raised in a task): the driver applies on_bad='error' in input
            # order, so it names the first bad row, as the in-process job does, whichever task finds one first
            _read_block, fn_kwargs={"text_field": opts.text_field, "id_field": opts.id_field, "on_bad": "skip"},
            num_cpus=0.25)
        ds = ds.map_batches(_Embedder, batch_size=opts.window, batch_format="pyarrow",
                            compute=ray.data.ActorPoolStrategy(size=actors),
                            fn_constructor_kwargs={"folder": str(folder), "device": device,
                                                   "dtype": str(dtype).replace("torch.", "") if dtype else None,
                                                   "threads": threads, "opts": opt_dict},
                            num_cpus=0 if gpus_per_actor else actor_cpus, num_gpus=gpus_per_actor or None)
        # an iterator held here, so that it can be closed: a for loop left by an exception keeps its hidden
        # iterator alive in the traceback, and with it Ray Data's executor and prefetch threads, until the
        # traceback is collected (a ray.shutdown() meanwhile can end the process)
        batches = iter(ds.iter_batches(batch_size=opts.window, batch_format="pyarrow"))
    summary = Summary()
    try:
        for table in batches:
            bad = np.array([bool(b) for b in table.column("bad").to_pylist()])
            keep = ~bad
            if layout.output == "dense":
                emb = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                emb = emb.reshape(len(bad), hidden)
            else:
                emb = outputs.from_arrow(table, layout)
            ids = table.column("id").to_pylist()
            bad_rows = [(s, r, b) for s, r, b in zip(table.column("source").to_pylist(),
                                                     table.column("row").to_pylist(),
                                                     table.column("bad").to_pylist()) if b]
            if bad_rows and opts.on_bad == "error":
                raise bad_row_error(*bad_rows[0])
            entry = {**writers.write_shard(wd, ".parquet", len(manifest["shards"]), ids, emb, keep, ids_type, layout),
                     "rows_read": len(bad), "texts": int(keep.sum()),
                     "tokens": int(np.asarray(table.column("tokens").to_numpy())[keep].sum()),
                     "truncated": int(np.asarray(table.column("truncated").to_numpy(zero_copy_only=False))[keep].sum()),
                     "skipped": len(bad_rows), "bad": bad_rows[:20], "input": []}  # a Ray run is not resumed
            manifest["shards"].append(entry)
            writers.save_manifest(wd, manifest)
            summary.add(entry)
    except BadRowError:
        writers.discard(wd)  # the input has to change, as in the in-process job
        raise
    except KeyboardInterrupt:
        raise EmbedInterrupted(f"embed: interrupted; the Ray job left {len(manifest['shards'])} shard(s) in "
                               f"{str(wd)!r} (a Ray run restarts: use overwrite=True / --overwrite)") from None
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # shuts Ray Data's executor down now, whether the loop ended or raised
    writers.finish(out, wd, ".parquet", manifest, layout)
    summary.seconds = time.perf_counter() - t0
    summary.shards = len(manifest["shards"])
    return summary
