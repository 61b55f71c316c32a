"""RMSNorm reference in fp32: y = x / sqrt(mean(x^2) + eps) * w."""
from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6,
                 residual: torch.Tensor | None = None, upcast: bool = True):
    """x, residual: (..., hidden); weight: (hidden,) or None (no scale: plain normalization).

    Returns y, or (y, x + residual) with a residual (the sum rounded once to x's dtype)."""
    dtype = x.dtype
    h = x if residual is None else (x.float() + residual.float()).to(dtype) if upcast else x + residual
    t = h.float() if upcast else h
    y = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(t.dtype)
    y = y.to(dtype)
    return y if residual is None else (y, h)
