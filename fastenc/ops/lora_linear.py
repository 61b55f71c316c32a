"""fastenc.ops.lora_linear: unmerged LoRA linear y = x W^T + b + scale * (x A^T) B^T (Hu et al. 2021).

Every backend implements one contract:
  fn(x, weight, bias, lora_a, lora_b, scale) -> y
  x: (tokens, in) contiguous; weight: (out, in); bias: (out,) or None; lora_a: (r, in); lora_b: (out, r);
  all contiguous, one dtype (fp32/fp16/bf16), one device; scale: float. Returns (tokens, out) in x's dtype.
triton: one fused kernel (x read once per tile, the rank-r intermediate kept on chip), rank <= 128 (fp32: 64).
cpu: torch's CPU GEMMs (at::addmm) from the C++ binding, in fp32. Few tokens: base GEMM, then the rank-r update
     as a second in-place GEMM. Many tokens (T (in + out) > in out): W + scale B A formed in a temporary by the
     merge kernel, then one GEMM, so x and y are read/written once (the stored weight is never modified).

Backward (fastenc::lora_linear_bwd), with u = x A^T and v = dy B (tokens x r):
  dx = dy W + s v A,  dW = dy^T x,  db = sum_tokens dy,  dA = s v^T x,  dB = s dy^T u
  each only when its input requires grad (the frozen base weight and bias normally do not: no dW GEMM).
reference: fp32 formulas. cpu: the same on torch's CPU GEMMs from the C++ binding, fp32. triton: the GEMMs through
torch (cuBLAS on a GPU, in the input dtype with fp32 accumulation): the backward is five plain or rank-r GEMMs, which
a vendor GEMM serves at its peak; a fused Triton kernel would gain only the v / u round trips (tokens x r).
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import extension, registry
from fastenc.ops import _backends
from fastenc.ops._common import check_float, check_like, empty_or, needs_grad, rows_view
from fastenc.ops._library import custom_op
from fastenc.ops.merge_lora import check_adapter, check_scale
from fastenc.reference.lora_linear import lora_linear_bwd_ref, lora_linear_ref

OP = "lora_linear"
OP_BWD = "lora_linear_bwd"
# kernels.lora_linear.MAX_RANK / MAX_RANK_FP32 (not imported: keeps triton out of import time)
TRITON_MAX_RANK = {torch.float16: 128, torch.bfloat16: 128, torch.float32: 64}


def _reference(x, weight, bias, lora_a, lora_b, scale):
    return lora_linear_ref(x, weight, bias, lora_a, lora_b, scale)


@custom_op("fastenc::lora_linear", mutates_args=())
def _lora_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], lora_a: torch.Tensor,
                    lora_b: torch.Tensor, scale: float, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, weight, bias, lora_a, lora_b, scale)


@_lora_linear_op.register_fake
def _(x, weight, bias, lora_a, lora_b, scale, backend):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _triton_check(inputs) -> list[str]:
    r, dt = inputs["lora_a"].shape[0], inputs["x"].dtype
    limit = TRITON_MAX_RANK.get(dt, 0)
    return [] if r <= limit else [f"rank {r} > {limit} for {str(dt).replace('torch.', '')}"]


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.lora_linear", "lora_linear_fwd", check=_triton_check,
                    limits="rank <= 128 (fp32: 64)")
_backends.implement(OP, "cpu", "lora_linear", limits="fp32 math, torch CPU GEMMs")


# ---- backward

def _reference_bwd(dy, x, weight, lora_a, lora_b, scale, need):
    return lora_linear_bwd_ref(dy, x, weight, lora_a, lora_b, scale, *need)


def gemm_bwd(dy, x, weight, lora_a, lora_b, scale, need):
    """The backward GEMMs through torch in the inputs' dtype (cuBLAS on a GPU accumulates in fp32); the triton
    backend's backward. need: (x, weight, bias, lora_a, lora_b) flags. Returns the five gradients or None."""
    need_x, need_w, need_b, need_a, need_bb = need
    v = dy @ lora_b if (need_x or need_a) else None
    dx = torch.addmm(dy @ weight, v, lora_a, alpha=scale) if need_x else None
    dw = dy.t() @ x if need_w else None
    db = dy.sum(0, dtype=torch.float32).to(dy.dtype) if need_b else None
    da = torch.mm(v.t(), x) * scale if need_a else None
    dbb = torch.mm(dy.t(), x @ lora_a.t()) * scale if need_bb else None
    return dx, dw, db, da, dbb


def _cpu_bwd(dy, x, weight, lora_a, lora_b, scale, need):
    return extension.load().lora_linear_bwd(dy, x, weight, lora_a, lora_b, scale, *need)


