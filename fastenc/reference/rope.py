"""Rotary position embedding (RoFormer), rotate-half convention as in transformers' apply_rotary_pos_emb.

For a head vector x of size D (rotary part R = 2*cos.shape[-1] <= D), with x1 = x[:R/2], x2 = x[R/2:R]:
  out[:R/2]  = x1*cos - x2*sin
  out[R/2:R] = x2*cos + x1*sin      (out[R:] = x[R:])
"""
from __future__ import annotations

import torch


def rope_cache(head_dim: int, max_positions: int, theta: float = 10000.0, device=None,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_positions, head_dim // 2): inv_freq_i = theta^(-2i/head_dim)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_cache: head_dim must be a positive even number, got {head_dim}")
    if max_positions <= 0:
        raise ValueError(f"rope_cache: max_positions must be positive, got {max_positions}")
    if not theta > 0:
        raise ValueError(f"rope_cache: theta must be > 0, got {theta}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    t = torch.arange(max_positions, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def rope_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
             upcast: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (tokens, heads_q, D); k: (tokens, heads_k, D); cos/sin: (P, R/2); positions: (tokens,) int.

    Returns rotated (q, k) in their dtypes; math in fp32 when `upcast`.
    """
    half = cos.shape[-1]
    c = cos[positions.long()][:, None, :]
    s = sin[positions.long()][:, None, :]

    def rot(x):
        t = x.float() if upcast else x
        cc, ss = c.to(t.dtype), s.to(t.dtype)
        x1, x2, rest = t[..., :half], t[..., half:2 * half], t[..., 2 * half:]
        return torch.cat([x1 * cc - x2 * ss, x2 * cc + x1 * ss, rest], dim=-1).to(x.dtype)

    return rot(q), rot(k)
