"""The corpus job: files (or texts) in, embeddings out — token-budget batches, sharded resumable writes, and the same
job on a Ray cluster. `fastenc.embed(...)` and `fastenc embed ...` are its front doors.

  readers.py    streaming .txt/.jsonl/.csv/.parquet/folder/stdin readers, row ids, bad-row policy
  batching.py   token-budget batches sorted by length within a window
  writers.py    shards + manifest under <out>.partial, renamed when whole; .parquet folder or one .npy
  outputs.py    the output kinds (dense, sparse, multi_vector, m3): model checks, computing, shard columns
  reading.py    read_output: a finished output as numpy (ragged rows as offsets + flat arrays)
  manifest.py   the manifest: settings, digests of the inputs consumed and of each shard; what a resume verifies
  job.py        the in-process engine (and in-memory results)
  ray_engine.py the same job on Ray Data (map_batches over an actor pool); Ray is imported only there
  quantization.py the quantize option (int8): its check, fastenc.quantize after the load, its manifest record
  memory.py     glibc's mmap threshold pinned at job start, so the job's peak memory does not grow with the corpus
  docstrings.py a real-text corpus made offline from the installed Python packages' docstrings
  cli.py        `fastenc embed`
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from fastenc.corpus.outputs import KINDS as OUTPUTS
from fastenc.corpus.outputs import MultiVectorRows, SparseRows
from fastenc.corpus.reading import Output, read_output

ENGINES = ("local", "ray")
__all__ = ["embed", "EmbedResult", "ENGINES", "OUTPUTS", "read_output", "Output", "SparseRows", "MultiVectorRows"]


class EmbedResult(NamedTuple):
    ids: list            # row ids (see readers.py): positions for a list of texts
    embeddings: Any      # numpy float32 (rows, hidden), input order; other outputs: see embed's `output`
    summary: Any         # fastenc.corpus.job.Summary


def embed(texts_or_path, model=None, *, out: str | Path | None = None, pooling: str | None = None,
          normalize: bool | None = None, max_length: int | None = None, max_batch_tokens: int = 16384,
          max_batch_size: int = 512, window: int = 4096, text_field: str = "text", id_field: str | None = None,
          on_bad: str = "error", device: str | None = None, dtype=None, resume: bool = False,
          overwrite: bool = False, progress: bool = False, engine: str = "local", address: str | None = None,
          actors: int = 1, gpus_per_actor: float = 0.0, stdin_format: str = "txt", quantize: str | None = None,
          dimensions: int | None = None, output: str = "dense", top_k: int | None = None):
    """Embed a corpus.

    texts_or_path: a list/iterable of strings, or a path (str or Path) to a .txt/.jsonl/.csv/.parquet file or a
      folder of them, '-' for standard input, or a list of Paths.
    model: a model folder, a fastenc text model with a tokenizer, or None for the embedded all-MiniLM-L6-v2.
    out: None -> returns EmbedResult(ids, embeddings, summary) in memory; a `.parquet` path (a folder of shards
      with a manifest) or a `.npy` path (one float32 array, row order = input order, skipped rows NaN) -> writes
      it incrementally and returns the summary; one id column type per output (strings for id_field values and
      folder ids, else int64); an empty input gives an empty table / a (0, hidden) array. The output may not lie
      inside an input folder.
    resume / overwrite: continue an interrupted run / replace the output. A resumed run re-reads the rows the
      interrupted one consumed and refuses (ResumeError) when an input or a setting changed; a shard that fails
      verification (checksum, rows, ids) is recomputed. A failed write raises WriteError (an OSError) naming the
      folder, the operation and the reason; complete shards are kept for a resume.
    pooling 'mean'|'cls', normalize, max_length: default to the model folder's sentence-transformers settings.
    max_batch_tokens: padded tokens per batch; window: texts sorted together (and rows per shard).
    on_bad: 'error' (default: raise naming the file and row) or 'skip' (count it in the summary).
    engine: 'local' or 'ray' (Ray Data over `actors` model actors; needs out= a .parquet path).
    stdin_format: 'txt', 'jsonl' or 'csv' for the input '-'.
    quantize: None (fp32) or 'int8': the model runs int8 (fastenc.quantize after it loads, in each Ray actor on
      Ray; CPU fp32 only). The manifest records it, so a resume refuses to change it. An in-memory model is
      quantized for the job and returned to fp32 after it (one quantized already runs as it is).
    dimensions: keep the first `dimensions` columns of each embedding (Matryoshka truncation, 1 <= dimensions <=
      the model's hidden size), re-normalized after the cut when normalize is on; the output has that many
      columns. The manifest records it, so a resume refuses to change it.
    output: what each row holds (docs/retrieval.md; the manifest records it and top_k, so a resume refuses to
      change them; a model that cannot give it is refused before any shard is written):
      'dense' (default) the pooled embedding;
      'sparse' vocabulary weights: SPLADE of a masked-LM model (model.encode(output='sparse')), else a BGE-M3
        folder's sparse_linear (model.encode_m3's sparse); top_k keeps at most that many per row, largest first;
      'multi_vector' ColBERT per-token unit vectors through the model's ColBERT projection (colbert_linear, or a
        BGE-M3 folder's colbert head; model.encode(output='multi_vector'), every token kept);
      'm3' BGE-M3's dense, sparse and colbert (model.encode_m3) from one forward.
      The ragged outputs write .parquet shards only (columns in fastenc.corpus.outputs); in memory and from
      read_output(out) they come back as SparseRows(offsets, indices, values), MultiVectorRows(offsets, vectors),
      or for 'm3' a dict {"dense", "sparse", "colbert"}. pooling, normalize and dimensions are for 'dense' only.
    """
    from fastenc.corpus.job import Options, embed_in_memory, run

    if engine not in ENGINES:
        raise ValueError(f"embed: engine must be one of {ENGINES}, got {engine!r}")
    opts = Options(pooling=pooling, normalize=normalize, max_length=max_length, max_batch_tokens=max_batch_tokens,
                   max_batch_size=max_batch_size, window=window, text_field=text_field, id_field=id_field,
                   on_bad=on_bad, progress=progress, quantize=quantize, dimensions=dimensions, output=output,
                   top_k=top_k)
    if engine == "ray":
        from fastenc.corpus.ray_engine import run_ray

        if out is None:
            raise ValueError("embed: engine='ray' writes parquet shards: give out=<folder>.parquet")
        return run_ray(texts_or_path, out, model, address=address, actors=actors, gpus_per_actor=gpus_per_actor,
                       device=device, dtype=dtype, overwrite=overwrite, opts=opts)
    if out is None:
        if resume or overwrite:
            raise ValueError("embed: resume and overwrite apply to an output: give out=")
        return EmbedResult(*embed_in_memory(texts_or_path, model, device=device, dtype=dtype,
                                            stdin_format="." + stdin_format.lstrip("."), opts=opts))
    return run(texts_or_path, out, model, device=device, dtype=dtype, resume=resume, overwrite=overwrite,
               stdin_format="." + stdin_format.lstrip("."), opts=opts)