@custom_op("fastenc::lora_linear_bwd", mutates_args=())
def _lora_linear_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor,
                        lora_b: torch.Tensor, scale: float, need_x: bool, need_weight: bool, need_bias: bool,
                        need_a: bool, need_b: bool, backend: str
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy: (tokens, out); x: (tokens, in); weight (out, in); lora_a (r, in); lora_b (out, r), one dtype ->
    (dx, dweight, dbias, dA, dB), each empty unless asked for."""
    if dy.dim() != 2 or tuple(dy.shape) != (x.shape[0], weight.shape[0]):
        raise ValueError(f"{OP_BWD}: dy must have shape {(x.shape[0], weight.shape[0])} (the forward's output), "
                         f"got {tuple(dy.shape)}")
    if dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(f"{OP_BWD}: dy must be {x.dtype} on {x.device} (the forward's output), got {dy.dtype} on "
                         f"{dy.device}")
    need = (need_x, need_weight, need_bias, need_a, need_b)
    outs = registry.impl(OP_BWD, backend).fn(dy, x, weight, lora_a, lora_b, scale, need)
    like = (x, weight, weight, lora_a, lora_b)
    return tuple(empty_or(o if n else None, t) for o, n, t in zip(outs, need, like))


@_lora_linear_bwd_op.register_fake
def _(dy, x, weight, lora_a, lora_b, scale, need_x, need_weight, need_bias, need_a, need_b, backend):
    def maybe(n, shape, t):
        return t.new_empty(shape) if n else t.new_empty(0)
    return (maybe(need_x, x.shape, x), maybe(need_weight, weight.shape, weight),
            maybe(need_bias, (weight.shape[0],), weight), maybe(need_a, lora_a.shape, lora_a),
            maybe(need_b, lora_b.shape, lora_b))


_backends.implement(OP_BWD, "reference", _reference_bwd)
_backends.implement(OP_BWD, "triton", "fastenc.ops.lora_linear", "gemm_bwd", limits="torch GEMMs (cuBLAS on a GPU)")
registry.register(registry.Impl(op=OP_BWD, backend="cpu", fn=_cpu_bwd, devices=("cpu",), priority=20,
                                available=extension.cpu_available, probe=extension.status,
                                limits="fp32 math, torch CPU GEMMs"))


def _setup_context(ctx, inputs, output):
    x, weight, bias, lora_a, lora_b, scale, backend = inputs
    ctx.save_for_backward(x, weight, lora_a, lora_b)
    ctx.scale, ctx.backend = scale, backend


def _backward(ctx, dy):
    x, weight, lora_a, lora_b = ctx.saved_tensors
    need = tuple(bool(n) for n in ctx.needs_input_grad[:5])
    if not any(need):
        return (None,) * 7
    dy = dy.contiguous()
    impl = registry.select_backward(OP_BWD, {"dy": dy, "x": x, "lora_a": lora_a}, ctx.backend)
    outs = _lora_linear_bwd_op(dy, x, weight, lora_a, lora_b, ctx.scale, *need, impl.backend)
    return tuple(o if n else None for o, n in zip(outs, need)) + (None, None)


_lora_linear_op.register_autograd(_backward, _setup_context)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scale: float, backend: str | None = None) -> torch.Tensor:
    """x W^T + b + scale * (x A^T) B^T without merging the adapter into W.

    x: (..., in) fp32/fp16/bf16; weight: (out, in), bias: (out,) or None, lora_a: (r, in), lora_b: (out, r),
    all in x's dtype and on x's device; scale: lora_alpha / r (or / sqrt(r)). Returns (..., out) in x's dtype.
    """
    check_float("x", OP, x)
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    check_float("weight", OP, weight)
    if weight.dim() != 2:
        raise ValueError(f"{OP}: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    out_f, in_f = weight.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"{OP}: x's last dim must equal weight's in_features {in_f}, got {x.shape[-1]}")
    check_like("weight", OP, weight, x)
    check_like("bias", OP, bias, x, shape=(out_f,))
    check_adapter(OP, lora_a, lora_b, out_f, in_f, x.device)
    check_like("lora_a", OP, lora_a, x)
    check_like("lora_b", OP, lora_b, x)
    scale = check_scale(OP, scale)
    if x.numel() == 0:
        return x.new_empty((*x.shape[:-1], out_f))
    x2 = rows_view(x, in_f)
    w, a, b = weight.contiguous(), lora_a.contiguous(), lora_b.contiguous()
    bias = None if bias is None else bias.contiguous()
    impl = registry.select(OP, {"x": x2, "weight": w, "bias": bias, "lora_a": a, "lora_b": b}, backend)
    if needs_grad(x, weight, bias, lora_a, lora_b):  # an unservable backward fails before the forward
        registry.select_backward(OP_BWD, {"dy": x2, "x": x2, "lora_a": a}, impl.backend)
    return _lora_linear_op(x2, w, bias, a, b, scale, impl.backend).view(*x.shape[:-1], out_f)
