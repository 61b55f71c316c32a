"""Unmerged LoRA linear reference: y = x W^T + b + scale * (x A^T) B^T (Hu et al. 2021, "LoRA")."""
from __future__ import annotations

import torch


def lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                    lora_b: torch.Tensor, scale: float, upcast: bool = True) -> torch.Tensor:
    """x: (..., in); weight: (out, in); bias: (out,) or None; lora_a: (r, in); lora_b: (out, r).

    upcast=True: all math in fp32 (fp64 for fp64 x), rounded once to x's dtype. upcast=False: PEFT's unmerged
    forward in x's dtype: base = x W^T + b, lora = (x A^T) B^T * scale, each rounded, then base + lora.
    Returns (..., out) in x's dtype.
    """
    if upcast:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        t = x.to(acc)
        y = t @ weight.to(acc).t()
        if bias is not None:
            y = y + bias.to(acc)
        y = y + float(scale) * ((t @ lora_a.to(acc).t()) @ lora_b.to(acc).t())
        return y.to(x.dtype)
    y = torch.nn.functional.linear(x, weight, bias)
    return y + torch.nn.functional.linear(torch.nn.functional.linear(x, lora_a), lora_b) * scale


def lora_linear_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor,
                        lora_b: torch.Tensor, scale: float, need_x: bool = True, need_weight: bool = False,
                        need_bias: bool = False, need_a: bool = True, need_b: bool = True, upcast: bool = True):
    """Gradients of y = x W^T + b + s (x A^T) B^T. dy: (tokens, out); x: (tokens, in); weight: (out, in);
    lora_a: (r, in); lora_b: (out, r). With u = x A^T (tokens, r) and v = dy B (tokens, r):
      dx = dy W + s v A,   dW = dy^T x,   db = sum over tokens of dy,   dA = s v^T x,   dB = s dy^T u.
    Math in fp32 when `upcast` (fp64 for fp64 inputs), else in dy's dtype, each product rounded (what a
    framework's unfused backward does). Each gradient is computed only when asked for (else None); returned
    (dx, dweight, dbias, dA, dB) in the dtypes of x, weight, weight, lora_a, lora_b.
    """
    acc = (torch.float64 if dy.dtype == torch.float64 else torch.float32) if upcast else dy.dtype
    g, t = dy.to(acc), x.to(acc)
    a, b = lora_a.to(acc), lora_b.to(acc)
    s = float(scale)
    v = g @ b if (need_x or need_a) else None
    dx = (g @ weight.to(acc) + s * (v @ a)).to(x.dtype) if need_x else None
    dw = (g.t() @ t).to(weight.dtype) if need_weight else None
    db = g.sum(0).to(weight.dtype) if need_bias else None
    da = (s * (v.t() @ t)).to(lora_a.dtype) if need_a else None
    dbb = (s * (g.t() @ (t @ a.t()))).to(lora_b.dtype) if need_b else None
    return dx, dw, db, da, dbb
