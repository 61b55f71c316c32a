"""fastenc.ops.layer_norm: LayerNorm over the last dim, optional bias, optional fused residual add, optional fused
bias of the preceding linear (`input_bias`), optionally without writing x + residual back (post-norm blocks);
with its backward (the forward of a training step also writes the per-row mean and rstd, fp32, for it).

Every backend implements one forward contract:
  fn(x, weight, bias, residual, input_bias, eps, store_residual, stats) -> (y, h or None, mean or None, rstd or None)
  x, residual: (rows, hidden) contiguous; weight, bias, input_bias: (hidden,) contiguous, x's dtype.
  h = x + input_bias + residual (x's dtype) when store_residual and something is added; mean, rstd: (rows,) fp32
  when stats. And one backward contract (shared with rms_norm, mean None there; see fastenc/ops/_norm_bwd.py):
  fn(dy, dh, h, weight, mean, rstd, need_weight, need_bias) -> (dx, dweight or None, dbias or None)
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends, _norm_bwd
from fastenc.ops._common import (as_shape, check_eps, check_float, check_like, empty_or, needs_grad, rows_view)
from fastenc.ops._library import custom_op
from fastenc.reference.layer_norm import layer_norm_ref, norm_stats_ref

OP = "layer_norm"
OP_BWD = "layer_norm_bwd"


def _reference(x, weight, bias, residual, input_bias, eps, store_residual, stats):
    """x, residual: (rows, hidden) contiguous -> (y, x + input_bias + residual or None, mean, rstd or None)."""
    added = residual is not None or input_bias is not None
    out = layer_norm_ref(x, weight, bias, eps, residual, input_bias=input_bias)
    y = out[0] if residual is not None else out
    h = None
    if added and (store_residual or stats):
        h = out[1] if residual is not None else (x.float() + input_bias.float()).to(x.dtype)
    mean, rstd = norm_stats_ref(h if added else x, eps) if stats else (None, None)
    return y, (h if store_residual else None), mean, rstd


def _pre_added(fn):
    """Backends whose kernel has no input bias: x + input_bias is formed first (one extra pass, same result
    up to the rounding of that sum in x's dtype)."""
    def call(x, weight, bias, residual, input_bias, eps, store_residual, stats):
        if input_bias is not None:
            x = x + input_bias
        if stats:
            y, h, mean, rstd = fn(x, weight, bias, residual, eps, stats=True)
        else:
            (y, h), mean, rstd = fn(x, weight, bias, residual, eps), None, None
        if h is None and input_bias is not None:
            h = x
        return y, h if store_residual else None, mean, rstd
    call.__name__ = getattr(fn, "__name__", "norm")
    return call


@custom_op("fastenc::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], input_bias: Optional[torch.Tensor], eps: float,
                   store_residual: bool, stats: bool, backend: str
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, mean, rstd = registry.impl(OP, backend).fn(x, weight, bias, residual, input_bias, eps, store_residual,
                                                     stats)
    return y, empty_or(h, x), _norm_bwd.stat_or_empty(mean, x), _norm_bwd.stat_or_empty(rstd, x)


@_layer_norm_op.register_fake
def _(x, weight, bias, residual, input_bias, eps, store_residual, stats, backend):
    keep = (residual is not None or input_bias is not None) and store_residual
    stat = (lambda: x.new_empty(x.shape[0], dtype=torch.float32)) if stats else (lambda: x.new_empty(0, dtype=torch.float32))
    return torch.empty_like(x), (torch.empty_like(x) if keep else x.new_empty(0)), stat(), stat()


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.layer_norm", "layer_norm_fwd", wrap=_pre_added,
                    limits="CUDA; CPU tensors under TRITON_INTERPRET=1; input_bias added before the kernel")
_backends.implement(OP, "cpu", "layer_norm", limits="fp32 math; input_bias fused")
_backends.implement(OP, "cuda", "layer_norm_cuda", wrap=lambda f: _pre_added(_norm_bwd.stats_keyword(f)),
                    limits="input_bias added before the kernel")


# ---- backward: fastenc::layer_norm_bwd, one Impl per backend (fastenc/ops/_norm_bwd.py)

@custom_op("fastenc::layer_norm_bwd", mutates_args=())
def _layer_norm_bwd_op(dy: torch.Tensor, dh: Optional[torch.Tensor], h: torch.Tensor, weight: torch.Tensor,
                       mean: torch.Tensor, rstd: torch.Tensor, need_weight: bool, need_bias: bool, backend: str
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, dh (or None), h: (rows, hidden); weight: (hidden,); mean, rstd: (rows,) fp32 ->
    (dx like h, dweight and dbias like weight, each empty when not asked for)."""
    _norm_bwd.check_bwd_inputs(OP_BWD, dy, dh, h, weight, mean, rstd)
    dx, dw, db = registry.impl(OP_BWD, backend).fn(dy, dh, h, weight, mean, rstd, need_weight, need_bias)
    return dx, empty_or(dw if need_weight else None, weight), empty_or(db if need_bias else None, weight)


@_layer_norm_bwd_op.register_fake
def _(dy, dh, h, weight, mean, rstd, need_weight, need_bias, backend):
    return (torch.empty_like(h), torch.empty_like(weight) if need_weight else weight.new_empty(0),
            torch.empty_like(weight) if need_bias else weight.new_empty(0))


_norm_bwd.register_backends(OP_BWD)


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, input_bias, eps, store_residual, stats, backend = inputs
    _, h, mean, rstd = output
    if h.numel() and mean.numel():  # h and its statistics are all the backward reads: x and residual not kept
        x = residual = None
    ctx.save_for_backward(x, weight, residual, input_bias, h, mean, rstd)
    ctx.eps, ctx.backend = eps, backend


def _backward(ctx, dy, dh, _dmean, _drstd):
    x, weight, residual, input_bias, h, mean, rstd = ctx.saved_tensors
    need_x, need_w, need_b, need_r, need_ib = ctx.needs_input_grad[:5]
    if not (need_x or need_w or need_b or need_r or need_ib):
        return (None,) * 9
    hn, mean, rstd = _norm_bwd.saved_input(x, residual, input_bias, h, mean, rstd, ctx.eps, rms=False)
    dy = dy.contiguous()
    dh = dh.contiguous() if dh is not None and dh.numel() == dy.numel() and dh.numel() else None
    impl = registry.select_backward(OP_BWD, {"dy": dy, "h": hn, "weight": weight}, ctx.backend)
    dx, dw, db = _layer_norm_bwd_op(dy, dh, hn, weight, mean, rstd, need_w, need_b, impl.backend)
    dib = dx.sum(0, dtype=torch.float32).to(input_bias.dtype) if need_ib else None
    return ((dx if need_x else None), (dw if need_w else None), (db if need_b else None),
            (dx if need_r else None), dib, None, None, None, None)


_layer_norm_op.register_autograd(_backward, _setup_context)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
               residual: torch.Tensor | None = None, backend: str | None = None, *,
               input_bias: torch.Tensor | None = None, return_residual: bool = True):
    """LayerNorm of h = x (+ input_bias) (+ residual) over the last dim.

    x: (..., hidden) fp32/fp16/bf16; weight, bias, input_bias: (hidden,) same dtype as x; residual: like x.
    input_bias: the bias of the linear that produced x, fused here (that linear runs without it).
    Returns y (like x), or (y, h) when `residual` is given (the pre-norm residual stream);
    return_residual=False returns y alone and never writes h (post-norm blocks, BERT).
    Differentiable in x, weight, bias, residual and input_bias (and through h when it is returned).
    """
    check_float("x", OP, x)
    if x.dim() == 0:
        raise ValueError(f"{OP}: x must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    if weight is None:
        raise TypeError(f"{OP}: weight is required")
    check_like("weight", OP, weight, x, shape=(hidden,))
    check_like("bias", OP, bias, x, shape=(hidden,))
    check_like("residual", OP, residual, x, shape=tuple(x.shape))
    check_like("input_bias", OP, input_bias, x, shape=(hidden,))
    if not isinstance(return_residual, bool):
        raise TypeError(f"{OP}: return_residual must be a bool, got {type(return_residual).__name__}")
    eps = check_eps(OP, eps)
    keep = residual is not None and return_residual
    if x.numel() == 0:
        return (x.new_empty(x.shape), x.new_empty(x.shape)) if keep else x.new_empty(x.shape)
    x2 = rows_view(x, hidden)
    r2 = rows_view(residual, hidden) if residual is not None else None
    ib = None if input_bias is None else input_bias.contiguous()
    impl = registry.select(OP, {"x": x2, "weight": weight, "bias": bias, "residual": r2}, backend)
    stats = needs_grad(x, weight, bias, residual, input_bias)
    if stats:  # an unservable backward fails here, before the forward runs
        registry.select_backward(OP_BWD, {"dy": x2, "h": x2, "weight": weight}, impl.backend)
    # A training forward keeps h = x + input_bias + residual (the normalized input) for the backward.
    store = keep or (stats and (residual is not None or input_bias is not None))
    y, h, _, _ = _layer_norm_op(x2, weight.contiguous(), None if bias is None else bias.contiguous(), r2, ib, eps,
                                store, stats, impl.backend)
    y = as_shape(y, x.shape)
    return (y, as_shape(h, x.shape)) if keep else y
