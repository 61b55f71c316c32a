"""GeGLU reference with ModernBERT's order: input, gate = x.chunk(2, -1); gelu(input) * gate."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def geglu_ref(x: torch.Tensor, approximate: str = "none", upcast: bool = True):
    """x: (..., 2N) -> (..., N). Math in fp32 when `upcast`."""
    t = x.float() if upcast else x
    inp, gate = t.chunk(2, dim=-1)
    return (F.gelu(inp, approximate=approximate) * gate).to(x.dtype)
