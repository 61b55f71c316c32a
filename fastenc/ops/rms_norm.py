"""fastenc.ops.rms_norm: RMSNorm over the last dim, optional weight, optional fused residual add; with its backward
(a training forward also writes the per-row rstd, fp32).

Forward contract of every backend:
  fn(x, weight, residual, eps, stats) -> (y, h = x + residual or None, rstd or None)
  x, residual: (rows, hidden) contiguous; weight: (hidden,) contiguous in x's dtype, or None (no scale).
Backward: the norm backward of fastenc/ops/_norm_bwd.py with mean None.
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends, _norm_bwd
from fastenc.ops._common import as_shape, check_eps, check_float, check_like, empty_or, needs_grad, rows_view
from fastenc.ops._library import custom_op
from fastenc.reference.layer_norm import norm_stats_ref
from fastenc.reference.rms_norm import rms_norm_ref

OP = "rms_norm"
OP_BWD = "rms_norm_bwd"


def _reference(x, weight, residual, eps, stats):
    out = rms_norm_ref(x, weight, eps, residual)
    y, h = out if residual is not None else (out, None)
    return y, h, (norm_stats_ref(h if h is not None else x, eps, rms=True)[1] if stats else None)


def _with_stats(fn):
    """The kernels' (y, h) or, with stats, (y, h, mean, rstd) -> (y, h, rstd or None)."""
    def call(x, weight, residual, eps, stats):
        if stats:
            y, h, _, rstd = fn(x, weight, residual, eps, stats=True)
            return y, h, rstd
        y, h = fn(x, weight, residual, eps)
        return y, h, None
    call.__name__ = getattr(fn, "__name__", "rms_norm")
    return call


@custom_op("fastenc::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], residual: Optional[torch.Tensor], eps: float,
                 stats: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, rstd = registry.impl(OP, backend).fn(x, weight, residual, eps, stats)
    return y, empty_or(h, x), _norm_bwd.stat_or_empty(rstd, x)


@_rms_norm_op.register_fake
def _(x, weight, residual, eps, stats, backend):
    return (torch.empty_like(x), (torch.empty_like(x) if residual is not None else x.new_empty(0)),
            x.new_empty(x.shape[0] if stats else 0, dtype=torch.float32))


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.rms_norm", "rms_norm_fwd",
                    wrap=lambda f: _with_stats(_norm_bwd.ones_weight(f)))
_backends.implement(OP, "cpu", "rms_norm")
_backends.implement(OP, "cuda", "rms_norm_cuda",
                    wrap=lambda f: _with_stats(_norm_bwd.ones_weight(_norm_bwd.stats_keyword(f))))


# ---- backward

@custom_op("fastenc::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(dy: torch.Tensor, dh: Optional[torch.Tensor], h: torch.Tensor, weight: Optional[torch.Tensor],
                     rstd: torch.Tensor, need_weight: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, dh (or None), h: (rows, hidden); weight: (hidden,) or None; rstd: (rows,) fp32 ->
    (dx like h, dweight like weight, empty when not asked for or without a weight)."""
    _norm_bwd.check_bwd_inputs(OP_BWD, dy, dh, h, weight, None, rstd)
    need_weight = need_weight and weight is not None
    w = weight
    if w is None and backend != "reference":
        w = torch.ones(h.shape[1], dtype=h.dtype, device=h.device)
    dx, dw, _ = registry.impl(OP_BWD, backend).fn(dy, dh, h, w, None, rstd, need_weight, False)
    return dx, empty_or(dw if need_weight else None, h)


@_rms_norm_bwd_op.register_fake
def _(dy, dh, h, weight, rstd, need_weight, backend):
    return torch.empty_like(h), (torch.empty_like(weight) if need_weight and weight is not None else h.new_empty(0))


_norm_bwd.register_backends(OP_BWD)


def _setup_context(ctx, inputs, output):
    x, weight, residual, eps, stats, backend = inputs
    _, h, rstd = output
    if h.numel() and rstd.numel():  # h and rstd are all the backward reads: x and residual not kept
        x = residual = None
    ctx.save_for_backward(x, weight, residual, h, rstd)
    ctx.eps, ctx.backend = eps, backend


def _backward(ctx, dy, dh, _drstd):
    x, weight, residual, h, rstd = ctx.saved_tensors
    need_x, need_w, need_r = ctx.needs_input_grad[:3]
    if not (need_x or need_w or need_r):
        return (None,) * 6
    hn, _, rstd = _norm_bwd.saved_input(x, residual, None, h, None, rstd, ctx.eps, rms=True)
    dy = dy.contiguous()
    dh = dh.contiguous() if dh is not None and dh.numel() and dh.numel() == dy.numel() else None
    impl = registry.select_backward(OP_BWD, {"dy": dy, "h": hn, "weight": weight}, ctx.backend)
    dx, dw = _rms_norm_bwd_op(dy, dh, hn, weight, rstd, bool(need_w), impl.backend)
    return (dx if need_x else None), (dw if need_w else None), (dx if need_r else None), None, None, None


_rms_norm_op.register_autograd(_backward, _setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, residual: torch.Tensor | None = None,
             backend: str | None = None):
    """RMSNorm of `x` (or of `x + residual`) over the last dim: y = h * rsqrt(mean(h^2) + eps) (* weight).

    x: (..., hidden) fp32/fp16/bf16; weight: (hidden,) same dtype, or None (plain normalization); residual: like x.
    Returns y, or (y, x + residual) when `residual` is given. Differentiable in x, weight and residual.
    """
    check_float("x", OP, x)
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    check_like("weight", OP, weight, x, shape=(hidden,))
    check_like("residual", OP, residual, x, shape=tuple(x.shape))
    eps = check_eps(OP, eps)
    if x.numel() == 0:
        return x.new_empty(x.shape) if residual is None else (x.new_empty(x.shape), x.new_empty(x.shape))
    x2 = rows_view(x, hidden)
    r2 = rows_view(residual, hidden) if residual is not None else None
    w = None if weight is None else weight.contiguous()
    impl = registry.select(OP, {"x": x2, "weight": w, "residual": r2}, backend)
    stats = needs_grad(x, weight, residual)
    if stats:  # an unservable backward fails here, before the forward runs
        registry.select_backward(OP_BWD, {"dy": x2, "h": x2, "weight": w}, impl.backend)
    y, h, _ = _rms_norm_op(x2, w, r2, eps, stats, impl.backend)
    y = as_shape(y, x.shape)
    return y if residual is None else (y, as_shape(h, x.shape))
