"""fastenc.ops.sparse_max: SPLADE's max-pooled sparse weights from packed hidden states, fused with the vocabulary
projection: out[s, v] = log1p(relu(max over the tokens t of sequence s of (x_t . W_v + b_v))), the math of
fastenc.reference.sparse_max (Formal et al. 2021, "SPLADE v2").

Every backend implements one contract:
  fn(x, cu_seqlens, weight, bias) -> out
  x: (tokens, H); cu_seqlens: int32 (batch+1,) validated (from 0, non-decreasing, to tokens); weight: (V, H) and
  bias (V,) or None in x's dtype. Returns a new (batch, V) fp32 tensor.
reference: plain PyTorch (forms the (tokens, V) logits; differentiable). cpu: csrc/cpu/sparse_max.cpp, the packed-panel
GEMM's register tile with a running-max epilogue (fp32 math), on the weight packed into its panels once and kept
while the weight lives (an fp32 copy of it; repacked when the weight changes), so a call packs nothing. triton:
fastenc/kernels/sparse_max.py, tl.dot tiles with a running max. The fast backends never store the (tokens, V) logits, and have no backward.
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_cu_seqlens, check_float, check_like, needs_grad
from fastenc.ops._library import custom_op
from fastenc.reference.sparse_max import sparse_max_ref

OP = "sparse_max"


def _reference(x, cu_seqlens, weight, bias):
    return sparse_max_ref(x, cu_seqlens, weight, bias)


@custom_op("fastenc::sparse_max", mutates_args=())
def _sparse_max_op(x: torch.Tensor, cu_seqlens: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, cu_seqlens, weight, bias)


@_sparse_max_op.register_fake
def _(x, cu_seqlens, weight, bias, backend):
    return x.new_empty((cu_seqlens.shape[0] - 1, weight.shape[0]), dtype=torch.float32)


def _no_backward(ctx, grad):
    raise RuntimeError("fastenc::sparse_max has no backward: the fused kernels are forward only; train through "
                       "backend='reference' (differentiable)")


_sparse_max_op.register_autograd(_no_backward, lambda ctx, inputs, output: None)

_backends.implement(OP, "reference", _reference, limits="forms the (tokens, vocab) logits; differentiable")
_PANELS: dict[int, tuple] = {}  # id(weight) -> (weakref to it, its version, its panels); dropped with the weight


def _panels(weight: torch.Tensor) -> torch.Tensor:
    """weight packed for the cpu kernel (the extension's sparse_max_pack), kept between calls while the weight lives
    and is unchanged (its version counter, optimizer steps, storage, dtype and shape as when packed)."""
    import weakref

    from fastenc import extension
    from fastenc.layers.steps import optimizer_steps

    key = id(weight)
    version = (weight._version, optimizer_steps(), weight.data_ptr(), weight.dtype, tuple(weight.shape))
    hit = _PANELS.get(key)
    if hit is not None and hit[0]() is weight and hit[1] == version:
        return hit[2]
    panels = extension.load().sparse_max_pack(weight.detach())
    if hit is None:
        weakref.finalize(weight, _PANELS.pop, key, None)
    _PANELS[key] = (weakref.ref(weight), version, panels)
    return panels


def _with_panels(fn):
    """The cpu contract fn(x, cu_seqlens, weight, bias) over the kernel reading weight's cached panels."""
    def run(x, cu_seqlens, weight, bias):
        return fn(x, cu_seqlens, weight, bias, _panels(weight))
    return run


_backends.implement(OP, "cpu", "sparse_max", wrap=_with_panels,
                    limits="fp32 math (fp16/bf16 through fp32 copies); forward only; keeps the weight packed (an "
                           "fp32 copy) while it lives")
_backends.implement(OP, "triton", "fastenc.kernels.sparse_max", "sparse_max_fwd",
                    limits="fp32 accumulation; forward only")


def sparse_max(x: torch.Tensor, cu_seqlens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               backend: str | None = None) -> torch.Tensor:
    """SPLADE weights per sequence: out[s, v] = log1p(relu(max over rows t of sequence s of x[t] . weight[v] +
    bias[v])) (log1p and relu are monotone: the max is taken first). An empty sequence gives zeros.

    x: (tokens, H) fp32/fp16/bf16 packed hidden states (e.g. an MLM head's transform output); cu_seqlens: int32
    (batch+1,), from 0, non-decreasing, ending at tokens (sequence s is rows cu[s]..cu[s+1]); weight: (V, H) the
    vocabulary projection (an MLM decoder weight) and bias: (V,) or None, both in x's dtype and on its device.
    Returns (batch, V) fp32.
    The cpu and triton backends run the projection tile by tile keeping only the running max, so the (tokens, V)
    logits never exist; they are forward only (a call needing grad there raises). backend='reference' forms the
    logits in PyTorch and is differentiable in x, weight and bias.
    """
    check_float("x", OP, x)
    if x.dim() != 2:
        raise ValueError(f"{OP}: x must be (tokens, hidden), got shape {tuple(x.shape)}")
    check_float("weight", OP, weight)
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{OP}: weight must be (vocab, {x.shape[1]}) (x's hidden size), got shape "
                         f"{tuple(weight.shape)}")
    check_like("weight", OP, weight, x)
    check_like("bias", OP, bias, x, shape=(weight.shape[0],))
    check_cu_seqlens(cu_seqlens, x.shape[0], x.device, OP)
    inputs = {"x": x, "cu_seqlens": cu_seqlens, "weight": weight, "bias": bias}
    impl = registry.select(OP, inputs, backend)
    if needs_grad(x, weight, bias):
        if impl.backend == "reference":
            return sparse_max_ref(x, cu_seqlens, weight, bias)  # autograd through the plain PyTorch math
        raise RuntimeError(f"{OP}: the {impl.backend} backend is forward only and an input requires grad; run under "
                           f"torch.no_grad() / inference_mode(), or pass backend='reference' to differentiate")
    return _sparse_max_op(x, cu_seqlens, weight, bias, impl.backend)
