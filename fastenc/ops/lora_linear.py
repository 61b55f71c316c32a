"""fastenc.ops.lora_linear: unmerged LoRA linear y = x W^T + b + scale * (x A^T) B^T (Hu et al. 2021).

Every backend implements one contract:
  fn(x, weight, bias, lora_a, lora_b, scale) -> y
  x: (tokens, in) contiguous; weight: (out, in); bias: (out,) or None; lora_a: (r, in); lora_b: (out, r);
  all contiguous, one dtype (fp32/fp16/bf16), one device; scale: float. Returns (tokens, out) in x's dtype.
triton: one fused kernel (x read once per tile, the rank-r intermediate kept on chip), rank <= 128 (fp32: 64).
cpu: torch's CPU GEMMs (at::addmm) from the C++ binding, in fp32. Few tokens: base GEMM, then the rank-r update
     as a second in-place GEMM. Many tokens (T (in + out) > in out): W + scale B A formed in a temporary by the
     merge kernel, then one GEMM, so x and y are read/written once (the stored weight is never modified).
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_float, check_like, rows_view
from fastenc.ops._library import custom_op
from fastenc.ops.merge_lora import check_adapter, check_scale
from fastenc.reference.lora_linear import lora_linear_ref

OP = "lora_linear"
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


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.lora_linear", "lora_linear_fwd", check=_triton_check,
                 limits="rank <= 128 (fp32: 64)")
_backends.cpu(OP, "lora_linear", limits="fp32 math, torch CPU GEMMs")


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
    return _lora_linear_op(x2, w, bias, a, b, scale, impl.backend).view(*x.shape[:-1], out_f)
