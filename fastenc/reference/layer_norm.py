"""LayerNorm reference in fp32: y = (x - mean) / sqrt(var + eps) * w + b, var the biased variance."""
from __future__ import annotations

import torch


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
                   residual: torch.Tensor | None = None, upcast: bool = True, input_bias: torch.Tensor | None = None):
    """x, residual: (..., hidden); weight, bias, input_bias: (hidden,). Math in fp32 when `upcast`, else in x's dtype.

    h = x (+ input_bias) (+ residual), rounded once to x's dtype when anything is added (as a pre-norm block
    stores it) and normalized from the rounded value. Returns y (x's dtype), or (y, h) when `residual` is given.
    """
    dtype = x.dtype
    h = x
    if input_bias is not None or residual is not None:
        s = x.float() if upcast else x
        if input_bias is not None:
            s = s + input_bias.to(s.dtype)
        if residual is not None:
            s = s + residual.to(s.dtype)
        h = s.to(dtype)
    t = h.float() if upcast else h
    mean = t.mean(-1, keepdim=True)
    var = (t - mean).pow(2).mean(-1, keepdim=True)
    y = (t - mean) * torch.rsqrt(var + eps) * weight.to(t.dtype)
    if bias is not None:
        y = y + bias.to(t.dtype)
    y = y.to(dtype)
    return y if residual is None else (y, h)
