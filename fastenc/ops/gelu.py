"""fastenc.ops.gelu: GELU (exact erf, tanh or quick form) with an optional fused bias add, optionally into `out` (which
may be x itself: in place); backward dx = grad * gelu'(x + bias), dbias = dx summed over rows."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, needs_grad, check_approximate, check_float, check_like, check_out, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.gelu import gelu_bwd_ref, gelu_ref

OP = "gelu"
OP_OUT = "gelu_out"
OP_BWD = "gelu_bwd"


def _reference(x, bias, approximate):
    return gelu_ref(x, bias, approximate)


def _reference_out(x, bias, approximate, out):
    out.copy_(gelu_ref(x, bias, approximate))


def _copy_into(fn):
    """A backend without an in-place kernel: compute, then copy once into `out`."""
    def call(x, bias, approximate, out):
        out.copy_(fn(x, bias, approximate))
    return call


@custom_op("fastenc::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, bias, approximate)


@_gelu_op.register_fake
def _(x, bias, approximate, backend):
    return torch.empty_like(x)


@custom_op("fastenc::gelu_out", mutates_args=("out",))
def _gelu_out_op(x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str, backend: str,
                 out: torch.Tensor) -> None:
    """The same into `out` (may be x); each backend's way of writing it is its registry entry for gelu_out."""
    registry.impl(OP_OUT, backend).fn(x, bias, approximate, out)


@_gelu_out_op.register_fake
def _(x, bias, approximate, backend, out):
    return None


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.gelu", "gelu_fwd")
_backends.implement(OP, "cpu", "gelu")
_backends.implement(OP, "cuda", "gelu_cuda")

_backends.implement(OP_OUT, "reference", _reference_out)
_backends.implement(OP_OUT, "triton", "fastenc.kernels.gelu", "gelu_out")
_backends.implement(OP_OUT, "cpu", "gelu_out")
_backends.implement(OP_OUT, "cuda", "gelu_cuda", wrap=_copy_into)


# ---- backward: dx = grad * gelu'(x + bias), dbias = sum over rows of dx; recomputed from x (nothing saved but x).
# Every backend gets which gradients autograd needs: an unneeded one comes back empty, and is not summed (dbias)
# or not written (dx, where the kernel can form dbias without it).

def _reference_bwd(grad, x, bias, approximate, need_dx, need_dbias):
    """grad, x: (rows, N) contiguous; bias: (N,) or None -> (dx (rows, N) or empty, dbias (N,) or empty) in x's
    dtype; dbias sums the fp32 dx (before rounding), as the kernels do."""
    d32 = gelu_bwd_ref(grad.float(), x.float(), None if bias is None else bias.float(), approximate)
    dx = d32.to(x.dtype) if need_dx else x.new_empty(0)
    return dx, (d32.sum(0).to(x.dtype) if bias is not None and need_dbias else x.new_empty(0))


@custom_op("fastenc::gelu_bwd", mutates_args=())
def _gelu_bwd_op(grad: torch.Tensor, x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str,
                 need_dx: bool, need_dbias: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if grad.shape != x.shape or grad.dtype != x.dtype or grad.device != x.device:
        raise ValueError(f"{OP}: grad must match x ({tuple(x.shape)}, {x.dtype}, {x.device}), got "
                         f"({tuple(grad.shape)}, {grad.dtype}, {grad.device})")
    return registry.impl(OP_BWD, backend).fn(grad, x, bias, approximate, need_dx, need_dbias)


@_gelu_bwd_op.register_fake
def _(grad, x, bias, approximate, need_dx, need_dbias, backend):
    return (torch.empty_like(x) if need_dx else x.new_empty(0),
            x.new_empty(x.shape[-1]) if bias is not None and need_dbias else x.new_empty(0))


_backends.implement(OP_BWD, "reference", _reference_bwd)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.gelu", "gelu_bwd")
_backends.implement(OP_BWD, "cpu", "gelu_bwd")
_backends.implement(OP_BWD, "cuda", "gelu_bwd_cuda")


def _setup_context(ctx, inputs, output):
    x, bias, approximate, backend = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate, ctx.backend = approximate, backend


def _backward(ctx, grad):
    x, bias = ctx.saved_tensors
    need_x, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = need_bias and bias is not None
    if not (need_x or need_bias):
        return None, None, None, None
    grad = grad.contiguous()
    impl = registry.select_backward(OP_BWD, {"grad": grad, "x": x, "bias": bias}, ctx.backend)
    dx, dbias = _gelu_bwd_op(grad, x, bias, ctx.approximate, need_x, need_bias, impl.backend)
    return (dx if need_x else None), (dbias if need_bias else None), None, None


_gelu_op.register_autograd(_backward, _setup_context)


def gelu(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none",
         backend: str | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x + bias). x: (..., N) fp32/fp16/bf16; bias: (N,) same dtype; approximate: 'none' (exact erf) | 'tanh' |
    'quick' (x * sigmoid(1.702 x), CLIP's quick_gelu).

    gelu(+inf) = +inf, gelu(-inf) = NaN and NaN -> NaN on every backend, as torch's F.gelu.
    out: written and returned instead of a new tensor; x's shape and dtype, contiguous; may be x itself (in place,
    e.g. over the GEMM output the activation consumes), must not otherwise overlap x. An inference form: refused
    when x or bias requires grad.
    Differentiable in x and bias (backward on the forward's backend when it has one).
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
    if out is not None and needs_grad(x, bias):
        raise ValueError(f"{OP}: out= is an inference form; it cannot be used when x or bias requires grad")
    if x.numel() == 0:
        return x.new_empty(shape) if out is None else out
    x2 = rows_view(x, n)
    impl = registry.select(OP, {"x": x2, "bias": bias}, backend)
    b = None if bias is None else bias.contiguous()
    if needs_grad(x, bias):
        registry.select_backward(OP_BWD, {"grad": x2, "x": x2, "bias": b}, impl.backend)  # fails before the forward
    if out is None:
        return as_shape(_gelu_op(x2, b, approximate, impl.backend), shape)
    _gelu_out_op(x2, b, approximate, impl.backend, out.view(x2.shape))
    return out
