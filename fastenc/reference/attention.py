"""Bidirectional (non-causal) attention reference in fp32, materializing scores: the oracle for every kernel.

softmax(q k^T * scale + mask) v per head, where the mask removes keys outside the query's own sequence,
padded keys, and (with a window (left, right)) keys j outside i-left <= j <= i+right. With a distance bias
(`bias`: the per-distance lookup (heads, 2L - 1) of fastenc/reference/attention_bias.py), scores(i, j) +=
bias[h, i - j + L - 1] before the mask; with per-token `positions` the distance is positions[i] - positions[j];
with DeBERTa's disentangled terms (`c2p`, `p2c` and the slot lookup `slot`, fastenc/reference/attention_relative.py)
scores(i, j) += c2p[i, h, slot(i, j)] + p2c[j, h, slot(i, j)].
"""
from __future__ import annotations

import torch

from fastenc.reference.attention_bias import bias_matrix
from fastenc.reference.attention_dropout import padded_keep_scale, sequence_keep_scale
from fastenc.reference.attention_relative import relative_scores


def _band(sq: int, sk: int, left: int, right: int, device) -> torch.Tensor:
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    # A side at least as long as the sequence bounds nothing (and i + 2**63 - 1 would overflow int64).
    if 0 <= left < sq:
        ok &= j >= i - left
    if 0 <= right < sk:
        ok &= j <= i + right
    return ok


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                  window: tuple[int, int] = (-1, -1), scale: float | None = None, upcast: bool = True,
                  dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
                  bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                  c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                  slot: torch.Tensor | None = None) -> torch.Tensor:
    """Padded layout. q, k, v: (batch, seq, heads, head_dim); key_padding_mask: (batch, seq) bool, True = real.

    window (left, right), -1 = unbounded. Query rows at padded positions (and rows with no visible key)
    are zero. NaN/Inf in a query, or in a key or value the row can see, propagates as in torch's SDPA; padded
    keys are never read; a NaN value of a key of the row's own sequence outside its window still reaches it
    through 0 * NaN (as in SDPA). Math in fp32 when `upcast`, else in q's dtype. Returns q's dtype.
    dropout_p > 0: the probabilities are multiplied by the keep-mask / (1-p) of (seed, offset) with the counter
    layout of fastenc/reference/attention_dropout.py.
    bias: (heads, 2L - 1) per-distance lookup (L >= seq), indexed by padded positions i - j; added to the scaled
    scores in the math dtype. positions: (batch, seq) ints in [0, L) replacing the padded index (None: the padded
    index). c2p, p2c: (batch, seq, heads, slots) with `slot` (2L - 1,) the slot lookup: the disentangled terms.
    """
    b, s, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    qt, kt, vt = (t.float() if upcast else t for t in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", qt * scale, kt)
    if positions is not None or c2p is not None or p2c is not None:
        scores = scores + torch.stack([relative_scores(
            s, bias, None if positions is None else positions[i], None if c2p is None else c2p[i],
            None if p2c is None else p2c[i], slot, scores.dtype, q.device) for i in range(b)])
    elif bias is not None:
        scores = scores + bias_matrix(bias, s, k.shape[1]).to(scores.dtype)[None]
    ok = _band(s, k.shape[1], window[0], window[1], q.device)[None, None]
    if key_padding_mask is not None:
        ok = ok & key_padding_mask[:, None, None, :]
        vt = vt.masked_fill(~key_padding_mask[:, :, None, None], 0.0)  # padded keys: never read
    scores = scores.masked_fill(~ok, float("-inf"))
    # A row with no visible key gives 0 (its softmax is 0/0); only those rows are zeroed, so NaN from the inputs
    # is never hidden.
    p = torch.softmax(scores, dim=-1).masked_fill(~ok.any(-1, keepdim=True), 0.0)
    if dropout_p > 0:
        p = p * padded_keep_scale(seed, offset, dropout_p, h, b, s, key_padding_mask, q.device, p.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vt)
    if key_padding_mask is not None:
        out = out.masked_fill(~key_padding_mask[:, :, None, None], 0.0)
    return out.to(q.dtype)


def attention_varlen_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                         window: tuple[int, int] = (-1, -1), scale: float | None = None,
                         upcast: bool = True, dropout_p: float = 0.0, seed: int = 0,
                         offset: int = 0, bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                         c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                         slot: torch.Tensor | None = None) -> torch.Tensor:
    """Packed layout. q, k, v: (total_tokens, heads, head_dim); cu_seqlens: int32 (batch+1,). dropout_p, seed,
    offset: as attention_ref (counters of the packed layout). bias: (heads, 2L - 1) lookup, L >= the longest
    sequence; distances are positions within each sequence, or positions[i] - positions[j] with `positions`
    (total_tokens,) ints in [0, L). c2p, p2c: (total_tokens, heads, slots) with `slot` (2L - 1,): DeBERTa's
    disentangled terms."""
    out = torch.zeros_like(q)
    cu = cu_seqlens.tolist()
    for a, e in zip(cu[:-1], cu[1:]):
        if e > a:
            rel = [None if t is None else t[a:e] for t in (positions, c2p, p2c)]
            out[a:e] = _sequence(q[a:e], k[a:e], v[a:e], a, window, scale, upcast, dropout_p, seed, offset, bias,
                                 *rel, slot)
    return out


def _sequence(q, k, v, start, window, scale, upcast, dropout_p, seed, offset, bias=None, positions=None, c2p=None,
              p2c=None, slot=None):
    """One packed sequence (s, heads, head_dim) starting at token `start`."""
    s, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    rel = [None if t is None else t[None] for t in (positions, c2p, p2c)]
    if dropout_p <= 0:
        return attention_ref(q[None], k[None], v[None], None, window, scale, upcast, bias=bias, positions=rel[0],
                             c2p=rel[1], p2c=rel[2], slot=slot)[0]
    qt, kt, vt = (t.float() if upcast else t for t in (q, k, v))
    scores = torch.einsum("qhd,khd->hqk", qt * scale, kt)
    extra = relative_scores(s, bias, positions, c2p, p2c, slot, scores.dtype, q.device)
    if extra is not None:
        scores = scores + extra
    ok = _band(s, s, window[0], window[1], q.device)[None]
    p = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1).masked_fill(~ok.any(-1, keepdim=True), 0.0)
    p = p * sequence_keep_scale(seed, offset, dropout_p, h, start, s, q.device, p.dtype)
    return torch.einsum("hqk,khd->qhd", p, vt).to(q.dtype)
