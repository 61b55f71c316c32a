"""Linear layer holding plain `weight` (out, in) and `bias` (out,) tensors: one GEMM through torch (MKL/cuBLAS).

Kept deliberately plain so adapters (LoRA) can be merged into `weight` in place, and so the bias can be left
out of the GEMM when the next op fuses it (`forward(x, with_bias=False)` then e.g. ops.gelu(y, bias)).
On CPU the output comes from fastenc's buffer cache (fastenc.extension.buffer_empty) once the extension's cpu half
is loaded and the registry allows the cpu backend for the call (not under use_backend("reference")), so a model's
layers reuse the same memory instead of faulting in fresh pages for every GEMM output. That reuse is an inference
form: when autograd records the call (grad mode on and x, weight or bias requiring grad) the output is a new tensor.
The parameters require grad, as torch.nn.Linear's do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import extension, registry
from fastenc.ops._common import needs_grad


class Linear(nn.Module):
    """y = x @ weight.T (+ bias). x: (..., in_features) -> (..., out_features), any float dtype of the weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        bias = self.bias if with_bias else None
        w = self.weight
        if (x.device.type == "cpu" and x.dim() == 2 and x.dtype == w.dtype and w.device.type == "cpu"
                and registry.backend_allowed("cpu") and not needs_grad(x, w, bias)):
            out = extension.buffer_empty((x.shape[0], self.out_features), x)
            if out is not None:
                return torch.mm(x, w.t(), out=out) if bias is None else torch.addmm(bias, x, w.t(), out=out)
        return F.linear(x, w, bias)

    def output_bias(self) -> torch.Tensor | None:
        """The bias forward() adds (a caller that runs forward(x, with_bias=False) fuses this one elsewhere)."""
        return self.bias

    def accumulate_(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out += x @ weight.T (no bias), in place: one GEMM with beta = 1, so a residual sum needs no pass of its
        own and the output buffer is not zeroed first. x: (tokens, in); out: (tokens, out_features)."""
        if out.dtype == x.dtype == self.weight.dtype and out.device == x.device:
            return out.addmm_(x, self.weight.t())
        return out.add_(F.linear(x, self.weight))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
