"""What the corpus job writes per row (`output=`): a dense embedding, sparse vocabulary weights (SPLADE through a
masked-LM head, or BGE-M3's sparse_linear), ColBERT per-token vectors, or BGE-M3's three at once. For each: what it
needs of the model (checked before any shard is written), how a window's rows are computed (model.encode /
model.encode_m3 on each token-budget batch, so the job writes what they return), the parquet columns of a shard,
and their conversion from and to the numpy columns that fastenc.corpus.reading.read_output returns.

Columns of a parquet shard, after `id`:
  dense         embedding  fixed_size_list<float32, width>
  sparse        indices    list<int32>, values list<float32> (per row the same length; largest value first)
  multi_vector  vectors    list<fixed_size_list<float32, dim>> (one unit vector per token)
  m3            embedding, indices, values, vectors (BGE-M3's dense, sparse and colbert)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

KINDS = ("dense", "sparse", "multi_vector", "m3")


class SparseRows(NamedTuple):
    """Sparse weights of n rows, ragged: row i is (indices[offsets[i]:offsets[i+1]], values[...]), largest value
    first. offsets int64 (n+1,) from 0; indices int32 (nnz,) vocabulary (or token) ids; values float32 (nnz,)."""
    offsets: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.indices[a:b], self.values[a:b]

    def __len__(self) -> int:
        return len(self.offsets) - 1


class MultiVectorRows(NamedTuple):
    """Per-token vectors of n rows, ragged: row i is vectors[offsets[i]:offsets[i+1]].
    offsets int64 (n+1,) from 0; vectors float32 (total tokens, dim)."""
    offsets: np.ndarray
    vectors: np.ndarray

    def row(self, i: int) -> np.ndarray:
        return self.vectors[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __len__(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True)
class Layout:
    """The columns one output kind writes: width of `embedding` (dense, m3) and dim of `vectors` (multi_vector,
    m3); None where the kind has no such column."""
    output: str = "dense"
    width: int | None = None
    dim: int | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return {"dense": ("embedding",), "sparse": ("indices", "values"), "multi_vector": ("vectors",),
                "m3": ("embedding", "indices", "values", "vectors")}[self.output]

    def empty(self) -> dict[str, Any]:
        """The columns of zero rows."""
        z = np.zeros(1, np.int64)
        cols: dict[str, Any] = {}
        if "embedding" in self.columns:
            cols["embedding"] = np.empty((0, self.width), np.float32)
        if "indices" in self.columns:
            cols["indices"] = (z, np.empty(0, np.int32))
            cols["values"] = (z, np.empty(0, np.float32))
        if "vectors" in self.columns:
            cols["vectors"] = (z, np.empty((0, self.dim), np.float32))
        return cols


def as_layout(hidden) -> Layout:
    """A Layout, or an int: the width of a dense output (the form the dense job passes)."""
    return hidden if isinstance(hidden, Layout) else Layout("dense", int(hidden))


def layout_of_params(params: dict[str, Any]) -> Layout:
    """The Layout a manifest's settings describe (manifests of dense-only runs have no 'output')."""
    return Layout(params.get("output", "dense"), params.get("hidden"), params.get("vector_dim"))


