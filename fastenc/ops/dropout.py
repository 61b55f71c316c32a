"""fastenc.ops.dropout: inverted dropout of x (+ the fused bias of the linear that produced it) with a counter-based
keep-mask (fastenc/reference/dropout.py): out = (x + bias) * Z / (1 - p). Nothing is saved for the backward but
(seed, offset): it regenerates Z (dx = grad * Z / (1 - p), dbias = dx summed over rows). One hash per element in
place of torch's bernoulli_ draw, its mask tensor and the mask multiplies of the forward and the backward.

Backend contract: fn(x, bias, dropout_p, seed, offset) -> out; backward fn(grad, dropout_p, seed, offset) -> dx;
x, grad: (rows, n) contiguous; bias: (n,) or None; 0 < dropout_p < 1.
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_float, check_like, draw_seed_offset, needs_grad, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.dropout import dropout_bwd_ref, dropout_ref

OP = "dropout"
OP_BWD = "dropout_bwd"


@custom_op("fastenc::dropout", mutates_args=())
def _dropout_op(x: torch.Tensor, bias: Optional[torch.Tensor], dropout_p: float, seed: int, offset: int,
                backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, bias, dropout_p, seed, offset)


@_dropout_op.register_fake
def _(x, bias, dropout_p, seed, offset, backend):
    return torch.empty_like(x)


@custom_op("fastenc::dropout_bwd", mutates_args=())
def _dropout_bwd_op(grad: torch.Tensor, dropout_p: float, seed: int, offset: int, backend: str) -> torch.Tensor:
    return registry.impl(OP_BWD, backend).fn(grad, dropout_p, seed, offset)


@_dropout_bwd_op.register_fake
def _(grad, dropout_p, seed, offset, backend):
    return torch.empty_like(grad)


def _reference(x, bias, dropout_p, seed, offset):
    return dropout_ref(x, dropout_p, seed, offset, bias)


_FP32 = (torch.float32,)
_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.dropout", "dropout_fwd")
_backends.implement(OP, "cpu", "dropout", dtypes=_FP32, limits="fp32")
_backends.implement(OP_BWD, "reference", dropout_bwd_ref)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.dropout", "dropout_bwd")
_backends.implement(OP_BWD, "cpu", "dropout_bwd", dtypes=_FP32, limits="fp32")


def _setup_context(ctx, inputs, output):
    x, bias, dropout_p, seed, offset, backend = inputs
    ctx.args = (dropout_p, seed, offset, backend)


def _backward(ctx, grad):
    need_x, need_bias = ctx.needs_input_grad[:2]
    if not (need_x or need_bias):
        return (None,) * 6
    dropout_p, seed, offset, backend = ctx.args
    grad = grad.contiguous()
    impl = registry.select_backward(OP_BWD, {"grad": grad}, backend)
    dx = _dropout_bwd_op(grad, dropout_p, seed, offset, impl.backend)
    dbias = dx.sum(0, dtype=torch.float32).to(dx.dtype) if need_bias else None
    return (dx if need_x else None), dbias, None, None, None, None


_dropout_op.register_autograd(_backward, _setup_context)


def dropout(x: torch.Tensor, dropout_p: float, bias: torch.Tensor | None = None,
            generator: torch.Generator | None = None, backend: str | None = None) -> torch.Tensor:
    """Training-mode dropout of x + bias: each element zeroed with probability dropout_p, the kept ones scaled by
    1 / (1 - dropout_p) (as torch.nn.functional.dropout). x: (..., n) fp32/fp16/bf16; bias: (n,) x's dtype or
    None (the bias of the linear that produced x, added here). The keep-mask is a pure function of (seed, offset),
    two int64 drawn from `generator` (default: torch's default CPU generator, whatever x's device: no device
    synchronization), and of each element's (row, column) in the (rows, n) view. dropout_p = 0: x + bias, nothing
    drawn. Differentiable in x and bias."""
    check_float("x", OP, x)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise ValueError(f"{OP}: dropout_p must be a float with 0 <= dropout_p < 1, got {dropout_p!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{OP}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    n = x.shape[-1]
    check_like("bias", OP, bias, x, shape=(n,))
    if dropout_p == 0:
        return x if bias is None else x + bias
    if x.numel() == 0:
        return x.new_empty(x.shape)
    x2 = rows_view(x, n)
    b = None if bias is None else bias.contiguous()
    impl = registry.select(OP, {"x": x2, "bias": b}, backend)
    if needs_grad(x, bias):  # an unservable backward fails here, before the forward runs
        registry.select_backward(OP_BWD, {"grad": x2}, impl.backend)
    seed, offset = draw_seed_offset(generator)
    return as_shape(_dropout_op(x2, b, float(dropout_p), seed, offset, impl.backend), x.shape)
