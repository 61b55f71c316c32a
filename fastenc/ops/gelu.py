"""fastenc.ops.gelu: GELU (exact erf or tanh form) with an optional fused bias add, optionally into `out` (which
may be x itself: in place)."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import extension, registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_approximate, check_float, check_like, check_out, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.gelu import gelu_ref

OP = "gelu"


def _reference(x, bias, approximate):
    return gelu_ref(x, bias, approximate)


@custom_op("fastenc::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, bias, approximate)


@_gelu_op.register_fake
def _(x, bias, approximate, backend):
    return torch.empty_like(x)


@custom_op("fastenc::gelu_out", mutates_args=("out",))
def _gelu_out_op(x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str, backend: str,
                 out: torch.Tensor) -> None:
    """The same into `out` (may be x): the cpu and triton kernels write it directly, others copy once."""
    if backend == "cpu":
        extension.load().gelu_out(x, bias, approximate, out)
    elif backend == "triton":
        from fastenc.kernels.gelu import gelu_fwd
        gelu_fwd(x, bias, approximate, out=out)
    else:
        out.copy_(registry.impl(OP, backend).fn(x, bias, approximate))


@_gelu_out_op.register_fake
def _(x, bias, approximate, backend, out):
    return None


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.gelu", "gelu_fwd")
_backends.cpu(OP, "gelu")
_backends.cuda(OP, "gelu_cuda")


def gelu(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none",
         backend: str | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x + bias). x: (..., N) fp32/fp16/bf16; bias: (N,) same dtype; approximate: 'none' | 'tanh'.

    out: written and returned instead of a new tensor; x's shape and dtype, contiguous; may be x itself (in place,
    e.g. over the GEMM output the activation consumes), must not otherwise overlap x.
    """
    check_float("x", OP, x)
    approximate = check_approximate(OP, approximate)
    shape = x.shape
    if out is not None:
        check_out(OP, out, tuple(shape), x, inplace_ok=x)
        if not out.is_contiguous():
            raise ValueError(f"{OP}: out must be contiguous, got strides {tuple(out.stride())}")
    if x.dim() == 0:
        x = x.reshape(1)
    n = x.shape[-1]
    check_like("bias", OP, bias, x, shape=(n,))
    if x.numel() == 0:
        return x.new_empty(shape) if out is None else out
    x2 = rows_view(x, n)
    impl = registry.select(OP, {"x": x2, "bias": bias}, backend)
    b = None if bias is None else bias.contiguous()
    if out is None:
        return as_shape(_gelu_op(x2, b, approximate, impl.backend), shape)
    _gelu_out_op(x2, b, approximate, impl.backend, out.view(x2.shape))
    return out
