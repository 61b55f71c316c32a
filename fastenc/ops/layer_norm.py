"""fastenc.ops.layer_norm: LayerNorm over the last dim, optional bias, optional fused residual add."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_eps, check_float, check_like, empty_or, rows_view
from fastenc.reference.layer_norm import layer_norm_ref

OP = "layer_norm"


def _reference(x, weight, bias, residual, eps):
    """x, residual: (rows, hidden) contiguous -> (y, x + residual or None)."""
    out = layer_norm_ref(x, weight, bias, eps, residual)
    return out if residual is not None else (out, None)


@torch.library.custom_op("fastenc::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], eps: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = registry.impls(OP)[backend].fn(x, weight, bias, residual, eps)
    return y, empty_or(h, x)


@_layer_norm_op.register_fake
def _(x, weight, bias, residual, eps, backend):
    return torch.empty_like(x), (torch.empty_like(x) if residual is not None else x.new_empty(0))


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.layer_norm", "layer_norm_fwd")
_backends.cpu(OP, "layer_norm")
_backends.cuda(OP, "layer_norm_cuda")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
               residual: torch.Tensor | None = None, backend: str | None = None):
    """LayerNorm of `x` (or of `x + residual`) over the last dim.

    x: (..., hidden) fp32/fp16/bf16; weight, bias: (hidden,) same dtype as x; residual: like x.
    Returns y (like x), or (y, x + residual) when `residual` is given (the pre-norm residual stream).
    """
    check_float("x", OP, x)
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    if weight is None:
        raise TypeError(f"{OP}: weight is required")
    check_like("weight", OP, weight, x, shape=(hidden,))
    check_like("bias", OP, bias, x, shape=(hidden,))
    check_like("residual", OP, residual, x, shape=tuple(x.shape))
    eps = check_eps(OP, eps)
    if x.numel() == 0:
        return x.new_empty(x.shape) if residual is None else (x.new_empty(x.shape), x.new_empty(x.shape))
    x2 = rows_view(x, hidden)
    r2 = rows_view(residual, hidden) if residual is not None else None
    impl = registry.select(OP, {"x": x2, "weight": weight, "bias": bias, "residual": r2}, backend)
    y, h = _layer_norm_op(x2, weight.contiguous(), None if bias is None else bias.contiguous(), r2, eps,
                          impl.backend)
    y = y.view(x.shape)
    return y if residual is None else (y, h.view(x.shape))
