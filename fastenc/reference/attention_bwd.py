"""Attention backward reference (FlashAttention-2's formulas, Dao 2023) and the forward's log-sum-exp, materializing
scores per sequence: the oracle of every backend's backward.

With S = scale * q k^T (masked to -inf outside the sequence / window), lse_i = log sum_j exp(S_ij) and
P = exp(S - lse) (the softmax, recomputed from the saved lse), for an upstream gradient dO of out = P v:
  D_i  = rowsum(dO * O)_i        (= sum_j P_ij dP_ij)
  dP   = dO v^T
  dS   = P * (dP - D)
  dq   = scale * dS k,   dk = scale * dS^T q,   dv = P^T dO
A query row with no visible key has lse = +inf (P = 0 and every gradient through it 0), the convention the
kernels follow too.
With attention dropout (keep-mask Z regenerated from (seed, offset), fastenc/reference/attention_dropout.py),
out = (P * Z/(1-p)) v and
  dv   = (P * Z/(1-p))^T dO,   dP = (dO v^T) * Z/(1-p),   dS = P * (dP - D),   D = rowsum(dO * O) as before.
With a distance bias (S_ij += lut[h, i - j + L - 1], fastenc/reference/attention_bias.py), its gradient is
  dlut[h, d + L - 1] = sum over the pairs (i, j) with i - j = d of dS_ij      (per head, over every sequence)
(d = positions[i] - positions[j] with per-token positions). With DeBERTa's disentangled terms
(fastenc/reference/attention_relative.py): dc2p[i, h, s] = sum_{j: slot(i, j) = s} dS_ij,
dp2c[j, h, s] = sum_{i: slot(i, j) = s} dS_ij.
"""
from __future__ import annotations

import torch

from fastenc.reference.attention import _band
from fastenc.reference.attention_dropout import sequence_keep_scale
from fastenc.reference.attention_relative import relative_grads, relative_scores


def _math_dtype(t: torch.Tensor, upcast: bool) -> torch.dtype:
    if t.dtype == torch.float64:
        return torch.float64
    return torch.float32 if upcast else t.dtype


def _sequences(cu_seqlens: torch.Tensor):
    cu = cu_seqlens.tolist()
    return [(a, e) for a, e in zip(cu[:-1], cu[1:]) if e > a]


def _scores(q, k, window, scale, bias=None, positions=None, c2p=None, p2c=None, slot=None):
    """q, k: (s, heads, d) -> masked scores (heads, s, s) in q's dtype (plus the relative terms: the distance bias
    lookup `bias`, DeBERTa's c2p / p2c with the slot lookup `slot`, at `positions`)."""
    s = q.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    extra = relative_scores(s, bias, positions, c2p, p2c, slot, scores.dtype, q.device)
    if extra is not None:
        scores = scores + extra
    ok = _band(s, s, window[0], window[1], q.device)[None]
    return scores.masked_fill(~ok, float("-inf"))


def attention_lse_varlen_ref(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor,
                             window: tuple[int, int] = (-1, -1), scale: float | None = None,
                             bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                             c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                             slot: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row log-sum-exp of the scaled, masked scores (plus the relative terms, as attention_varlen_ref) (natural
    log).

    q, k: (total_tokens, heads, head_dim); cu_seqlens int32 (batch+1,). Returns (heads, total_tokens) fp32
    (fp64 for fp64 inputs); +inf for a row that sees no key.
    """
    total, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    dt = _math_dtype(q, True)
    lse = torch.full((h, total), float("inf"), dtype=dt, device=q.device)
    for a, e in _sequences(cu_seqlens):
        rel = [None if t is None else t[a:e] for t in (positions, c2p, p2c)]
        row = torch.logsumexp(_scores(q[a:e].to(dt), k[a:e].to(dt), window, scale, bias, *rel, slot), dim=-1)
        lse[:, a:e] = torch.where(torch.isfinite(row), row, torch.full_like(row, float("inf")))
    return lse


def attention_bwd_varlen_ref(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
                             window: tuple[int, int] = (-1, -1), scale: float | None = None,
                             upcast: bool = True, dropout_p: float = 0.0, seed: int = 0,
                             offset: int = 0, bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                             c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                             slot: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Gradients of the packed-layout attention by the explicit formulas above.

    grad, q, k, v, out: (total_tokens, heads, head_dim); lse: (heads, total_tokens) as saved by the forward;
    cu_seqlens int32 (batch+1,); window (left, right), -1 = unbounded. Math in fp32 when `upcast` (fp64 for fp64
    inputs), else in q's dtype. dropout_p, seed, offset: the forward's. Returns dq, dk, dv in q's dtype; with
    `bias` (the forward's (heads, 2L - 1) distance lookup) also dbias, in the math dtype (fp32, fp64 for fp64).
    With any relative term (bias, positions, c2p, p2c, slot as attention_varlen_ref) it returns
    (dq, dk, dv, dbias, dc2p, dp2c), each of the last three None where its input is None; dc2p, dp2c in c2p's /
    p2c's dtype.
    """
    total, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    dt = _math_dtype(q, upcast)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    dbias = None if bias is None else torch.zeros(bias.shape, dtype=dt, device=q.device)
    dc2p = None if c2p is None else torch.zeros(c2p.shape, dtype=dt, device=q.device)
    dp2c = None if p2c is None else torch.zeros(p2c.shape, dtype=dt, device=q.device)
    relative = any(t is not None for t in (positions, c2p, p2c, slot))
    for a, e in _sequences(cu_seqlens):
        qs, ks, vs, gs, os_ = (t[a:e].to(dt) for t in (q, k, v, grad, out))
        rel = [None if t is None else t[a:e] for t in (positions, c2p, p2c)]
        p = torch.exp(_scores(qs, ks, window, scale, bias, *rel, slot) - lse[:, a:e, None].to(dt))  # exp(-inf) = 0
        delta = (gs * os_).sum(-1).transpose(0, 1)                            # D: (h, s)
        dp = torch.einsum("qhd,khd->hqk", gs, vs)
        pd = p
        if dropout_p > 0:
            zs = sequence_keep_scale(seed, offset, dropout_p, h, a, e - a, q.device, dt)  # Z / (1-p)
            pd, dp = p * zs, dp * zs
        ds = p * (dp - delta[:, :, None])
        dq[a:e] = (torch.einsum("hqk,khd->qhd", ds, ks) * scale).to(q.dtype)
        dk[a:e] = (torch.einsum("hqk,qhd->khd", ds, qs) * scale).to(k.dtype)
        dv[a:e] = torch.einsum("hqk,qhd->khd", pd, gs).to(v.dtype)
        if bias is not None or relative:
            db, dc, dp = relative_grads(ds, bias, rel[0], None if c2p is None else (e - a, *c2p.shape[1:]),
                                        None if p2c is None else (e - a, *p2c.shape[1:]), slot)
            if db is not None:
                dbias += db
            if dc is not None:
                dc2p[a:e] = dc
            if dp is not None:
                dp2c[a:e] = dp
    if not relative:
        return (dq, dk, dv) if bias is None else (dq, dk, dv, dbias)
    return (dq, dk, dv, dbias, None if dc2p is None else dc2p.to(c2p.dtype),
            None if dp2c is None else dp2c.to(p2c.dtype))