def check_options(output, top_k, dimensions, pooling, normalize) -> None:
    """The job's output arguments, before any work; errors name the argument."""
    if output not in KINDS:
        raise ValueError(f"embed: output must be one of {KINDS}, got {output!r}")
    if top_k is not None:
        if output not in ("sparse", "m3"):
            raise ValueError(f"embed: top_k applies to output='sparse' or 'm3' only, got output={output!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"embed: top_k must be a positive int or None, got {top_k!r}")
    if output != "dense":
        for name, v in (("dimensions", dimensions), ("pooling", pooling), ("normalize", normalize)):
            if v is not None:
                raise ValueError(f"embed: {name} applies to output='dense' only, got output={output!r} with "
                                 f"{name}={v!r}")


def _heads(model) -> dict:
    return model.__dict__.get("retrieval_heads", {})


def sparse_source(model) -> str | None:
    """Where output='sparse' comes from: 'mlm' (a masked-LM head: SPLADE, as model.encode(output='sparse')),
    else 'bge_m3' (a BGE-M3 folder's sparse_linear head, as model.encode_m3), else None."""
    if hasattr(model, "mlm_projection"):
        return "mlm"
    return "bge_m3" if "sparse" in _heads(model) else None


def layout_of(model, output: str, width: int | None) -> Layout:
    """The Layout `output` gives with `model`; refuses (ValueError naming output) a model that cannot give it.
    width: the dense width (the job's output_width) for output='dense'."""
    from fastenc.models.retrieval import resolve_projection

    hidden = int(model.config.hidden_size)
    name = type(model).__name__
    if output == "dense":
        return Layout("dense", width)
    if output == "sparse":
        if sparse_source(model) is None:
            raise ValueError(f"embed: output='sparse' needs a masked-LM model (a *ForMaskedLM: its MLM head gives "
                             f"the vocabulary weights) or a BGE-M3 folder with sparse_linear.pt, got {name} "
                             "without either")
        return Layout("sparse")
    if output == "multi_vector":
        proj = resolve_projection(model, None)
        if proj is None:
            raise ValueError(f"embed: output='multi_vector' needs a ColBERT projection (the model's colbert_linear, "
                             f"or a BGE-M3 folder's colbert_linear.pt), got {name} without one")
        return Layout("multi_vector", None, int(proj[0].shape[0]))
    missing = [f for f, k in (("sparse_linear.pt", "sparse"), ("colbert_linear.pt", "colbert")) if k not in _heads(model)]
    if missing:
        raise ValueError(f"embed: output='m3' needs BGE-M3's two heads (sparse_linear.pt and colbert_linear.pt in "
                         f"the model folder); {name} lacks {' and '.join(missing)}")
    return Layout("m3", hidden, int(_heads(model)["colbert"][0].shape[0]))


def _ragged(per_row: list[np.ndarray], empty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(per_row) + 1, np.int64)
    offsets[1:] = np.cumsum([len(r) for r in per_row])
    return offsets, (np.concatenate(per_row) if per_row else empty)


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def compute(model, seqs, layout: Layout, top_k: int | None, max_batch_tokens: int, max_batch_size: int,
            on_batch=None) -> dict[str, Any]:
    """The rows of `seqs` (token-id sequences, special tokens included, already cut to the job's max_length) for
    a non-dense layout, in the order of `seqs`: each token-budget batch (fastenc.corpus.batching) goes through
    model.encode(output=...) or model.encode_m3 as one batch. Returns the columns: 'embedding' float32 (n, width);
    'indices' / 'values' / 'vectors' as (offsets int64 (n+1,), flat values). The GEMMs run on fastenc's panel GEMM
    at every row count (prepack.pinned, as fastenc.corpus.job.embed_ids)."""
    from fastenc.layers import prepack

    with prepack.pinned("panels"):
        return _compute(model, seqs, layout, top_k, max_batch_tokens, max_batch_size, on_batch)


def _compute(model, seqs, layout: Layout, top_k: int | None, max_batch_tokens: int, max_batch_size: int,
             on_batch=None) -> dict[str, Any]:
    from fastenc.corpus.batching import token_budget_batches

    n = len(seqs)
    dense = np.empty((n, layout.width or 0), np.float32) if "embedding" in layout.columns else None
    idx: list = [None] * n
    val: list = [None] * n
    vec: list = [None] * n
    src = sparse_source(model) if layout.output == "sparse" else None
    for b in token_budget_batches(seqs, max_batch_tokens, max_batch_size):
        lists = [np.asarray(seqs[i], dtype=np.int64).tolist() for i in b.rows]
        if layout.output == "sparse" and src == "mlm":
            rows = model.encode(lists, batch_size=len(lists), output="sparse", top_k=top_k)
            for i, (ix, vs) in zip(b.rows, rows):
                idx[i], val[i] = _np(ix).astype(np.int32), _np(vs).astype(np.float32)
        elif layout.output == "multi_vector":
            mv = model.encode(lists, batch_size=len(lists), output="multi_vector")
            for j, i in enumerate(b.rows):
                vec[i] = _np(mv.of(j)).astype(np.float32)
        else:  # BGE-M3: sparse from its sparse_linear, or all three outputs
            m3 = layout.output == "m3"
            res = model.encode_m3(lists, batch_size=len(lists), dense=m3, sparse=True, colbert=m3)
            for j, i in enumerate(b.rows):
                ix, vs = res["sparse"][j]
                if top_k is not None:
                    ix, vs = ix[:top_k], vs[:top_k]
                idx[i], val[i] = _np(ix).astype(np.int32), _np(vs).astype(np.float32)
                if m3:
                    vec[i] = _np(res["colbert"].of(j)).astype(np.float32)
            if m3:
                dense[b.rows] = _np(res["dense"]).astype(np.float32)
        if on_batch is not None:
            on_batch(len(b.rows), b.tokens)
    cols: dict[str, Any] = {}
    if dense is not None:
        cols["embedding"] = dense
    if "indices" in layout.columns:
        cols["indices"] = _ragged(idx, np.empty(0, np.int32))
        cols["values"] = _ragged(val, np.empty(0, np.float32))
    if "vectors" in layout.columns:
        cols["vectors"] = _ragged(vec, np.empty((0, layout.dim), np.float32))
    return cols


def _take_ragged(col: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets, flat = col
    lens = offsets[rows + 1] - offsets[rows]
    out = np.zeros(len(rows) + 1, np.int64)
    out[1:] = np.cumsum(lens)
    if len(rows) == 0 or out[-1] == 0:
        return out, flat[:0]
    # the flat positions of the kept rows, in row order
    pos = np.repeat(offsets[rows] - out[:-1], lens) + np.arange(out[-1])
    return out, flat[pos]


def take(cols: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The columns of the rows `rows` (int positions), in that order."""
    rows = np.asarray(rows, np.int64)
    return {k: v[rows] if isinstance(v, np.ndarray) else _take_ragged(v, rows) for k, v in cols.items()}


def expand(cols: dict[str, Any], keep: np.ndarray, layout: Layout) -> dict[str, Any]:
    """Columns of the kept rows -> columns of every row of `keep`: a skipped row has no entries (a NaN embedding)."""
    n, pos = len(keep), np.flatnonzero(keep)
    out: dict[str, Any] = {}
    for k, v in cols.items():
        if isinstance(v, np.ndarray):
            full = np.full((n,) + v.shape[1:], np.nan, np.float32)
            full[pos] = v
            out[k] = full
        else:
            offsets = np.zeros(n + 1, np.int64)
            lens = np.zeros(n, np.int64)
            lens[pos] = np.diff(v[0])
            offsets[1:] = np.cumsum(lens)
            out[k] = (offsets, v[1])
    return out


def concat(parts: list[dict[str, Any]], layout: Layout) -> dict[str, Any]:
    """Columns of consecutive row ranges -> one set of columns (offsets shifted)."""
    if not parts:
        return layout.empty()
    out: dict[str, Any] = {}
    for k in parts[0]:
        if isinstance(parts[0][k], np.ndarray):
            out[k] = np.concatenate([p[k] for p in parts])
            continue
        offsets, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offsets.append(p[k][0][1:] + base)
            base += int(p[k][0][-1])
        out[k] = (np.concatenate(offsets), np.concatenate([p[k][1] for p in parts]))
    return out


def public(cols: dict[str, Any], layout: Layout):
    """Columns -> what the user gets: dense float32 (n, width); SparseRows; MultiVectorRows; m3 a dict of the three."""
    sparse = SparseRows(cols["indices"][0], cols["indices"][1], cols["values"][1]) if "indices" in cols else None
    mv = MultiVectorRows(*cols["vectors"]) if "vectors" in cols else None
    return {"dense": cols.get("embedding"), "sparse": sparse, "multi_vector": mv,
            "m3": {"dense": cols.get("embedding"), "sparse": sparse, "colbert": mv}}[layout.output]


def schema(layout: Layout, id_type: str):
    """The parquet schema of every shard of `layout`: id (string or int64, one type per output), then its columns."""
    import pyarrow as pa

    types = {"embedding": lambda: pa.list_(pa.float32(), layout.width), "indices": lambda: pa.list_(pa.int32()),
             "values": lambda: pa.list_(pa.float32()),
             "vectors": lambda: pa.list_(pa.list_(pa.float32(), layout.dim))}
    return pa.schema([("id", pa.string() if id_type == "string" else pa.int64())]
                     + [(c, types[c]()) for c in layout.columns])


def arrow_columns(cols: dict[str, Any], layout: Layout) -> list:
    """The columns as arrow arrays, in the schema's order (after id)."""
    import pyarrow as pa

    out = []
    for c in layout.columns:
        v = cols[c]
        if c == "embedding":
            flat = pa.array(np.ascontiguousarray(v, dtype=np.float32).reshape(-1), type=pa.float32())
            out.append(pa.FixedSizeListArray.from_arrays(flat, layout.width))
            continue
        offsets, flat = v
        if offsets[-1] >= 2 ** 31:
            raise ValueError(f"embed: a shard's {c} holds {int(offsets[-1])} entries, over parquet's list limit: "
                             "use a smaller window")
        if c == "vectors":
            values = pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(flat, np.float32).reshape(-1), type=pa.float32()), layout.dim)
        else:
            values = pa.array(np.ascontiguousarray(flat), type=pa.int32() if c == "indices" else pa.float32())
        out.append(pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), type=pa.int32()), values))
    return out


def from_arrow(table, layout: Layout) -> dict[str, Any]:
    """A table of `layout`'s columns (a shard, or the Ray actors' batch) -> the columns as numpy."""
    cols: dict[str, Any] = {}
    n = table.num_rows
    for c in layout.columns:
        arr = table.column(c).combine_chunks()
        if c == "embedding":
            flat = arr.flatten().to_numpy(zero_copy_only=False)
            cols[c] = np.asarray(flat, np.float32).reshape(n, layout.width)
            continue
        offsets = np.asarray(arr.offsets.to_numpy(), np.int64)
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        offsets = offsets - offsets[0]
        if c == "vectors":
            flat = np.asarray(values.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, layout.dim)
        else:
            flat = np.asarray(values.to_numpy(zero_copy_only=False), np.int32 if c == "indices" else np.float32)
        cols[c] = (offsets, flat)
    return cols


def check_rows(cols: dict[str, Any]) -> str | None:
    """None when a sparse row's indices and values have the same length; else why not."""
    if "indices" in cols and not np.array_equal(cols["indices"][0], cols["values"][0]):
        return "its indices and values differ in length"
    return None
