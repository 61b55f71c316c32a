"""GeGLU reference with ModernBERT's order: input, gate = x.chunk(2, -1); gelu(input) * gate."""
from __future__ import annotations

import torch

from fastenc.reference.gelu import gelu_math


def geglu_ref(x: torch.Tensor, approximate: str = "none", upcast: bool = True):
    """x: (..., 2N) -> (..., N). Math in fp32 when `upcast`."""
    t = x.float() if upcast else x
    inp, gate = t.chunk(2, dim=-1)
    return (gelu_math(inp, approximate) * gate).to(x.dtype)


def geglu_bwd_ref(grad: torch.Tensor, x: torch.Tensor, approximate: str = "none", upcast: bool = True):
    """Gradient of geglu with respect to x. grad: (..., N); x: (..., 2N) -> dx (..., 2N) in x's dtype.

    With a = x[..., :N] (input), g = x[..., N:] (gate), out = gelu(a) * g:
      d a = grad * g * gelu'(a),   d g = grad * gelu(a)      (gelu' as in gelu_bwd_ref), math in fp32 when `upcast`.
    """
    from fastenc.reference.gelu import gelu_bwd_ref

    t = x.float() if upcast else x
    gr = grad.to(t.dtype)
    inp, gate = t.chunk(2, dim=-1)
    d_inp = gelu_bwd_ref(gr * gate, inp, None, approximate, upcast=False)
    d_gate = gr * gelu_math(inp, approximate)
    return torch.cat([d_inp, d_gate], dim=-1).to(x.dtype)
