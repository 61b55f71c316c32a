"""fastenc.ops.merge_lora: W + scale * B @ A (LoRA, Hu et al. 2021) with fp32 accumulation, rounded once.

Every backend implements one contract:
  fn(weight, lora_a, lora_b, scale) -> merged
  weight: (out, in) contiguous fp32/fp16/bf16; lora_a: (r, in) and lora_b: (out, r) contiguous, any float
  dtype (may differ from weight's), on weight's device; scale: float. Returns a NEW (out, in) tensor in
  weight's dtype equal to round(weight + scale * lora_b @ lora_a) with the sum formed in fp32; the inputs
  are never written. In-place merging is done here, by copying the result into the weight.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_float
from fastenc.ops._library import custom_op
from fastenc.reference.merge_lora import merge_lora_ref

OP = "merge_lora"


def _reference(weight, lora_a, lora_b, scale):
    return merge_lora_ref(weight, lora_a, lora_b, scale)


@custom_op("fastenc::merge_lora", mutates_args=())
def _merge_lora_op(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float,
                   backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(weight, lora_a, lora_b, scale)


@_merge_lora_op.register_fake
def _(weight, lora_a, lora_b, scale, backend):
    return torch.empty_like(weight)


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.merge_lora", "merge_lora_fwd")


def _no_backward(ctx, grad):
    raise RuntimeError("fastenc::merge_lora has no backward: merging an adapter is forward-only (inference); "
                       "train the adapter unmerged with fastenc.ops.lora_linear, or merge under torch.no_grad()")


_merge_lora_op.register_autograd(_no_backward, lambda ctx, inputs, output: None)
_backends.implement(OP, "cpu", "merge_lora")
_backends.implement(OP, "cuda", "merge_lora_cuda")


def check_scale(op: str, scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"{op}: scale must be a finite float, got {scale!r}")
    return float(scale)


def check_adapter(op: str, lora_a: Any, lora_b: Any, out_features: int, in_features: int,
                  device: torch.device, base: str = "weight") -> int:
    """lora_a (r, in), lora_b (out, r) on `device`; returns r. Errors name the mismatching argument."""
    check_float("lora_a", op, lora_a)
    check_float("lora_b", op, lora_b)
    for name, t in (("lora_a", lora_a), ("lora_b", lora_b)):
        if t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{op}: {name} must be on {base}'s device {device}, got {t.device}")
    r = lora_a.shape[0]
    if r < 1:
        raise ValueError(f"{op}: lora_a must have rank >= 1 rows, got shape {tuple(lora_a.shape)}")
    if lora_a.shape[1] != in_features:
        raise ValueError(f"{op}: lora_a must have shape (r, {in_features}) to match {base}'s in_features "
                         f"{in_features}, got {tuple(lora_a.shape)}")
    if tuple(lora_b.shape) != (out_features, r):
        raise ValueError(f"{op}: lora_b must have shape ({out_features}, {r}) (out_features of {base}, rank of "
                         f"lora_a), got {tuple(lora_b.shape)}")
    return r


def merge_lora(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float,
               backend: str | None = None, *, inplace: bool = False) -> torch.Tensor:
    """weight + scale * lora_b @ lora_a, accumulated in fp32 and rounded once to weight's dtype.

    weight: (out, in) fp32/fp16/bf16; lora_a: (r, in); lora_b: (out, r), any float dtypes, weight's device;
    scale: lora_alpha / r (or / sqrt(r) for rsLoRA). Returns a new tensor, or with `inplace=True` writes the
    result into `weight` (a Parameter is updated without recording autograd history) and returns it.
    """
    check_float("weight", OP, weight)
    if weight.dim() != 2:
        raise ValueError(f"{OP}: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    check_adapter(OP, lora_a, lora_b, weight.shape[0], weight.shape[1], weight.device)
    scale = check_scale(OP, scale)
    if not isinstance(inplace, bool):
        raise TypeError(f"{OP}: inplace must be a bool, got {type(inplace).__name__}")
    if weight.numel() == 0:
        return weight if inplace else weight.clone()
    w, a, b = weight.contiguous(), lora_a.contiguous(), lora_b.contiguous()
    impl = registry.select(OP, {"weight": w, "lora_a": a, "lora_b": b}, backend)
    merged = _merge_lora_op(w, a, b, scale, impl.backend)
    if not inplace:
        return merged
    with torch.no_grad():
        weight.copy_(merged)
    return weight
