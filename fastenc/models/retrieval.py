"""Retrieval outputs of encode() beyond one pooled vector, from the packed last hidden states of one forward:
SPLADE sparse weights of a masked-LM model (Formal et al. 2021: log1p(relu(MLM logits)) max-pooled over each text's
tokens, special tokens included, through fastenc.ops.sparse_max, which never forms the (tokens, vocab) logits) and
ColBERT multi-vectors (Khattab & Zaharia 2020: one L2-normalized vector per token after an optional linear
projection, returned ragged)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

OUTPUTS = ("dense", "sparse", "multi_vector")


class MultiVectors(NamedTuple):
    """Per-token vectors of n texts, ragged: text i's vectors are vectors[offsets[i]:offsets[i + 1]].
    offsets: int64 (n+1,), from 0; vectors: fp32 (total kept tokens, dim), each row of unit L2 norm."""
    offsets: torch.Tensor
    vectors: torch.Tensor

    def of(self, i: int) -> torch.Tensor:
        """Text i's (tokens, dim) vectors."""
        return self.vectors[int(self.offsets[i]):int(self.offsets[i + 1])]


def check_output(model, output: str, top_k, projection, dimensions) -> None:
    """encode()'s output arguments, before any work; errors name the argument."""
    if output not in OUTPUTS:
        raise ValueError(f"encode: output must be one of {OUTPUTS}, got {output!r}")
    if output != "dense" and dimensions is not None:
        raise ValueError(f"encode: dimensions applies to output='dense' only, got output={output!r}")
    if output == "sparse" and not hasattr(model, "mlm_projection"):
        raise ValueError(f"encode: output='sparse' needs a masked-LM model (a *ForMaskedLM: its MLM head gives the "
                         f"vocabulary weights), got {type(model).__name__}")
    if top_k is not None:
        if output != "sparse":
            raise ValueError(f"encode: top_k applies to output='sparse' only, got output={output!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"encode: top_k must be a positive int or None, got {top_k!r}")
    if projection is not None and output != "multi_vector":
        raise ValueError(f"encode: projection applies to output='multi_vector' only, got output={output!r}")


def sparse_weights(model, x: torch.Tensor, batch) -> torch.Tensor:
    """(batch, vocab) fp32 SPLADE weights: log1p(relu(max over each sequence's real tokens of the MLM logits)).
    x: (total, hidden) packed last hidden states; the MLM transform runs on them, then the fused op with the
    decoder weight (the logits never exist on the cpu and triton backends)."""
    from fastenc import ops

    y, weight, bias = model.mlm_projection(x)
    weight = weight.to(y.dtype)
    return ops.sparse_max(y.contiguous(), batch.cu_seqlens, weight, None if bias is None else bias.to(y.dtype))


def sparse_rows(weights: torch.Tensor, top_k: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(n, vocab) weights -> per row (indices int64 (k,), values fp32 (k,)) of its non-zero entries, largest value
    first (equal values by ascending index), at most top_k of them when given. Rows dense in non-zeros (over 1/8 of
    the vocabulary in some row) are ordered by one stable sort of the whole matrix; sparse ones each sort only their
    non-zeros."""
    if weights.shape[0] == 0:
        return []
    nnz = (weights != 0).sum(1).tolist()
    if max(nnz) * 8 > weights.shape[1] and bool((weights >= 0).all()):  # (zeros then sort after every weight)
        vals, idx = torch.sort(weights, dim=1, descending=True, stable=True)
        cut = [n if top_k is None else min(n, top_k) for n in nnz]
        return [(idx[i, :c].clone(), vals[i, :c].clone()) for i, c in enumerate(cut)]
    out = []
    for row in weights:
        idx = row.nonzero().flatten()
        vals, order = torch.sort(row[idx], descending=True, stable=True)
        idx = idx[order]
        if top_k is not None:
            idx, vals = idx[:top_k], vals[:top_k]
        out.append((idx, vals))
    return out


def resolve_projection(model, projection):
    """(weight (dim, hidden), bias (dim,) or None) or None: `projection` as given (a weight tensor, a (weight,
    bias) pair or a module with .weight / .bias such as nn.Linear), else the model's `colbert_linear` if it has
    one, else a BGE-M3 folder's colbert head, else None (no projection)."""
    if projection is None:
        projection = getattr(model, "colbert_linear", None)
        if projection is None:  # a BGE-M3 folder's colbert head (fastenc.models.bge_m3.load_heads), if any
            projection = model.__dict__.get("retrieval_heads", {}).get("colbert")
        if projection is None:
            return None
    if isinstance(projection, torch.Tensor):
        weight, bias = projection, None
    elif isinstance(projection, (tuple, list)) and len(projection) == 2:
        weight, bias = projection
    elif isinstance(getattr(projection, "weight", None), torch.Tensor):
        weight, bias = projection.weight, getattr(projection, "bias", None)
    else:
        raise TypeError(f"encode: projection must be a (dim, hidden) weight tensor, a (weight, bias) pair or a "
                        f"module with .weight (nn.Linear), got {type(projection).__name__}")
    hidden = model.config.hidden_size
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden:
        raise ValueError(f"encode: projection weight must be (dim, {hidden}) (dim, the model's hidden size), got "
                         f"{tuple(getattr(weight, 'shape', ())) or type(weight).__name__}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"encode: projection bias must be ({weight.shape[0]},), got "
                         f"{tuple(getattr(bias, 'shape', ())) or type(bias).__name__}")
    return weight, bias


def token_vectors(x: torch.Tensor, batch, projection, skip_first_token: bool) -> list[torch.Tensor]:
    """Per sequence its (kept tokens, dim) fp32 unit vectors: normalize(x_t W^T + b) over its real tokens, the
    first one left out when skip_first_token. x: (total, hidden) packed; projection: (weight, bias) or None."""
    if projection is not None:
        w, b = projection
        x = F.linear(x, w.to(device=x.device, dtype=x.dtype), None if b is None else b.to(device=x.device,
                                                                                           dtype=x.dtype))
    v = F.normalize(x.float(), p=2, dim=-1)
    cu = batch.cu_seqlens.tolist()
    skip = 1 if skip_first_token else 0
    return [v[min(a + skip, e):e] for a, e in zip(cu, cu[1:])]


def restore_order(items: list, order: list[int] | None) -> list:
    """items[j] belongs to input order[j] (None: already in input order) -> the list in input order."""
    if order is None:
        return items
    out = [None] * len(items)
    for j, i in enumerate(order):
        out[i] = items[j]
    return out


def ragged(per_text: list[torch.Tensor], dim: int, device) -> MultiVectors:
    """Per-text (k_i, dim) tensors -> MultiVectors(offsets (n+1,), vectors (sum k_i, dim)), nothing padded."""
    lens = torch.tensor([t.shape[0] for t in per_text], dtype=torch.int64)
    offsets = torch.zeros(len(per_text) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lens, 0)
    vectors = torch.cat(per_text) if per_text else torch.empty(0, dim, device=device)
    return MultiVectors(offsets.to(vectors.device), vectors)
