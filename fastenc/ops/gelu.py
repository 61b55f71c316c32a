"""fastenc.ops.gelu: GELU (exact erf or tanh form) with an optional fused bias add."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_approximate, check_float, check_like, rows_view
from fastenc.reference.gelu import gelu_ref

OP = "gelu"


def _reference(x, bias, approximate):
    return gelu_ref(x, bias, approximate)


@torch.library.custom_op("fastenc::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str, backend: str) -> torch.Tensor:
    return registry.impls(OP)[backend].fn(x, bias, approximate)


@_gelu_op.register_fake
def _(x, bias, approximate, backend):
    return torch.empty_like(x)


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.gelu", "gelu_fwd")
_backends.cpu(OP, "gelu")
_backends.cuda(OP, "gelu_cuda")


def gelu(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none",
         backend: str | None = None) -> torch.Tensor:
    """gelu(x + bias). x: (..., N) fp32/fp16/bf16; bias: (N,) same dtype; approximate: 'none' | 'tanh'."""
    check_float("x", OP, x)
    approximate = check_approximate(OP, approximate)
    shape = x.shape
    if x.dim() == 0:
        x = x.reshape(1)
    n = x.shape[-1]
    check_like("bias", OP, bias, x, shape=(n,))
    if x.numel() == 0:
        return x.new_empty(shape)
    x2 = rows_view(x, n)
    impl = registry.select(OP, {"x": x2, "bias": bias}, backend)
    return _gelu_op(x2, None if bias is None else bias.contiguous(), approximate, impl.backend).view(shape)
