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


def norm_stats_ref(h: torch.Tensor, eps: float, rms: bool = False):
    """Per-row statistics of the normalized input h: (rows, hidden) -> (mean, rstd), each (rows,) fp32.

    LayerNorm: mean = sum(h)/N, rstd = 1/sqrt(sum((h-mean)^2)/N + eps); RMSNorm: mean is None,
    rstd = 1/sqrt(sum(h^2)/N + eps). What a training forward saves for the backward (float64 for float64 h).
    """
    t = h if h.dtype == torch.float64 else h.float()
    if rms:
        return None, torch.rsqrt(t.pow(2).mean(-1) + eps)
    mean = t.mean(-1)
    return mean, torch.rsqrt((t - mean[:, None]).pow(2).mean(-1) + eps)


def norm_bwd_ref(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor | None,
                 rstd: torch.Tensor, dh: torch.Tensor | None = None, upcast: bool = True):
    """Backward of LayerNorm (mean given) or RMSNorm (mean None) from the saved statistics.

    dy, h, dh: (rows, hidden); weight: (hidden,) or None (RMSNorm without weight: w = 1); mean, rstd: (rows,) fp32.
    xhat = (h - mean) * rstd, g = w * dy (per row, N = hidden):
      LayerNorm: dh_total = rstd * (g - mean(g) - xhat * mean(g * xhat))
      RMSNorm:   dh_total = rstd * (g - xhat * mean(g * xhat))
      (+ dh, the gradient arriving on the stored residual stream h itself)
      dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy.
    dh_total is the gradient of x, of residual and (summed over rows) of input_bias: h = x + input_bias + residual.
    Math in fp32 when `upcast` (else in dy's dtype). Returns (dx in h's dtype, dweight, dbias) with dweight and
    dbias in weight's dtype (dy's when weight is None).
    """
    ct = torch.float32 if upcast else dy.dtype
    if dy.dtype == torch.float64:
        ct = torch.float64
    g0 = dy.to(ct)
    t = h.to(ct)
    rs = rstd.to(ct)[:, None]
    xhat = (t - mean.to(ct)[:, None]) * rs if mean is not None else t * rs
    g = g0 * weight.to(ct) if weight is not None else g0
    c1 = (g * xhat).mean(-1, keepdim=True)
    dx = (g - g.mean(-1, keepdim=True) - xhat * c1) * rs if mean is not None else (g - xhat * c1) * rs
    if dh is not None:
        dx = dx + dh.to(ct)
    wdt = weight.dtype if weight is not None else dy.dtype
    dw = (g0 * xhat).sum(0).to(wdt)
    db = g0.sum(0).to(wdt)
    return dx.to(h.dtype), dw, db
