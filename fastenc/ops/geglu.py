"""fastenc.ops.geglu: (..., 2N) -> (..., N), gelu(input) * gate with input, gate = x.chunk(2, -1); optionally
into `out`, which may be x[..., :N] (in place over the input halves: no new (tokens, N) buffer)."""
from __future__ import annotations

import torch

from fastenc import extension, registry
from fastenc.ops import _backends
from fastenc.ops._common import as_shape, check_approximate, check_float, check_out, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.geglu import geglu_ref

OP = "geglu"


def _reference(x, approximate):
    return geglu_ref(x, approximate)


@custom_op("fastenc::geglu", mutates_args=())
def _geglu_op(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, approximate)


@_geglu_op.register_fake
def _(x, approximate, backend):
    return x.new_empty(x.shape[0], x.shape[1] // 2)


@custom_op("fastenc::geglu_out", mutates_args=("out",))
def _geglu_out_op(x: torch.Tensor, approximate: str, backend: str, out: torch.Tensor) -> None:
    """The same into `out` (rows, N) with unit column stride (may be x[:, :N]); cpu and triton write it directly."""
    if backend == "cpu":
        extension.load().geglu_out(x, approximate, out)
    elif backend == "triton":
        from fastenc.kernels.geglu import geglu_fwd
        geglu_fwd(x, approximate, out=out)
    else:
        out.copy_(registry.impl(OP, backend).fn(x, approximate))


@_geglu_out_op.register_fake
def _(x, approximate, backend, out):
    return None


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.geglu", "geglu_fwd")
_backends.cpu(OP, "geglu")
_backends.cuda(OP, "geglu_cuda")


def geglu(x: torch.Tensor, approximate: str = "none", backend: str | None = None, *,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """ModernBERT's GeGLU. x: (..., 2N) fp32/fp16/bf16 -> (..., N); approximate: 'none' (exact) | 'tanh'.

    out: (..., N) of x's dtype, written and returned; may be x[..., :N] of a contiguous (rows, 2N) x (in place),
    must not otherwise overlap x.
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
    if x.numel() == 0:
        return x.new_empty(out_shape) if out is None else out
    x2 = rows_view(x, n2)
    impl = registry.select(OP, {"x": x2}, backend)
    if out is None:
        return as_shape(_geglu_op(x2, approximate, impl.backend), torch.Size(out_shape))
    try:
        o2 = out.view(-1, n2 // 2)
    except RuntimeError:
        raise ValueError(f"{OP}: out must be viewable as (rows, {n2 // 2}), got strides {tuple(out.stride())}") from None
    _geglu_out_op(x2, approximate, impl.backend, o2)
    return out
