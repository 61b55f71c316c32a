"""Distance-indexed attention bias: score(i, j) += bias(i - j, head), as a per-distance lookup every backend reads.

Two kinds, summed when both are given:
  - a bucketed relative-position table (num_buckets, heads), T5's bidirectional log bucketing exactly as
    transformers' MPNet computes it (`MPNetEncoder.relative_position_bucket` of relative_position = j - i, i.e.
    memory - context; MPNet: 32 buckets, max distance 128): bias(i - j, h) = table[bucket(j - i), h];
  - ALiBi slopes (heads,): bias(i - j, h) = -slope[h] * |i - j|.
The lookup `lut` is (heads, 2 * L - 1) with lut[h, (i - j) + L - 1] = bias(i - j, h) for a longest sequence L:
O(L) memory, built once per call, differentiable (the table's gradient is the scatter of lut's gradient over the
buckets, which torch's autograd of `distance_bias` does). Only the reference materializes (seq, seq).
"""
from __future__ import annotations

import math

import torch


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int = 32,
                             max_distance: int = 128) -> torch.Tensor:
    """T5's bidirectional bucket of relative_position = memory - context = j - i (int64, any shape) -> int64 in
    [0, num_buckets): the same operations, in the same order and precision, as transformers' MPNet."""
    ret = 0
    n = -relative_position
    num_buckets //= 2
    ret += (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


def distance_bias(max_seqlen: int, relative_bias: torch.Tensor | None = None, relative_max_distance: int = 128,
                  alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """The per-distance lookup (heads, 2 * max_seqlen - 1) in the table's / slopes' dtype (fp32, or fp64 for
    gradcheck): lut[h, d + max_seqlen - 1] = table[bucket(-d), h] - slope[h] * |d| for d = i - j.

    relative_bias: (num_buckets, heads); alibi_slopes: (heads,). At least one must be given; differentiable in
    both."""
    src = relative_bias if relative_bias is not None else alibi_slopes
    if src is None:
        raise ValueError("distance_bias: give relative_bias or alibi_slopes")
    n = max(int(max_seqlen), 1)
    d = torch.arange(-(n - 1), n, device=src.device)  # i - j
    lut = None
    if relative_bias is not None:
        bucket = relative_position_bucket(-d, relative_bias.shape[0], relative_max_distance)
        lut = relative_bias.index_select(0, bucket).t()  # (heads, 2n - 1)
    if alibi_slopes is not None:
        alibi = -alibi_slopes[:, None] * d.abs().to(alibi_slopes.dtype)[None, :]
        lut = alibi if lut is None else lut + alibi
    return lut.contiguous()


def bias_matrix(lut: torch.Tensor, sq: int, sk: int | None = None) -> torch.Tensor:
    """lut (heads, 2L - 1) -> the materialized bias (heads, sq, sk) with [h, i, j] = lut[h, i - j + L - 1]
    (the reference's oracle only; sq, sk <= L)."""
    sk = sq if sk is None else sk
    n = (lut.shape[1] + 1) // 2
    if sq > n or sk > n:
        raise ValueError(f"bias_matrix: the lookup covers sequences up to {n} tokens, got ({sq}, {sk})")
    i = torch.arange(sq, device=lut.device)[:, None]
    j = torch.arange(sk, device=lut.device)[None, :]
    return lut[:, i - j + n - 1]
