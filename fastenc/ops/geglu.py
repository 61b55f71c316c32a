"""fastenc.ops.geglu: (..., 2N) -> (..., N), gelu(input) * gate with input, gate = x.chunk(2, -1)."""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_approximate, check_float, rows_view
from fastenc.reference.geglu import geglu_ref

OP = "geglu"


def _reference(x, approximate):
    return geglu_ref(x, approximate)


@torch.library.custom_op("fastenc::geglu", mutates_args=())
def _geglu_op(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    return registry.impls(OP)[backend].fn(x, approximate)


@_geglu_op.register_fake
def _(x, approximate, backend):
    return x.new_empty(x.shape[0], x.shape[1] // 2)


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.geglu", "geglu_fwd")
_backends.cpu(OP, "geglu")
_backends.cuda(OP, "geglu_cuda")


def geglu(x: torch.Tensor, approximate: str = "none", backend: str | None = None) -> torch.Tensor:
    """ModernBERT's GeGLU. x: (..., 2N) fp32/fp16/bf16 -> (..., N); approximate: 'none' (exact) | 'tanh'."""
    check_float("x", OP, x)
    approximate = check_approximate(OP, approximate)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"{OP}: x's last dim must be even (input and gate halves), got shape {tuple(x.shape)}")
    n2 = x.shape[-1]
    out_shape = (*x.shape[:-1], n2 // 2)
    if x.numel() == 0:
        return x.new_empty(out_shape)
    x2 = rows_view(x, n2)
    impl = registry.select(OP, {"x": x2}, backend)
    return _geglu_op(x2, approximate, impl.backend).view(out_shape)
