"""LayerNorm reference in fp32: y = (x - mean) / sqrt(var + eps) * w + b, var the biased variance."""
from __future__ import annotations

import torch


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
                   residual: torch.Tensor | None = None, upcast: bool = True):
    """x, residual: (..., hidden); weight, bias: (hidden,). Math in fp32 when `upcast`, else in x's dtype.

    Returns y (x's dtype), or (y, x + residual) when `residual` is given (the sum in x's dtype, as a
    pre-norm block stores it; it is rounded once before normalizing).
    """
    dtype = x.dtype
    h = x if residual is None else (x.float() + residual.float()).to(dtype) if upcast else x + residual
    t = h.float() if upcast else h
    mean = t.mean(-1, keepdim=True)
    var = (t - mean).pow(2).mean(-1, keepdim=True)
    y = (t - mean) * torch.rsqrt(var + eps) * weight.to(t.dtype)
    if bias is not None:
        y = y + bias.to(t.dtype)
    y = y.to(dtype)
    return y if residual is None else (y, h)
