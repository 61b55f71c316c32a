"""Bidirectional (non-causal) attention reference in fp32, materializing scores: the oracle for every kernel.

softmax(q k^T * scale + mask) v per head, where the mask removes keys outside the query's own sequence,
padded keys, and (with a window (left, right)) keys j outside i-left <= j <= i+right.
"""
from __future__ import annotations

import torch


def _band(sq: int, sk: int, left: int, right: int, device) -> torch.Tensor:
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                  window: tuple[int, int] = (-1, -1), scale: float | None = None, upcast: bool = True) -> torch.Tensor:
    """Padded layout. q, k, v: (batch, seq, heads, head_dim); key_padding_mask: (batch, seq) bool, True = real.

    window (left, right), -1 = unbounded. Query rows at padded positions (and rows with no visible key)
    are zero. Math in fp32 when `upcast`, else in q's dtype. Returns q's dtype.
    """
    b, s, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    qt, kt, vt = (t.float() if upcast else t for t in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", qt * scale, kt)
    ok = _band(s, k.shape[1], window[0], window[1], q.device)[None, None]
    if key_padding_mask is not None:
        ok = ok & key_padding_mask[:, None, None, :]
    scores = scores.masked_fill(~ok, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no visible key gives 0, not NaN
    out = torch.einsum("bhqk,bkhd->bqhd", p, vt)
    if key_padding_mask is not None:
        out = out * key_padding_mask[:, :, None, None].to(out.dtype)
    return out.to(q.dtype)


def attention_varlen_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                         window: tuple[int, int] = (-1, -1), scale: float | None = None,
                         upcast: bool = True) -> torch.Tensor:
    """Packed layout. q, k, v: (total_tokens, heads, head_dim); cu_seqlens: int32 (batch+1,)."""
    out = torch.zeros_like(q)
    cu = cu_seqlens.tolist()
    for a, e in zip(cu[:-1], cu[1:]):
        if e > a:
            out[a:e] = attention_ref(q[None, a:e], k[None, a:e], v[None, a:e], None, window, scale, upcast)[0]
    return out
