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


def check_positions(positions: torch.Tensor, table_rows: int) -> None:
    """Raise ValueError unless every position is in [0, table_rows). Reads the positions on the host: for CPU
    tensors (free) or where a host read is wanted; GPU kernels check positions where they read them instead."""
    if positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= table_rows:
        raise ValueError(f"rope: positions (from position_ids or cu_seqlens) must be in [0, {table_rows}) (the cos/sin "
                         f"table), got values in [{lo}, {hi}]")


def rope_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
             upcast: bool = True, inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (tokens, heads_q, D); k: (tokens, heads_k, D); cos/sin: (P, R/2); positions: (tokens,) int.

    Returns rotated (q, k) in their dtypes; math in fp32 when `upcast`. `inverse` rotates by -angle (sin -> -sin):
    the rotation is orthogonal, so that is also the backward (d q = R^T d q_rot). A position outside [0, P) raises
    on CPU; on other devices it is clamped for the gather and that token's outputs are NaN (no host sync).
    """
    half = cos.shape[-1]
    rows = cos.shape[0]
    if positions.device.type == "cpu":
        check_positions(positions, rows)
    valid = (positions >= 0) & (positions < rows)
    idx = positions.long().clamp(0, max(rows - 1, 0))
    c = cos[idx][:, None, :]
    s = sin[idx][:, None, :]
    if inverse:
        s = -s

    def rot(x):
        t = x.float() if upcast else x
        cc, ss = c.to(t.dtype), s.to(t.dtype)
        x1, x2, rest = t[..., :half], t[..., half:2 * half], t[..., 2 * half:]
        out = torch.cat([x1 * cc - x2 * ss, x2 * cc + x1 * ss, rest], dim=-1)
        if positions.device.type != "cpu":
            out = torch.where(valid[:, None, None], out, float("nan"))
        return out.to(x.dtype)

    return rot(q), rot(k)


def rope_bwd_ref(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, upcast: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of rope_ref with respect to q and k: the inverse rotation of the output gradients (transpose of
    the orthogonal rotation), dims past R passed through. Shapes and dtypes as rope_ref; cos/sin get none."""
    return rope_ref(grad_q, grad_k, cos, sin, positions, upcast=upcast, inverse=True)
