"""SwiGLU reference (Shazeer 2020, "GLU Variants Improve Transformer"): silu(gate) * up, gate first in a fused
(..., 2N) input (gate, up = x.chunk(2, -1)), as fastenc's GeGLU puts its activated half first."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _halves(x: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return x.chunk(2, dim=-1) if up is None else (x, up)


def swiglu_ref(x: torch.Tensor, up: torch.Tensor | None = None, upcast: bool = True) -> torch.Tensor:
    """x: (..., 2N) = [gate | up] with up None, or gate x (..., N) and up (..., N) -> (..., N) in x's dtype.
    silu(g) = g * sigmoid(g), as torch's F.silu; math in fp32 when `upcast`."""
    gate, u = _halves(x.float() if upcast else x, None if up is None else (up.float() if upcast else up))
    return (F.silu(gate) * u).to(x.dtype)


def swiglu_bwd_ref(grad: torch.Tensor, x: torch.Tensor, up: torch.Tensor | None = None, upcast: bool = True):
    """Gradients of swiglu. grad: (..., N). Fused x (..., 2N) -> dx (..., 2N) = [d gate | d up]; separate gate x and
    up (..., N) -> (d gate, d up). In x's dtype, math in fp32 when `upcast`.

    With s = sigmoid(gate), out = gate * s * up:
      d gate = grad * up * (s + gate * s * (1 - s)),   d up = grad * gate * s
    """
    t = x.float() if upcast else x
    gate, u = _halves(t, None if up is None else up.to(t.dtype))
    g = grad.to(t.dtype)
    s = torch.sigmoid(gate)
    d_gate = g * u * (s + gate * s * (1.0 - s))
    d_up = g * (gate * s)
    if up is None:
        return torch.cat([d_gate, d_up], dim=-1).to(x.dtype)
    return d_gate.to(x.dtype), d_up.to(x.dtype)
