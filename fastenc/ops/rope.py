"""fastenc.ops.rope: rotate-half rotary embedding of q and k in one launch (transformers' convention)."""
from __future__ import annotations

import math

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_cu_seqlens, check_float, needs_grad
from fastenc.ops._library import custom_op
from fastenc.reference.rope import check_positions, rope_bwd_ref, rope_cache, rope_ref

OP = "rope"
OP_BWD = "rope_bwd"


def _reference(q, k, cos, sin, positions):
    return rope_ref(q, k, cos, sin, positions)


@custom_op("fastenc::rope", mutates_args=())
def _rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
             backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return registry.impl(OP, backend).fn(q, k, cos, sin, positions)


@_rope_op.register_fake
def _(q, k, cos, sin, positions, backend):
    return torch.empty_like(q), torch.empty_like(k)


_backends.implement(OP, "reference", _reference)
_backends.implement(OP, "triton", "fastenc.kernels.rope", "rope_fwd")
_backends.implement(OP, "cpu", "rope")
# Backends whose kernels read q, k (and the output gradients) with any token stride, each token's (heads, dim)
# block contiguous (csrc/cpu/rope.cpp); the others get contiguous copies.
_TOKEN_STRIDED = ("cpu",)
_backends.implement(OP, "cuda", "rope_cuda")


# ---- backward: the rotation is orthogonal, so d q = R(-angle) d q_rot (sin -> -sin), dims past R pass through;
# nothing saved but the (shared) tables and positions. cos/sin get no gradient.

def _reference_bwd(grad_q, grad_k, cos, sin, positions):
    return rope_bwd_ref(grad_q, grad_k, cos, sin, positions)


@custom_op("fastenc::rope_bwd", mutates_args=())
def _rope_bwd_op(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """grad_q: (T, Hq, D), grad_k: (T, Hk, D) (Hq or Hk may be 0 for a side that needs no gradient)."""
    if (grad_q.dim() != 3 or grad_k.dim() != 3 or grad_k.shape[0] != grad_q.shape[0]
            or grad_k.shape[2] != grad_q.shape[2] or grad_k.dtype != grad_q.dtype):
        raise ValueError(f"{OP}: grad_q and grad_k must be (tokens, heads, dim) with equal tokens, dim and dtype, got "
                         f"{tuple(grad_q.shape)} {grad_q.dtype} and {tuple(grad_k.shape)} {grad_k.dtype}")
    if positions.shape != (grad_q.shape[0],):
        raise ValueError(f"{OP}: positions must be ({grad_q.shape[0]},) for grad_q {tuple(grad_q.shape)}, got "
                         f"{tuple(positions.shape)}")
    return registry.impl(OP_BWD, backend).fn(grad_q, grad_k, cos, sin, positions)


@_rope_bwd_op.register_fake
def _(grad_q, grad_k, cos, sin, positions, backend):
    return torch.empty_like(grad_q), torch.empty_like(grad_k)


_backends.implement(OP_BWD, "reference", _reference_bwd)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.rope", "rope_bwd")
_backends.implement(OP_BWD, "cpu", "rope_bwd")
_backends.implement(OP_BWD, "cuda", "rope_bwd_cuda")


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, positions, backend = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.backend = backend
    ctx.shapes = (q.shape, k.shape, q.dtype)


def _side(grad, shape, dtype, needed):
    """The output gradient of one side as a (T, H, D) tensor (any strides: see _backward), or a (T, 0, D) one when
    not needed (the kernels then do no work for it)."""
    if not needed:
        return torch.empty((shape[0], 0, shape[2]), dtype=dtype, device=grad.device if grad is not None else None)
    if grad is None:  # an output that did not reach the loss
        return torch.zeros(shape, dtype=dtype)
    if grad.shape != shape or grad.dtype != dtype:
        raise ValueError(f"{OP}: output gradient must be {tuple(shape)} {dtype}, got {tuple(grad.shape)} {grad.dtype}")
    return grad


def _backward(ctx, grad_q, grad_k):
    need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_q or need_k):
        return None, None, None, None, None, None
    cos, sin, positions = ctx.saved_tensors
    q_shape, k_shape, dtype = ctx.shapes
    gq = _side(grad_q, q_shape, dtype, need_q).to(cos.device)
    gk = _side(grad_k, k_shape, dtype, need_k).to(cos.device)
    impl = registry.select_backward(OP_BWD, {"grad_q": gq, "grad_k": gk, "cos": cos, "sin": sin,
                                             "positions": positions}, ctx.backend)
    if impl.backend not in _TOKEN_STRIDED:
        gq, gk = gq.contiguous(), gk.contiguous()
    dq, dk = _rope_bwd_op(gq, gk, cos, sin, positions, impl.backend)
    return (dq if need_q else None), (dk if need_k else None), None, None, None, None


