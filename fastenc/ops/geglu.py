"""fastenc.ops.geglu: (..., 2N) -> (..., N), gelu(input) * gate with input, gate = x.chunk(2, -1); optionally
into `out`, which may be x[..., :N] (in place over the input halves: no new (tokens, N) buffer); backward into one
(rows, 2N) gradient [d input | d gate], recomputed from x."""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_approximate, check_float, check_out, needs_grad, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.geglu import geglu_bwd_ref, geglu_ref

OP = "geglu"
OP_OUT = "geglu_out"
OP_BWD = "geglu_bwd"


def _reference(x, approximate):
    return geglu_ref(x, approximate)


def _reference_out(x, approximate, out):
    out.copy_(geglu_ref(x, approximate))


def _copy_into(fn):
    """A backend without an in-place kernel: compute, then copy once into `out`."""
    def call(x, approximate, out):
        out.copy_(fn(x, approximate))
    return call


@custom_op("fastenc::geglu", mutates_args=())
def _geglu_op(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, approximate)


@_geglu_op.register_fake
def _(x, approximate, backend):
    return x.new_empty(x.shape[0], x.shape[1] // 2)


@custom_op("fastenc::geglu_out", mutates_args=("out",))
def _geglu_out_op(x: torch.Tensor, approximate: str, backend: str, out: torch.Tensor) -> None:
    """The same into `out` (rows, N) with unit column stride (may be x[:, :N]); each backend's way of writing it is
    its registry entry for geglu_out."""
    registry.impl(OP_OUT, backend).fn(x, approximate, out)


@_geglu_out_op.register_fake
def _(x, approximate, backend, out):
    return None


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.geglu", "geglu_fwd")
_backends.implement(OP, "cpu", "geglu")
_backends.implement(OP, "cuda", "geglu_cuda")

_backends.implement(OP_OUT, "reference", _reference_out)
_backends.implement(OP_OUT, "triton", "fastenc.kernels.geglu", "geglu_out")
_backends.implement(OP_OUT, "cpu", "geglu_out")
_backends.implement(OP_OUT, "cuda", "geglu_cuda", wrap=_copy_into)


# ---- backward: d input = grad * gate * gelu'(input), d gate = grad * gelu(input); recomputed from x (saved alone)

def _reference_bwd(grad, x, approximate):
    """grad: (rows, N), x: (rows, 2N) -> dx (rows, 2N) in x's dtype."""
    return geglu_bwd_ref(grad, x, approximate)


@custom_op("fastenc::geglu_bwd", mutates_args=())
def _geglu_bwd_op(grad: torch.Tensor, x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    want = (x.shape[0], x.shape[1] // 2)
    if tuple(grad.shape) != want or grad.dtype != x.dtype or grad.device != x.device:
        raise ValueError(f"{OP}: grad must be {want} of x's dtype {x.dtype} on {x.device}, got "
                         f"({tuple(grad.shape)}, {grad.dtype}, {grad.device})")
    return registry.impl(OP_BWD, backend).fn(grad, x, approximate)


@_geglu_bwd_op.register_fake
def _(grad, x, approximate, backend):
    return torch.empty_like(x)


_backends.implement(OP_BWD, "reference", _reference_bwd)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.geglu", "geglu_bwd")
_backends.implement(OP_BWD, "cpu", "geglu_bwd")
_backends.implement(OP_BWD, "cuda", "geglu_bwd_cuda")


def _setup_context(ctx, inputs, output):
    x, approximate, backend = inputs
    ctx.save_for_backward(x)
    ctx.approximate, ctx.backend = approximate, backend


def _backward(ctx, grad):
    if not ctx.needs_input_grad[0]:
        return None, None, None
    (x,) = ctx.saved_tensors
    grad = grad.contiguous()
    impl = registry.select_backward(OP_BWD, {"grad": grad, "x": x}, ctx.backend)
    return _geglu_bwd_op(grad, x, ctx.approximate, impl.backend), None, None


_geglu_op.register_autograd(_backward, _setup_context)


def geglu(x: torch.Tensor, approximate: str = "none", backend: str | None = None, *,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """ModernBERT's GeGLU. x: (..., 2N) fp32/fp16/bf16 -> (..., N); approximate: 'none' (exact) | 'tanh' | 'quick'
    (x * sigmoid(1.702 x)).

    out: (..., N) of x's dtype, written and returned; may be x[..., :N] of a contiguous (rows, 2N) x (in place),
    must not otherwise overlap x. An inference form: refused when x requires grad.
    Differentiable in x (backward on the forward's backend when it has one).
    """
    check_float("x", OP, x)
    approximate = check_approximate(OP, approximate)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"{OP}: x's last dim must be even (input and gate halves), got shape {tuple(x.shape)}")
    n2 = x.shape[-1]
    out_shape = (*x.shape[:-1], n2 // 2)
    halves = x[..., : n2 // 2]
    if out is not None:
        check_out(OP, out, out_shape, x, inplace_ok=halves if x.is_contiguous() else None)
        if needs_grad(x):
            raise ValueError(f"{OP}: out= is an inference form; it cannot be used when x requires grad")
    if x.numel() == 0:
        return x.new_empty(out_shape) if out is None else out
    x2 = rows_view(x, n2)
    impl = registry.select(OP, {"x": x2}, backend)
    if needs_grad(x):
        g = x2[:, : n2 // 2]
        registry.select_backward(OP_BWD, {"grad": g, "x": x2}, impl.backend)  # fails before the forward
    if out is None:
        return as_shape(_geglu_op(x2, approximate, impl.backend), torch.Size(out_shape))
    try:
        o2 = out.view(-1, n2 // 2)
    except RuntimeError:
        raise ValueError(f"{OP}: out must be viewable as (rows, {n2 // 2}), got strides {tuple(out.stride())}") from None
    _geglu_out_op(x2, approximate, impl.backend, o2)
    return out
