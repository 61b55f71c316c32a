"""fastenc.ops.swiglu: silu(gate) * up, from one (..., 2N) input [gate | up] (gate, up = x.chunk(2, -1)) or from two
(..., N) inputs gate and up; backward recomputed from the inputs: one (rows, 2N) gradient [d gate | d up] for the
fused input, (d gate, d up) for two."""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_float, check_like, needs_grad, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.swiglu import swiglu_bwd_ref, swiglu_ref

OP = "swiglu"
OP_BWD = "swiglu_bwd"


def _reference(x, up):
    return swiglu_ref(x, up)


@custom_op("fastenc::swiglu", mutates_args=())
def _swiglu_op(x: torch.Tensor, up: Optional[torch.Tensor], backend: str) -> torch.Tensor:
    """x: (rows, 2N) [gate | up] with up None, or gate (rows, N) with up (rows, N); contiguous -> (rows, N)."""
    return registry.impl(OP, backend).fn(x, up)


@_swiglu_op.register_fake
def _(x, up, backend):
    return x.new_empty(x.shape[0], x.shape[1] // 2 if up is None else x.shape[1])


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.swiglu", "swiglu_fwd")
_backends.implement(OP, "cpu", "swiglu")
_backends.implement(OP, "cuda", "swiglu_cuda")


# ---- backward: d gate = grad * up * silu'(gate), d up = grad * silu(gate); recomputed from the inputs (saved alone)

def _reference_bwd(grad, x, up):
    """grad: (rows, N); fused x (rows, 2N) -> (dx (rows, 2N), empty); gate x, up (rows, N) -> (d gate, d up)."""
    got = swiglu_bwd_ref(grad, x, up)
    return (got, x.new_empty(0)) if up is None else got


@custom_op("fastenc::swiglu_bwd", mutates_args=())
def _swiglu_bwd_op(grad: torch.Tensor, x: torch.Tensor, up: Optional[torch.Tensor],
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    want = (x.shape[0], x.shape[1] // 2 if up is None else x.shape[1])
    if tuple(grad.shape) != want or grad.dtype != x.dtype or grad.device != x.device:
        raise ValueError(f"{OP}: grad must be {want} of x's dtype {x.dtype} on {x.device}, got "
                         f"({tuple(grad.shape)}, {grad.dtype}, {grad.device})")
    return registry.impl(OP_BWD, backend).fn(grad, x, up)


@_swiglu_bwd_op.register_fake
def _(grad, x, up, backend):
    return torch.empty_like(x), (x.new_empty(0) if up is None else torch.empty_like(up))


_backends.implement(OP_BWD, "reference", _reference_bwd)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.swiglu", "swiglu_bwd")
_backends.implement(OP_BWD, "cpu", "swiglu_bwd")
_backends.implement(OP_BWD, "cuda", "swiglu_bwd_cuda")


def _setup_context(ctx, inputs, output):
    x, up, backend = inputs
    ctx.save_for_backward(x, up)
    ctx.backend = backend


def _backward(ctx, grad):
    x, up = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_up = up is not None and ctx.needs_input_grad[1]
    if not (need_x or need_up):
        return None, None, None
    grad = grad.contiguous()
    impl = registry.select_backward(OP_BWD, {"grad": grad, "x": x, "up": up}, ctx.backend)
    dx, dup = _swiglu_bwd_op(grad, x, up, impl.backend)
    return (dx if need_x else None), (dup if need_up else None), None


_swiglu_op.register_autograd(_backward, _setup_context)


def swiglu(x: torch.Tensor, up: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, silu(g) = g * sigmoid(g). fp32/fp16/bf16, result in x's dtype.

    One input: x (..., 2N) with the gate FIRST, gate, up = x.chunk(2, -1) (the order of fastenc's GeGLU and of
    Phi-3's and Jina-BERT's fused gate_up projections) -> (..., N). Checkpoints that fuse the other way
    ([up | gate]: GTE's up_gate_proj, NomicBERT's fc11 | fc12) swap the two row blocks of that weight once, or call
    the two-input form.
    Two inputs: swiglu(gate, up) (or up=...), gate and up (..., N) of one shape, dtype and device -> (..., N); what
    LLaMA-style MLPs with separate gate_proj / up_proj projections need, with no concatenation.
    Differentiable in x and up (backward on the forward's backend when it has one; d gate and d up of the fused
    input come back as one (..., 2N) gradient).
    """
    check_float("x", OP, x)
    if up is None:
        if x.dim() == 0 or x.shape[-1] % 2:
            raise ValueError(f"{OP}: x must have an even last dim (gate and up halves), got "
                             f"{x.shape[-1] if x.dim() else 'a 0-d tensor'} (shape {tuple(x.shape)})")
        n_in, n = x.shape[-1], x.shape[-1] // 2
    else:
        check_like("up", OP, up, x, ref_name="gate", shape=tuple(x.shape))
        if x.dim() == 0:
            x, up = x.reshape(1), up.reshape(1)
        n_in = n = x.shape[-1]
    out_shape = torch.Size((*x.shape[:-1], n))
    if x.numel() == 0:
        return x.new_empty(out_shape)
    x2 = rows_view(x, n_in)
    u2 = None if up is None else rows_view(up, n)
    impl = registry.select(OP, {"x": x2, "up": u2}, backend)
    if needs_grad(x, up):
        g = x2[:, :n] if up is None else x2
        registry.select_backward(OP_BWD, {"grad": g, "x": x2, "up": u2}, impl.backend)  # fails before the forward
    return as_shape(_swiglu_op(x2, u2, impl.backend), out_shape)