_rope_op.register_autograd(_backward, _setup_context)


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Position of each packed token inside its own sequence: t - cu_seqlens[seq(t)]. Returns int32 (total,)."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    starts = torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    return (torch.arange(total, device=cu.device) - starts).to(torch.int32)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         position_ids: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
         backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (rotate-half convention, as transformers' apply_rotary_pos_emb).

    q: (batch, seq, heads_q, D) or packed (tokens, heads_q, D); k: same layout with heads_k heads.
    cos, sin: (max_positions, R/2) from `rope_cache` (rotary dim R <= D, even; the rest of D passes through).
    position_ids: (batch, seq) or (seq,) for the 4-D layout, (tokens,) for packed; default 0..seq-1 per
    sequence; (1, seq) broadcasts over the batch. cu_seqlens: int32 (batch+1,) for packed input, positions restart
    at each sequence. Returns (q_rot, k_rot), same shapes and dtypes as q and k; differentiable in q and k.

    Positions are never read back to the host here (no device sync per layer): each backend checks every position
    where it reads it. On CPU a position outside [0, max_positions) raises ValueError; on a GPU the kernels never
    read outside cos/sin and write that token's rows as NaN. cu_seqlens is read and validated on the host at every
    call (nothing remembered from an earlier one), and the positions made from it are checked where they are read.
    """
    check_float("q", OP, q)
    check_float("k", OP, k)
    check_float("cos", OP, cos)
    check_float("sin", OP, sin)
    if q.dim() not in (3, 4):
        raise ValueError(f"{OP}: q must be (batch, seq, heads, dim) or (tokens, heads, dim), got shape {tuple(q.shape)}")
    if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{OP}: k must match q's layout {tuple(q.shape[:-2])}+(heads, {q.shape[-1]}), "
                         f"got shape {tuple(k.shape)}")
    if k.dtype != q.dtype or k.device != q.device:
        raise TypeError(f"{OP}: k must have q's dtype and device ({q.dtype}, {q.device}), got ({k.dtype}, {k.device})")
    d = q.shape[-1]
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"{OP}: cos and sin must both be (max_positions, rotary_dim/2), got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    if cos.shape[1] * 2 > d or cos.shape[1] == 0:
        raise ValueError(f"{OP}: cos/sin last dim must be in 1..head_dim/2={d // 2}, got {cos.shape[1]}")
    if cos.device != q.device or sin.device != q.device:
        raise ValueError(f"{OP}: cos/sin must be on q's device {q.device}, got {cos.device}")
    if cu_seqlens is not None and q.dim() != 3:
        raise ValueError(f"{OP}: cu_seqlens is for the packed (tokens, heads, dim) layout, got q of shape {tuple(q.shape)}")
    if cu_seqlens is not None and position_ids is not None:
        raise ValueError(f"{OP}: give position_ids or cu_seqlens, not both")
    lead = q.shape[:-2]
    tokens = math.prod(lead)
    rows = cos.shape[0]
    if position_ids is not None:
        if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{OP}: position_ids must be an int32/int64 tensor, got "
                            f"{getattr(position_ids, 'dtype', type(position_ids).__name__)}")
        if position_ids.device.type == "meta" and q.device.type != "meta":
            raise ValueError(f"{OP}: position_ids must be on q's device {q.device}, got a meta tensor (no data)")
        if q.dim() == 4 and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(q.shape[0], -1)
        elif q.dim() == 4 and position_ids.dim() == 2 and position_ids.shape[0] == 1:
            position_ids = position_ids.expand(q.shape[0], -1)  # (1, seq) broadcasts over the batch (transformers)
        if tuple(position_ids.shape) != tuple(lead):
            raise ValueError(f"{OP}: position_ids must have shape {tuple(lead)}, (1, seq) or (seq,), got "
                             f"{tuple(position_ids.shape)}" if q.dim() == 4 else
                             f"{OP}: position_ids must have shape {tuple(lead)}, got {tuple(position_ids.shape)}")
        pos = position_ids.reshape(-1).to(device=q.device)
        if pos.dtype != torch.int32:
            # range first, then narrow (never wrapped into range by the int32 cast): on CPU read on the host (free,
            # and the error shows the values given); elsewhere an int64 position outside [0, rows) becomes -1,
            # which the kernels reject where they read it, with no device sync
            if pos.device.type == "cpu":
                check_positions(pos, rows)
            else:
                pos = torch.where((pos >= 0) & (pos < rows), pos, -1)
            pos = pos.to(torch.int32)
    elif cu_seqlens is not None:
        cu = check_cu_seqlens(cu_seqlens, tokens, q.device, OP)  # host list, read at every call
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        if torch.compiler.is_compiling():  # longest is symbolic there: the check becomes a run-time assert
            torch._check(longest <= rows, lambda: f"{OP}: longest sequence exceeds the cos/sin table ({rows} positions)")
        elif longest > rows:
            raise ValueError(f"{OP}: longest sequence {longest} exceeds the cos/sin table ({rows} positions)")
        pos = positions_from_cu_seqlens(cu_seqlens, tokens)
    else:
        seq = q.shape[1] if q.dim() == 4 else q.shape[0]
        if seq > rows:
            raise ValueError(f"{OP}: sequence length {seq} exceeds the cos/sin table ({rows} positions)")
        pos = torch.arange(seq, device=q.device, dtype=torch.int32)
        if q.dim() == 4:
            pos = pos.repeat(q.shape[0])
    if q.numel() == 0 and k.numel() == 0:
        return q.new_empty(q.shape), k.new_empty(k.shape)
    q3 = q.reshape(tokens, q.shape[-2], d)
    k3 = k.reshape(tokens, k.shape[-2], d)
    c, s = cos.float().contiguous(), sin.float().contiguous()
    impl = registry.select(OP, {"q": q3, "k": k3, "cos": c, "sin": s, "positions": pos}, backend)
    if impl.backend not in _TOKEN_STRIDED:  # (the cpu kernel reads q and k at their token stride, e.g. from fused QKV)
        q3, k3 = q3.contiguous(), k3.contiguous()
    if needs_grad(q, k):
        registry.select_backward(OP_BWD, {"grad_q": q3, "grad_k": k3, "cos": c, "sin": s, "positions": pos},
                                 impl.backend)  # fails before the forward
    qo, ko = _rope_op(q3, k3, c, s, pos, impl.backend)
    return qo.view(q.shape), ko.view(k.shape)


__all__ = ["rope", "rope_cache", "positions_from_cu_seqlens"]
