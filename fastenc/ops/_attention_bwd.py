"""fastenc::attention_bwd: the backward of fastenc::attention (FlashAttention-2's, Dao 2023), one Impl per backend,
and the autograd formula fastenc/ops/attention.py attaches to its forward op.

Contract of every backend (packed variable-length layout, as the forward):
  fn(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale) -> (dq, dk, dv)
  grad, q, k, v, out: (total_tokens, heads, head_dim) contiguous, one dtype; lse: (heads, total_tokens) fp32 as the
  forward saved it; dq, dk, dv in q's dtype. The probabilities are recomputed from lse, never stored.
"""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._library import custom_op
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref
from fastenc.registry import _dt

OP_BWD = "attention_bwd"


def _reference(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale):
    return attention_bwd_varlen_ref(grad, q, k, v, out, lse, cu_seqlens, (window_left, window_right), scale)


def check_bwd_args(grad, q, k, v, out, lse) -> None:
    """Shapes and dtypes every backend relies on; raises ValueError naming the argument."""
    for name, t in (("grad", grad), ("k", k), ("v", v), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{OP_BWD}: {name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{OP_BWD}: {name} must have q's dtype {_dt(q.dtype)}, got {_dt(t.dtype)}")
        if t.device != q.device:
            raise ValueError(f"{OP_BWD}: {name} must be on q's device {q.device}, got {t.device}")
    want = (q.shape[1], q.shape[0])
    if tuple(lse.shape) != want or lse.dtype != torch.float32:
        raise ValueError(f"{OP_BWD}: lse must be float32 of shape (heads, total_tokens)={want}, got "
                         f"{_dt(lse.dtype)} {tuple(lse.shape)}")


@custom_op("fastenc::attention_bwd", mutates_args=())
def _attention_bwd_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int,
                      window_right: int, scale: float, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_bwd_args(grad, q, k, v, out, lse)
    return registry.impl(OP_BWD, backend).fn(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left,
                                             window_right, scale)


@_attention_bwd_op.register_fake
def _(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _head_dim(inputs) -> int:
    return int(inputs["q"].shape[-1])


def _triton_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    if d % 8 or not 8 <= d <= 256:
        return [f"head_dim must be a multiple of 8 in [8, 256], got {d}"]
    return []


def _cpu_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    if not 1 <= d <= 256:
        return [f"head_dim must be in [1, 256], got {d}"]
    return []


def _cuda_check(inputs) -> list[str]:
    why = registry.triton_available()
    return ([f"the Triton kernel that serves it is unavailable: {why}"] if why else []) + _triton_check(inputs)


_backends.reference(OP_BWD, _reference)
_backends.triton(OP_BWD, "fastenc.kernels.attention_bwd", "attention_bwd", check=_triton_check,
                 limits="head_dim multiple of 8 <= 256; CUDA, CPU tensors under TRITON_INTERPRET=1")
_backends.cpu(OP_BWD, "attention_bwd", check=_cpu_check, limits="head_dim <= 256, fp32 math, tiled (no seq x seq)")
_backends.cuda(OP_BWD, "attention_bwd", dtypes=(torch.float16, torch.bfloat16), check=_cuda_check,
               wrap=lambda _ext: _backends._lazy("fastenc.kernels.attention_bwd", "attention_bwd"),
               limits="served by the Triton kernel (kernels/attention_bwd.py); fp16/bf16, head_dim multiple of 8 "
                      "<= 256")


def _bwd_inputs(grad, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale) -> dict:
    return {"grad": grad, "q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen,
            "window": (wl, wr), "scale": scale}


def setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.mark_non_differentiable(lse)
    ctx.args = (max_seqlen, wl, wr, scale, backend)


def backward(ctx, grad, _grad_lse):
    """grad: d loss / d out (any strides, zero strides included); lse is not differentiable (its gradient is
    ignored). Inputs that need no gradient get None; nothing is computed when none does."""
    need = ctx.needs_input_grad[:3]
    nones = (None,) * 6
    if not any(need):
        return (None, None, None) + nones
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    max_seqlen, wl, wr, scale, backend = ctx.args
    if tuple(grad.shape) != tuple(out.shape) or grad.dtype != out.dtype:
        raise ValueError(f"attention backward: grad must be {_dt(out.dtype)} of shape {tuple(out.shape)}, got "
                         f"{_dt(grad.dtype)} {tuple(grad.shape)}")
    grad = grad.contiguous()
    impl = registry.select_backward(OP_BWD, _bwd_inputs(grad, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale),
                                    backend)
    dq, dk, dv = _attention_bwd_op(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend)
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + nones
