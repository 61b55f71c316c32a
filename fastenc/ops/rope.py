"""fastenc.ops.rope: rotate-half rotary embedding of q and k in one launch (transformers' convention)."""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_cu_seqlens, check_float
from fastenc.ops._library import custom_op
from fastenc.reference.rope import rope_cache, rope_ref

OP = "rope"


def _reference(q, k, cos, sin, positions):
    return rope_ref(q, k, cos, sin, positions)


@custom_op("fastenc::rope", mutates_args=())
def _rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
             backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return registry.impl(OP, backend).fn(q, k, cos, sin, positions)


@_rope_op.register_fake
def _(q, k, cos, sin, positions, backend):
    return torch.empty_like(q), torch.empty_like(k)


_backends.reference(OP, _reference)
_backends.triton(OP, "fastenc.kernels.rope", "rope_fwd")
_backends.cpu(OP, "rope")
_backends.cuda(OP, "rope_cuda")


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
    sequence. cu_seqlens: int32 (batch+1,) for packed input, positions restart at each sequence.
    Returns (q_rot, k_rot), same shapes and dtypes as q and k.
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
    tokens = int(torch.tensor(lead).prod()) if len(lead) else 1
    if position_ids is not None:
        if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{OP}: position_ids must be an int32/int64 tensor, got "
                            f"{getattr(position_ids, 'dtype', type(position_ids).__name__)}")
        if q.dim() == 4 and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(q.shape[0], -1)
        if tuple(position_ids.shape) != tuple(lead):
            raise ValueError(f"{OP}: position_ids must have shape {tuple(lead)}, got {tuple(position_ids.shape)}")
        pos = position_ids.reshape(-1).to(device=q.device, dtype=torch.int32)
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= cos.shape[0]):
            raise ValueError(f"{OP}: position_ids must be in [0, {cos.shape[0]}) (the cos/sin table), got "
                             f"[{int(pos.min())}, {int(pos.max())}]")
    elif cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, tokens, q.device, OP)
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
        if longest > cos.shape[0]:
            raise ValueError(f"{OP}: longest sequence {longest} exceeds the cos/sin table ({cos.shape[0]} positions)")
        pos = positions_from_cu_seqlens(cu_seqlens, tokens)
    else:
        seq = q.shape[1] if q.dim() == 4 else q.shape[0]
        if seq > cos.shape[0]:
            raise ValueError(f"{OP}: sequence length {seq} exceeds the cos/sin table ({cos.shape[0]} positions)")
        pos = torch.arange(seq, device=q.device, dtype=torch.int32)
        if q.dim() == 4:
            pos = pos.repeat(q.shape[0])
    if q.numel() == 0 and k.numel() == 0:
        return q.new_empty(q.shape), k.new_empty(k.shape)
    q3 = q.reshape(tokens, q.shape[-2], d).contiguous()
    k3 = k.reshape(tokens, k.shape[-2], d).contiguous()
    c, s = cos.float().contiguous(), sin.float().contiguous()
    impl = registry.select(OP, {"q": q3, "k": k3, "cos": c, "sin": s, "positions": pos}, backend)
    qo, ko = _rope_op(q3, k3, c, s, pos, impl.backend)
    return qo.view(q.shape), ko.view(k.shape)


__all__ = ["rope", "rope_cache", "positions_from_cu_seqlens"]
