"""Attention measured in padded columns, for the two cases the packed varlen kernel cannot express:

- a padded query (transformers computes one for every padded position; its poolers read column 0 even when it
  is padding): it sees the real tokens of its row but is not a key itself;
- a sliding window over a row whose real tokens are not contiguous (a mask with holes): transformers measures
  the window in padded columns, the packed layout in real tokens.

Plain PyTorch, fp32 math (the reference attention's), on a few rows only; the packed kernel serves the rest.
  scores = (q . k) * scale over the row's real keys within the window; p = softmax(scores); out = p @ v
"""
from __future__ import annotations

import math

import torch

from fastenc.reference.rope import rope_ref


def rows_with_holes(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of a (batch, seq) bool mask whose real tokens are not one contiguous run: int64 (n,), or None."""
    if mask is None:
        return None
    m = mask.to(torch.int8)
    starts = (m[:, 1:] > m[:, :-1]).sum(1) + m[:, 0]
    rows = (starts > 1).nonzero().flatten()
    return rows if rows.numel() else None


def padded_first_rows(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of a (batch, seq) bool mask whose column 0 is padding (left padding): int64 (n,), or None."""
    if mask is None or mask.shape[1] == 0:
        return None
    rows = (~mask[:, 0]).nonzero().flatten()
    return rows if rows.numel() else None


def row_tokens(cu_seqlens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Packed indices (int64) of every token of `rows`, row after row."""
    cu = cu_seqlens.tolist()
    parts = [torch.arange(cu[r], cu[r + 1], device=cu_seqlens.device) for r in rows.tolist()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=cu_seqlens.device)


def column_attention(attn, xq: torch.Tensor, q_rows: torch.Tensor, q_cols: torch.Tensor, x: torch.Tensor,
                     cu_seqlens: torch.Tensor, k_cols: torch.Tensor, window: tuple[int, int] | None = None,
                     rope: tuple[torch.Tensor, torch.Tensor] | None = None, chunk: int = 256) -> torch.Tensor:
    """Attention output before Wo for queries over the real tokens of their rows, distances in padded columns.

    attn: the layer's SelfAttention (its Wqkv, with any unmerged adapter, gives q from xq and k, v from x).
    xq: (n, hidden) query inputs; q_rows, q_cols: (n,) int batch row and padded column of each query.
    x: (total, hidden) the packed tokens' inputs to the same layer; cu_seqlens int32 (batch+1,);
    k_cols: (total,) int padded column of each packed token. window: None or (left, right): query at column i
    sees keys at columns i-left..i+right. rope: (cos, sin) tables (positions, head_dim/2) indexed by column.
    Returns (n, hidden) in x's dtype; a query with no visible key gets zeros.
    """
    h, heads, d = attn.hidden, attn.heads, attn.head_dim
    n = xq.shape[0]
    out = torch.zeros(n, h, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    scale = 1.0 / math.sqrt(d)
    q_all = attn.Wqkv(xq)[:, :h].reshape(n, heads, d)
    if rope is not None:
        q_all = rope_ref(q_all, q_all, rope[0], rope[1], q_cols)[0]
    q_all = q_all.float()
    cu = cu_seqlens.tolist()
    for r in torch.unique(q_rows).tolist():
        a, e = cu[r], cu[r + 1]
        if e == a:
            continue
        kv = attn.Wqkv(x[a:e])[:, h:].reshape(e - a, 2, heads, d)
        k, v = kv[:, 0], kv[:, 1]
        cols = k_cols[a:e].long()
        if rope is not None:
            k = rope_ref(k, k, rope[0], rope[1], cols)[0]
        k, v = k.float(), v.float()
        sel = (q_rows == r).nonzero().flatten()
        for c in range(0, sel.numel(), chunk):
            s_idx = sel[c:c + chunk]
            s = torch.einsum("qhd,khd->hqk", q_all[s_idx], k) * scale
            seen = torch.ones(s.shape[1:], dtype=torch.bool, device=s.device)
            if window is not None:
                dist = q_cols[s_idx].long()[:, None] - cols[None, :]  # query column - key column
                seen = (dist <= window[0]) & (-dist <= window[1])
            s = s.masked_fill(~seen, float("-inf"))
            p = torch.softmax(s, dim=-1).masked_fill(~seen.any(-1)[None, :, None], 0.0)  # no visible key: zeros
            o = torch.einsum("hqk,khd->qhd", p, v)
            out[s_idx] = o.reshape(-1, h).to(x.dtype)
    return out
