"""Linear layer holding plain `weight` (out, in) and `bias` (out,) tensors: one GEMM through torch (MKL/cuBLAS).

Kept deliberately plain so adapters (LoRA) can be merged into `weight` in place, and so the bias can be left
out of the GEMM when the next op fuses it (`forward(x, with_bias=False)` then e.g. ops.gelu(y, bias)).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x @ weight.T (+ bias). x: (..., in_features) -> (..., out_features), any float dtype of the weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False)
                     if bias else None)

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias if with_bias else None)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
