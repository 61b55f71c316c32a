"""The backward shared by layer_norm and rms_norm: argument checks, the saved input, and the four backends.

Backward contract (both ops; mean None for RMSNorm, weight None for RMSNorm without a scale):
  fn(dy, dh, h, weight, mean, rstd, need_weight, need_bias) -> (dx, dweight or None, dbias or None)
  dy, h: (rows, hidden) contiguous, one dtype; dh: like dy or None (the gradient arriving on the returned residual
  stream h); weight: (hidden,) contiguous or None; mean, rstd: (rows,) fp32 saved by the forward.
  xhat = (h - mean) * rstd, g = w * dy, per row:
    LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh
    RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat)) + dh
    dweight = sum over rows of dy * xhat, dbias = sum over rows of dy (fp32 sums, rounded once to weight's dtype).
triton: a row-block kernel with per-program partial dweight/dbias rows, summed in a second pass (hidden <= 8192);
cpu: C++/OpenMP over rows with per-thread partials reduced after; cuda: the same on the GPU (csrc/norm/norm_bwd.cu).
"""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.reference.layer_norm import layer_norm_ref, norm_bwd_ref, norm_stats_ref

# kernels.norm_bwd.MAX_HIDDEN (not imported: keeps triton out of import time)
TRITON_MAX_HIDDEN = 8192


def stat_or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


def check_bwd_inputs(op: str, dy, dh, h, weight, mean, rstd) -> None:
    """The backward op's inputs, checked before any kernel runs (errors name the argument)."""
    def fail(name, want, got):
        raise ValueError(f"{op}: {name} must be {want}, got {got}")
    if h.dim() != 2:
        fail("h", "(rows, hidden)", f"shape {tuple(h.shape)}")
    rows, hidden = h.shape
    for name, t in (("dy", dy), ("dh", dh)):
        if t is None:
            continue
        if tuple(t.shape) != (rows, hidden):
            fail(name, f"of shape {(rows, hidden)} (the forward's output)", f"shape {tuple(t.shape)}")
        if t.dtype != h.dtype:
            fail(name, f"{h.dtype} (the forward's output dtype)", str(t.dtype))
        if t.device != h.device:
            fail(name, f"on {h.device}", str(t.device))
    if weight is not None and (tuple(weight.shape) != (hidden,) or weight.dtype != h.dtype):
        fail("weight", f"({hidden},) {h.dtype}", f"{tuple(weight.shape)} {weight.dtype}")
    for name, t in (("mean", mean), ("rstd", rstd)):
        if t is None:
            continue
        if tuple(t.shape) != (rows,) or t.dtype != torch.float32:
            fail(name, f"({rows},) float32 (saved by the forward)", f"{tuple(t.shape)} {t.dtype}")


def saved_input(x, residual, input_bias, h, mean, rstd, eps, rms: bool):
    """The normalized input h and its statistics for the backward. A training forward saved both; a forward run
    without them (stats=False, e.g. the op called directly) has them recomputed here (one pass)."""
    if h is None or h.numel() == 0:
        if residual is not None or input_bias is not None:
            if rms:
                h = (x.float() + residual.float()).to(x.dtype)
            else:
                h = layer_norm_ref(x, torch.ones_like(x[0]), None, eps, residual, input_bias=input_bias)
                h = h[1] if residual is not None else (x.float() + input_bias.float()).to(x.dtype)
        else:
            h = x
    if rstd is None or rstd.numel() == 0:
        mean, rstd = norm_stats_ref(h, eps, rms=rms)
    return h, (None if rms else mean), rstd


def _reference_bwd(dy, dh, h, weight, mean, rstd, need_weight, need_bias):
    dx, dw, db = norm_bwd_ref(dy, h, weight, mean, rstd, dh)
    return dx, (dw if need_weight else None), (db if need_bias else None)


def _triton_check(inputs) -> list[str]:
    n = inputs["h"].shape[-1]
    return [] if n <= TRITON_MAX_HIDDEN else [f"hidden {n} > {TRITON_MAX_HIDDEN} (backward kernel keeps a row in registers)"]


def register_backends(op_bwd: str) -> None:
    _backends.implement(op_bwd, "reference", _reference_bwd)
    _backends.implement(op_bwd, "triton", "fastenc.kernels.norm_bwd", "norm_bwd", check=_triton_check,
                        limits=f"hidden <= {TRITON_MAX_HIDDEN}")
    _backends.implement(op_bwd, "cpu", "norm_bwd", limits="fp32 math; per-thread dweight/dbias partials")
    _backends.implement(op_bwd, "cuda", "norm_bwd_cuda", limits="fp32 math; per-block dweight/dbias partials")


def ones_weight(fn):
    """Backends whose kernels always scale: RMSNorm without a weight runs with w = 1 (hidden elements)."""
    def call(x, weight, *args, **kwargs):
        if weight is None:
            weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        return fn(x, weight, *args, **kwargs)
    call.__name__ = getattr(fn, "__name__", "norm")
    return call


def stats_keyword(fn):
    """A C++ forward taking `stats` positionally and always returning (y, h, mean, rstd) -> the Triton launchers'
    form: (y, h), or (y, h, mean, rstd) with stats=True."""
    def call(*args, stats=False):
        out = fn(*args, stats)
        return tuple(out) if stats else tuple(out[:2])
    call.__name__ = getattr(fn, "__name__", "norm")
    return call


__all__ = ["check_bwd_inputs", "saved_input", "register_backends", "stat_or_empty", "ones_weight", "stats_keyword", "registry"]
