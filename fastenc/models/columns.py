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
import torch.nn.functional as F

from fastenc.layers.linear import Linear
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


def padded_positions(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows, cols) int64 (n,) of every padded position of a (batch, seq) bool mask, row-major; (None, None) if
    there is none."""
    if mask is None:
        return None, None
    rows, cols = (~mask).nonzero(as_tuple=True)
    return (rows, cols) if rows.numel() else (None, None)


def row_tokens(cu_seqlens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Packed indices (int64) of every token of `rows`, row after row."""
    cu = cu_seqlens.tolist()
    parts = [torch.arange(cu[r], cu[r + 1], device=cu_seqlens.device) for r in rows.tolist()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=cu_seqlens.device)


def _project(wqkv, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows lo:hi of the fused QKV projection of x (only those rows' GEMM for a plain Linear; a Linear carrying
    unmerged adapters or int8 weights runs whole)."""
    if type(wqkv) is Linear and wqkv.int8 is None:
        b = wqkv.bias
        return F.linear(x, wqkv.weight[lo:hi], None if b is None else b[lo:hi])
    return wqkv(x)[:, lo:hi]


def column_attention(attn, xq: torch.Tensor, q_rows: torch.Tensor, q_cols: torch.Tensor, x: torch.Tensor,
                     cu_seqlens: torch.Tensor, k_cols: torch.Tensor, window: tuple[int, int] | None = None,
                     rope: tuple[torch.Tensor, torch.Tensor] | None = None, budget: int = 1 << 25,
                     seq: int | None = None) -> torch.Tensor:
    """Attention output before Wo for queries over the real tokens of their rows, distances in padded columns.

    attn: the layer's SelfAttention (its Wqkv, with any unmerged adapter, gives q from xq and k, v from x).
    xq: (n, hidden) query inputs; q_rows, q_cols: (n,) int batch row and padded column of each query.
    x: (total, hidden) the packed tokens' inputs to the same layer; cu_seqlens int32 (batch+1,);
    k_cols: (total,) int padded column of each packed token. window: None or (left, right): query at column i
    sees keys at columns i-left..i+right. rope: (cos, sin) tables (positions, head_dim/2) indexed by column.
    Returns (n, hidden) in x's dtype; a query with no visible key gets zeros, or, with seq (the padded width) when
    the queries are every padded position of their rows, the mean of v over all seq columns of its row (its real
    keys and the padded queries themselves): transformers' eager softmax over a row masked everywhere by the finite
    additive minimum is uniform (scores + finfo.min round to one value). All rows run as one batch:
    keys padded to (rows, longest, heads, head_dim), queries to (rows, most queries of a row, ...), scores in
    query chunks of at most `budget` fp32 elements.
    """
    h, heads, d = attn.hidden, attn.heads, attn.head_dim
    n, dev = xq.shape[0], x.device
    out = torch.zeros(n, h, dtype=x.dtype, device=dev)
    if n == 0:
        return out
    rows, slot = torch.unique(q_rows.long(), return_inverse=True)  # slot: each query's row among `rows`
    starts = cu_seqlens[:-1].long()[rows]
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()[rows]
    nr, lk = rows.numel(), max(int(lens.max()), 1)
    ar = torch.arange(lk, device=dev)
    kvalid = ar[None, :] < lens[:, None]  # (rows, lk)
    kidx = (starts[:, None] + ar[None, :])[kvalid]  # packed index of every key, row after row
    kv = _project(attn.Wqkv, x[kidx], h, 3 * h).reshape(-1, 2, heads, d)
    k, v = kv[:, 0], kv[:, 1]
    cols = torch.zeros(nr, lk, dtype=torch.long, device=dev)
    cols[kvalid] = k_cols[kidx].long()
    if rope is not None:
        k = rope_ref(k, k, rope[0], rope[1], cols[kvalid])[0]
    kp = torch.zeros(nr, lk, heads, d, dtype=torch.float32, device=dev)
    vp = torch.zeros_like(kp)
    kp[kvalid], vp[kvalid] = k.float(), v.float()
    q = _project(attn.Wqkv, xq, 0, h).reshape(n, heads, d)
    if rope is not None:
        q = rope_ref(q, q, rope[0], rope[1], q_cols)[0]
    # each query's place in its row's query list: order queries by row, rank within the row
    order = torch.argsort(slot, stable=True)
    counts = torch.bincount(slot, minlength=nr)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(slot)
    rank[order] = torch.arange(n, device=dev) - first[slot[order]]
    lq = int(counts.max())
    qp = torch.zeros(nr, lq, heads, d, dtype=torch.float32, device=dev)
    qp[slot, rank] = q.float()
    qc = torch.zeros(nr, lq, dtype=torch.long, device=dev)
    qc[slot, rank] = q_cols.long()
    kt = kp.permute(0, 2, 3, 1)  # (rows, heads, d, lk)
    vt = vp.permute(0, 2, 1, 3)  # (rows, heads, lk, d)
    op = torch.empty(nr, lq, heads, d, dtype=torch.float32, device=dev)
    step = max(1, budget // (nr * heads * lk))
    scale = 1.0 / math.sqrt(d)
    blind = torch.zeros(nr, lq, dtype=torch.bool, device=dev)  # queries that see no key
    for c in range(0, lq, step):
        s = torch.matmul(qp[:, c:c + step].permute(0, 2, 1, 3), kt) * scale  # (rows, heads, cq, lk)
        seen = kvalid[:, None, :].expand(nr, s.shape[2], lk)
        if window is not None:
            dist = qc[:, c:c + step, None] - cols[:, None, :]  # query column - key column
            seen = seen & (dist <= window[0]) & (-dist <= window[1])
        s = s.masked_fill(~seen[:, None], float("-inf"))
        blind[:, c:c + step] = ~seen.any(-1)
        p = torch.softmax(s, dim=-1).masked_fill(blind[:, None, c:c + step, None], 0.0)  # no visible key: zeros
        op[:, c:c + step] = torch.matmul(p, vt).permute(0, 2, 1, 3)
    if seq is not None and bool(blind.any()):  # uniform weights over the row's seq columns
        vq = _project(attn.Wqkv, xq, 2 * h, 3 * h).float().reshape(n, heads, d)
        mean = vp.sum(1).index_add(0, slot, vq) / seq  # (rows, heads, d)
        op = torch.where(blind[:, :, None, None], mean[:, None], op)
    out[:] = op[slot, rank].reshape(n, h).to(x.dtype)
    return out
