"""GELU reference: exact 0.5*x*(1+erf(x/sqrt 2)) or tanh form 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715x^3)))."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gelu_ref(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none", upcast: bool = True):
    """x: (..., N); bias: (N,) added before the activation. Math in fp32 when `upcast`."""
    t = x.float() if upcast else x
    if bias is not None:
        t = t + bias.to(t.dtype)
    return F.gelu(t, approximate=approximate).to(x.dtype)
