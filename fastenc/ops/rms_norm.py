"""fastenc.ops.rms_norm: RMSNorm over the last dim, optional fused residual add."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_eps, check_float, check_like, empty_or, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.rms_norm import rms_norm_ref

OP = "rms_norm"


def _reference(x, weight, residual, eps):
    out = rms_norm_ref(x, weight, eps, residual)
    return out if residual is not None else (out, None)


@custom_op("fastenc::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor], eps: float,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = registry.impl(OP, backend).fn(x, weight, residual, eps)
    return y, empty_or(h, x)


@_rms_norm_op.register_fake
def _(x, weight, residual, eps, backend):
    return torch.empty_like(x), (torch.empty_like(x) if residual is not None else x.new_empty(0))


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.rms_norm", "rms_norm_fwd")
_backends.cpu(OP, "rms_norm")
_backends.cuda(OP, "rms_norm_cuda")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None,
             backend: str | None = None):
    """RMSNorm of `x` (or of `x + residual`) over the last dim.

    x: (..., hidden) fp32/fp16/bf16; weight: (hidden,) same dtype; residual: like x.
    Returns y, or (y, x + residual) when `residual` is given.
    """
    check_float("x", OP, x)
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    if weight is None:
        raise TypeError(f"{OP}: weight is required")
    check_like("weight", OP, weight, x, shape=(hidden,))
    check_like("residual", OP, residual, x, shape=tuple(x.shape))
    eps = check_eps(OP, eps)
    if x.numel() == 0:
        return x.new_empty(x.shape) if residual is None else (x.new_empty(x.shape), x.new_empty(x.shape))
    x2 = rows_view(x, hidden)
    r2 = rows_view(residual, hidden) if residual is not None else None
    impl = registry.select(OP, {"x": x2, "weight": weight, "residual": r2}, backend)
    y, h = _rms_norm_op(x2, weight.contiguous(), r2, eps, impl.backend)
    y = as_shape(y, x.shape)
    return y if residual is None else (y, as_shape(h, x.shape))
