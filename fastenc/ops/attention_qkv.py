"""fastenc.ops.attention_qkv: varlen attention straight from one fused QKV projection's output, with its gradient
returned in one buffer of the same layout.

qkv: (total_tokens, 3 * heads * head_dim), each row [q | k | v], each block (heads, head_dim), as a fused Wqkv
GEMM writes it. q, k and v are its three column blocks (views with row stride 3 * hidden): the cpu kernels read
them in place, and the backward writes dq, dk, dv into the column blocks of one (total_tokens, 3 * hidden)
gradient (no copies of q, k, v, no concatenation of their gradients). Backends that need contiguous tensors get
copies (fastenc/ops/attention.py), and their three gradients are concatenated. The math, the dropout keep-mask
and the backend choice are those of fastenc.ops.attention (the same registry entries, forward and backward). A distance bias (relative_bias / alibi_slopes, as
fastenc.ops.attention) goes to the kernels as the same per-distance lookup; its backward is
fastenc::attention_qkv_bwd_bias (-> d qkv and the gradients of the relative terms). Per-token positions and
DeBERTa's disentangled c2p / p2c travel as in fastenc.ops.attention (the same backend calling convention).
"""
from __future__ import annotations

import contextlib
import math

import torch

from fastenc import registry
from fastenc.ops._attention_bwd import OP_BWD, WRITES_GRAD_QKV, check_bwd_args
from fastenc.ops._common import check_cu_seqlens, check_float, draw_seed_offset
from fastenc.ops._library import custom_op
from fastenc.ops._attention_bwd import check_relative_args
from fastenc.ops.attention import (OP, _check_generator, _dropout_p, _max_seqlen, _Relative, _window,
                                   check_disentangled, check_distance_bias, check_positions, select)
from fastenc.registry import _dt

NAME = "attention_qkv"


def _named(name: str):
    """The kernels run under the names of fastenc::attention / attention_bwd in the profiler (what runs is theirs)."""
    on = torch.autograd.profiler._is_profiler_enabled
    return torch.profiler.record_function(name) if on else contextlib.nullcontext()


