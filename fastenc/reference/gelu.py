"""GELU reference: exact 0.5*x*(1+erf(x/sqrt 2)), tanh form 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715x^3))), or quick
GELU x*sigmoid(1.702x) (CLIP's quick_gelu, Hendrycks & Gimpel 2016's sigmoid approximation)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


QUICK_K = 1.702  # quick GELU: x * sigmoid(1.702 x)


def gelu_math(t: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(t) with gelu(+inf) = +inf: torch's vectorized fp32 erf form gives NaN there on some CPUs (AVX-512
    on AMD EPYC), its scalar and fp64 forms +inf. approximate 'quick': t * sigmoid(1.702 t), as transformers'
    QuickGELUActivation (NaN at -inf, +inf at +inf)."""
    if approximate == "quick":
        return t * torch.sigmoid(QUICK_K * t)
    y = F.gelu(t, approximate=approximate)
    return torch.where(t == math.inf, t, y) if approximate == "none" else y


def gelu_ref(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none", upcast: bool = True):
    """x: (..., N); bias: (N,) added before the activation. Math in fp32 when `upcast`."""
    t = x.float() if upcast else x
    if bias is not None:
        t = t + bias.to(t.dtype)
    return gelu_math(t, approximate).to(x.dtype)


def gelu_bwd_ref(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none",
                 upcast: bool = True) -> torch.Tensor:
    """d gelu(x + bias) / dx * grad, explicit formulas, math in fp32 when `upcast`; grad, x: (..., N) -> dx like x.

    exact: gelu'(t) = Phi(t) + t * phi(t), Phi(t) = (1 + erf(t / sqrt 2)) / 2, phi(t) = exp(-t^2 / 2) / sqrt(2 pi)
    tanh:  u = sqrt(2/pi) (t + 0.044715 t^3), gelu'(t) = (1 + tanh u) / 2 + t/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 0.044715 t^2)
    quick: s = sigmoid(1.702 t), gelu'(t) = s + 1.702 t s (1 - s)
    The bias gradient is dx summed over every dim but the last.
    """
    t = x.float() if upcast else x
    g = grad.to(t.dtype)
    if bias is not None:
        t = t + bias.to(t.dtype)
    if approximate == "quick":
        s = torch.sigmoid(QUICK_K * t)
        d = s + QUICK_K * t * s * (1.0 - s)
    elif approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        th = torch.tanh(k * (t + 0.044715 * t * t * t))
        d = 0.5 * (1.0 + th) + 0.5 * t * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * t * t)
    else:
        d = 0.5 * (1.0 + torch.erf(t * (1.0 / math.sqrt(2.0)))) + t * torch.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    return (g * d).to(x.dtype)
