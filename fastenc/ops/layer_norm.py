"""fastenc.ops.layer_norm: LayerNorm over the last dim, optional bias, optional fused residual add, optional fused
bias of the preceding linear (`input_bias`), optionally without writing x + residual back (post-norm blocks)."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_eps, check_float, check_like, empty_or, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.layer_norm import layer_norm_ref

OP = "layer_norm"


def _reference(x, weight, bias, residual, input_bias, eps, store_residual):
    """x, residual: (rows, hidden) contiguous -> (y, x + input_bias + residual or None)."""
    out = layer_norm_ref(x, weight, bias, eps, residual, input_bias=input_bias)
    y, h = out if residual is not None else (out, None)
    return y, h if store_residual else None


def _pre_added(fn):
    """Backends whose kernel has no input bias: x + input_bias is formed first (one extra pass, same result
    up to the rounding of that sum in x's dtype)."""
    def call(x, weight, bias, residual, input_bias, eps, store_residual):
        if input_bias is not None:
            x = x + input_bias
        y, h = fn(x, weight, bias, residual, eps)
        return y, h if store_residual else None
    call.__name__ = getattr(fn, "__name__", "norm")
    return call


@custom_op("fastenc::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], input_bias: Optional[torch.Tensor], eps: float,
                   store_residual: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = registry.impl(OP, backend).fn(x, weight, bias, residual, input_bias, eps, store_residual)
    return y, empty_or(h, x)


@_layer_norm_op.register_fake
def _(x, weight, bias, residual, input_bias, eps, store_residual, backend):
    keep = residual is not None and store_residual
    return torch.empty_like(x), (torch.empty_like(x) if keep else x.new_empty(0))


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.layer_norm", "layer_norm_fwd", wrap=_pre_added,
                 limits="CUDA; CPU tensors under TRITON_INTERPRET=1; input_bias added before the kernel")
_backends.cpu(OP, "layer_norm", limits="fp32 math; input_bias fused")
_backends.cuda(OP, "layer_norm_cuda", wrap=_pre_added, limits="input_bias added before the kernel")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
               residual: torch.Tensor | None = None, backend: str | None = None, *,
               input_bias: torch.Tensor | None = None, return_residual: bool = True):
    """LayerNorm of h = x (+ input_bias) (+ residual) over the last dim.

    x: (..., hidden) fp32/fp16/bf16; weight, bias, input_bias: (hidden,) same dtype as x; residual: like x.
    input_bias: the bias of the linear that produced x, fused here (that linear runs without it).
    Returns y (like x), or (y, h) when `residual` is given (the pre-norm residual stream);
    return_residual=False returns y alone and never writes h (post-norm blocks, BERT).
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
    check_like("input_bias", OP, input_bias, x, shape=(hidden,))
    if not isinstance(return_residual, bool):
        raise TypeError(f"{OP}: return_residual must be a bool, got {type(return_residual).__name__}")
    eps = check_eps(OP, eps)
    keep = residual is not None and return_residual
    if x.numel() == 0:
        return (x.new_empty(x.shape), x.new_empty(x.shape)) if keep else x.new_empty(x.shape)
    x2 = rows_view(x, hidden)
    r2 = rows_view(residual, hidden) if residual is not None else None
    ib = None if input_bias is None else input_bias.contiguous()
    impl = registry.select(OP, {"x": x2, "weight": weight, "bias": bias, "residual": r2}, backend)
    y, h = _layer_norm_op(x2, weight.contiguous(), None if bias is None else bias.contiguous(), r2, ib, eps,
                          keep, impl.backend)
    y = as_shape(y, x.shape)
    return (y, as_shape(h, x.shape)) if keep else y