def _split(qkv: torch.Tensor, heads: int):
    """(q, k, v) views (total_tokens, heads, head_dim) of qkv's three column blocks."""
    t = qkv.shape[0]
    return qkv.view(t, 3, heads, qkv.shape[1] // (3 * heads)).unbind(1)


@custom_op("fastenc::attention_qkv", mutates_args=())
def _attention_qkv_op(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int,
                      window_right: int, scale: float, heads: int, backend: str, dropout_p: float = 0.0,
                      seed: int = 0, offset: int = 0, bias: torch.Tensor | None = None,
                      positions: torch.Tensor | None = None, c2p: torch.Tensor | None = None,
                      p2c: torch.Tensor | None = None,
                      slot: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _split(qkv, heads)
    fn = registry.impl(OP, backend).fn
    args = (q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale)
    rel = (bias, positions, c2p, p2c, slot)
    with _named("fastenc::attention"):
        if any(t is not None for t in rel):
            return fn(*args, dropout_p, seed, offset, *rel)
        out, lse = fn(*args, dropout_p, seed, offset) if dropout_p > 0 else fn(*args)
    return out, lse


@_attention_qkv_op.register_fake
def _(qkv, cu_seqlens, max_seqlen, window_left, window_right, scale, heads, backend, dropout_p=0.0, seed=0,
      offset=0, bias=None, positions=None, c2p=None, p2c=None, slot=None):
    t, d = qkv.shape[0], qkv.shape[1] // (3 * heads)
    return qkv.new_empty((t, heads, d)), qkv.new_empty((heads, t), dtype=torch.float32)


@custom_op("fastenc::attention_qkv_bwd", mutates_args=())
def _attention_qkv_bwd_op(grad: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int, window_right: int, scale: float,
                          heads: int, backend: str, dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
                          need_dq: bool = True, need_dkdv: bool = True) -> torch.Tensor:
    """-> d qkv (total_tokens, 3 * hidden) in qkv's dtype; blocks of gradients not needed are zero."""
    return _qkv_grads(grad, qkv, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, heads, backend,
                      dropout_p, seed, offset, need_dq, need_dkdv)[0]


def _qkv_grads(grad, qkv, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, heads, backend,
               dropout_p, seed, offset, need_dq, need_dkdv, rel=None):
    """(d qkv, (dbias, dc2p, dp2c) or None): the backends' backward into one (total_tokens, 3 * hidden) buffer.
    rel: (bias, positions, c2p, p2c, slot) or None."""
    q, k, v = _split(qkv, heads)
    check_bwd_args(grad, q, k, v, out, lse)
    if rel is not None:
        check_relative_args(q, *rel, op=NAME + "_bwd")
    impl = registry.impl(OP_BWD, backend)
    args = (grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p, seed,
            offset, need_dq, need_dkdv) + (tuple(rel) if rel is not None else ())
    if impl in WRITES_GRAD_QKV and qkv.dtype == torch.float32:
        dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
        with _named("fastenc::attention_bwd"):
            res = impl.fn(*args, grad_qkv=dqkv)
        return dqkv, (tuple(res[3:6]) if rel is not None else None)
    with _named("fastenc::attention_bwd"):
        dq, dk, dv, *drel = impl.fn(*args)
    zero = torch.zeros_like(q)
    parts = (dq if need_dq else zero, dk if need_dkdv else zero, dv if need_dkdv else zero)
    return torch.stack(parts, 1).view(qkv.shape), (tuple(drel[:3]) if rel is not None else None)


@custom_op("fastenc::attention_qkv_bwd_bias", mutates_args=())
def _attention_qkv_bwd_bias_op(grad: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                               cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int, window_right: int,
                               scale: float, heads: int, backend: str, dropout_p: float, seed: int, offset: int,
                               bias: torch.Tensor | None, positions: torch.Tensor | None = None,
                               c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                               slot: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (d qkv (total_tokens, 3 * hidden) in qkv's dtype, d bias (heads, 2L - 1) fp32, d c2p, d p2c in their
    inputs' dtype; empty (numel 0) where that input is None)."""
    rel = (bias, positions, c2p, p2c, slot)
    dqkv, (dbias, dc2p, dp2c) = _qkv_grads(grad, qkv, out, lse, cu_seqlens, max_seqlen, window_left, window_right,
                                           scale, heads, backend, dropout_p, seed, offset, True, True, rel)
    return (dqkv, dbias, dc2p if c2p is None else dc2p.to(c2p.dtype), dp2c if p2c is None else dp2c.to(p2c.dtype))


@_attention_qkv_bwd_bias_op.register_fake
def _(grad, qkv, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, heads, backend, dropout_p, seed,
      offset, bias, positions=None, c2p=None, p2c=None, slot=None):
    def like(t):
        return qkv.new_empty(0, dtype=torch.float32) if t is None else torch.empty_like(t)
    return torch.empty_like(qkv), like(bias), like(c2p), like(p2c)


@_attention_qkv_bwd_op.register_fake
def _(grad, qkv, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, heads, backend, dropout_p=0.0,
      seed=0, offset=0, need_dq=True, need_dkdv=True):
    return torch.empty_like(qkv)


def _setup_context(ctx, inputs, output):
    """Saves qkv, out, lse, cu_seqlens (and the relative terms); with dropout only (seed, offset) besides (never the
    mask)."""
    qkv, cu_seqlens, max_seqlen, wl, wr, scale, heads, backend, *rest = inputs
    out, lse = output
    drop, rel = rest[:3], tuple(rest[3:8]) + (None,) * (5 - len(rest[3:8]))
    ctx.save_for_backward(qkv, out, lse, cu_seqlens, *rel)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # (no zero gradient is made for lse, nor for an unused out)
    ctx.args = (max_seqlen, wl, wr, scale, heads, backend)
    ctx.dropout = tuple(drop) + (0.0, 0, 0)[len(drop):]


# Positions of the relative terms among fastenc::attention_qkv's inputs: bias, positions, c2p, p2c, slot.
_BIAS, _C2P, _P2C = 11, 13, 14


def _backward(ctx, grad, _grad_lse):
    n_in = len(ctx.needs_input_grad)
    nones = (None,) * (n_in - 1)
    need_rel = [n_in > i and ctx.needs_input_grad[i] for i in (_BIAS, _C2P, _P2C)]
    if not (ctx.needs_input_grad[0] or any(need_rel)) or grad is None:
        return (None,) + nones
    qkv, out, lse, cu_seqlens, *rel = ctx.saved_tensors
    max_seqlen, wl, wr, scale, heads, backend = ctx.args
    if tuple(grad.shape) != tuple(out.shape) or grad.dtype != out.dtype:
        raise ValueError(f"{NAME} backward: grad must be {_dt(out.dtype)} of shape {tuple(out.shape)}, got "
                         f"{_dt(grad.dtype)} {tuple(grad.shape)}")
    dropout_p, seed, offset = ctx.dropout
    if any(t is not None for t in rel):
        dqkv, *drel = _attention_qkv_bwd_bias_op(grad.contiguous(), qkv, out, lse, cu_seqlens, max_seqlen, wl, wr,
                                                 scale, heads, backend, dropout_p, seed, offset, *rel)
        grads = [dqkv if ctx.needs_input_grad[0] else None, *nones]
        for i, want, g in zip((_BIAS, _C2P, _P2C), need_rel, drel):
            if want:
                grads[i] = g
        return tuple(grads)
    dqkv = _attention_qkv_bwd_op(grad.contiguous(), qkv, out, lse, cu_seqlens, max_seqlen, wl, wr, scale, heads,
                                 backend, dropout_p, seed, offset)
    return (dqkv,) + nones


_attention_qkv_op.register_autograd(_backward, setup_context=_setup_context)


def attention_qkv(qkv: torch.Tensor, heads: int, *, cu_seqlens: torch.Tensor, max_seqlen: int | None = None,
                  window=None, scale: float | None = None, dropout_p: float = 0.0,
                  generator: torch.Generator | None = None, relative_bias: torch.Tensor | None = None,
                  relative_max_distance: int = 128, alibi_slopes: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None, c2p: torch.Tensor | None = None,
                  p2c: torch.Tensor | None = None, rel_span: int | None = None, position_buckets: int = 0,
                  max_relative_positions: int | None = None, backend: str | None = None) -> torch.Tensor:
    """Packed non-causal attention of qkv's three column blocks: the same result (and gradient) as
    fastenc.ops.attention(q, k, v, cu_seqlens=...) with q, k, v = qkv.view(tokens, 3, heads, head_dim).unbind(1).

    qkv: (total_tokens, 3 * heads * head_dim) fp32/fp16/bf16, unit column stride (any row stride);
    heads: int > 0; cu_seqlens int32 (batch+1,). window, scale, dropout_p, generator, relative_bias,
    relative_max_distance, alibi_slopes (the distance bias), positions ((total_tokens,) int32/int64 per-token
    positions), c2p, p2c ((total_tokens, heads, 2 * rel_span) in qkv's dtype: DeBERTa's disentangled terms),
    rel_span, position_buckets, max_relative_positions, backend: as fastenc.ops.attention (packed layout).
    Returns (total_tokens, heads, head_dim) in qkv's dtype.
    """
    check_float("qkv", NAME, qkv)
    if isinstance(heads, bool) or not isinstance(heads, int) or heads <= 0:
        raise ValueError(f"{NAME}: heads must be a positive int, got {heads!r}")
    if qkv.dim() != 2 or qkv.shape[1] % (3 * heads):
        raise ValueError(f"{NAME}: qkv must be (total_tokens, 3 * heads * head_dim) with heads={heads}, got shape "
                         f"{tuple(qkv.shape)}")
    if qkv.shape[1] and qkv.stride(1) != 1:
        qkv = qkv.contiguous()  # the column blocks must be views of rows: (tokens, 3, heads, head_dim)
    wl, wr = _window(window)
    p = _dropout_p(dropout_p)
    _check_generator(generator)
    d = qkv.shape[1] // (3 * heads)
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{NAME}: scale must be a finite float, got {scale!r}")
    cu = check_cu_seqlens(cu_seqlens, qkv.shape[0], qkv.device, op=NAME, max_seqlen=_max_seqlen(max_seqlen))
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    t = qkv.shape[0]
    q, k, v = _split(qkv, heads)
    biased = check_distance_bias(q, relative_bias, relative_max_distance, alibi_slopes, op=NAME)
    dis = check_disentangled(q, c2p, p2c, rel_span, position_buckets, max_relative_positions, (t,), op=NAME)
    if positions is not None:
        if not biased and dis is None:
            raise ValueError(f"{NAME}: positions are given but no relative term (relative_bias, alibi_slopes, c2p, "
                             "p2c) uses them")
        positions = check_positions(positions, (t,), qkv.device, op=NAME)
    if qkv.numel() == 0:
        return qkv.new_zeros((t, heads, d))
    rel = _Relative(relative_bias, relative_max_distance, alibi_slopes, c2p, p2c, dis, biased).build(longest,
                                                                                                      positions)
    # (select also chooses the backward when qkv needs a gradient)
    impl, wl, wr = select(q, k, v, cu_seqlens, longest, wl, wr, float(scale), backend, p, rel)
    args = (qkv, cu_seqlens, longest, wl, wr, float(scale), heads, impl.backend)
    if rel is not None:
        seed, offset = draw_seed_offset(generator) if p > 0 else (0, 0)
        return _attention_qkv_op(*args, p, seed, offset, *rel)[0]
    if p > 0:
        seed, offset = draw_seed_offset(generator)
        return _attention_qkv_op(*args, p, seed, offset)[0]
    return _attention_qkv_op(*args)[0]
