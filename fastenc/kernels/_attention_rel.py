"""Relative-position terms of the Triton attention kernels (fastenc/kernels/attention.py, attention_bwd.py):
per-token positions and DeBERTa-v2/v3's disentangled c2p / p2c terms, read inside the tile loop through O(L)
per-distance lookups, never as a (seq, seq) tensor.

  dist(i, j)  = pos_i - pos_j           (positions: POS[token] clamped to [0, L); else the index in the sequence)
  slot(i, j)  = SLOT[dist + L - 1]      (clamped to [0, slots)); SLOT (2L - 1,) int32 built by the op
  s_ij       += C2P[token_i, h, slot] + P2C[token_j, h, slot]   (fp32, log2 units in the kernels)
C2P and P2C are (total_tokens, heads, slots) contiguous; the grid's axis 1 is the head, so heads = num_programs(1).
Every index read from a tensor (positions, slots) is clamped where it is read: no access leaves the tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _positions(POS, tokens, ok, rel_len):
    # POS[tokens] clamped to [0, L - 1] for rel_len = 2L - 1 (0 where not ok).
    p = tl.load(POS + tokens, mask=ok, other=0)
    return tl.minimum(tl.maximum(p, 0), (rel_len - 1) // 2)


@triton.jit
def _disentangled(C2P, P2C, SLOT, rel_len, slots, h, tok_q, tok_k, dist, ok,
                  HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr):
    # (c2p[tok_q, h, slot] + p2c[tok_k, h, slot]) * log2(e) in fp32, and slot, for the pairs `dist` (a 2-D tile;
    # tok_q, tok_k broadcast against it); pairs not ok read nothing and add 0.
    sidx = tl.minimum(tl.maximum(dist + (rel_len - 1) // 2, 0), rel_len - 1)
    slot = tl.load(SLOT + sidx, mask=ok, other=0)
    slot = tl.minimum(tl.maximum(slot, 0), slots - 1)
    heads = tl.num_programs(1)
    rel = tl.zeros(dist.shape, tl.float32)
    if HAS_C2P:
        rel += tl.load(C2P + (tok_q.to(tl.int64) * heads + h) * slots + slot, mask=ok, other=0.0).to(tl.float32)
    if HAS_P2C:
        rel += tl.load(P2C + (tok_k.to(tl.int64) * heads + h) * slots + slot, mask=ok, other=0.0).to(tl.float32)
    return rel * 1.4426950408889634, slot


@triton.jit
def _scatter_rel(DREL, tok, h, slots, slot, ds, ok):
    # DREL[tok, h, slot] += ds over the tile (fp32 atomics: several pairs of one row can share a slot).
    heads = tl.num_programs(1)
    tl.atomic_add(DREL + (tok.to(tl.int64) * heads + h) * slots + slot, ds, mask=ok)


@dataclass(frozen=True)
class Relative:
    """The relative terms of one launch, checked: positions / c2p / p2c / slot contiguous on q's device or None;
    rel_len = 2L - 1 (the lookups' common length; 1 when there is none); slots (1 when no c2p / p2c)."""

    positions: torch.Tensor | None
    c2p: torch.Tensor | None
    p2c: torch.Tensor | None
    slot: torch.Tensor | None
    rel_len: int
    slots: int

    @property
    def any(self) -> bool:
        return self.positions is not None or self.slot is not None

    def pointers(self, ints: torch.Tensor, floats: torch.Tensor) -> tuple:
        """(POS, C2P, P2C, SLOT, slots) kernel arguments; an int32 tensor `ints` and a q-dtype tensor `floats`
        stand in for absent ones (never read)."""
        pos, slot = (ints if t is None else t for t in (self.positions, self.slot))
        c2p, p2c = (floats if t is None else t for t in (self.c2p, self.p2c))
        return pos, c2p, p2c, slot, self.slots

    def flags(self) -> dict:
        return {"HAS_POS": self.positions is not None, "HAS_C2P": self.c2p is not None,
                "HAS_P2C": self.p2c is not None}


def check_relative(q: torch.Tensor, bias: torch.Tensor | None, bias_len: int, max_seqlen: int,
                   positions: torch.Tensor | None, c2p: torch.Tensor | None, p2c: torch.Tensor | None,
                   slot: torch.Tensor | None, who: str = "attention (triton)") -> Relative:
    """Validates the relative terms against q (total_tokens, heads, head_dim) and the distance bias (checked
    already: bias_len = its length, 1 without one); ValueError naming the argument."""
    total, heads = q.shape[0], q.shape[1]
    if (c2p is not None or p2c is not None) != (slot is not None):
        raise ValueError(f"{who}: slot must be given exactly when c2p or p2c is, got slot "
                         f"{'None' if slot is None else tuple(slot.shape)} with c2p "
                         f"{'None' if c2p is None else 'given'}, p2c {'None' if p2c is None else 'given'}")
    rel_len = bias_len if bias is not None else 1
    slots = 1
    if slot is not None:
        if slot.dim() != 1 or slot.numel() % 2 == 0 or slot.dtype != torch.int32 or slot.device != q.device:
            raise ValueError(f"{who}: slot must be int32 (2L - 1,) on {q.device}, got {slot.dtype} "
                             f"{tuple(slot.shape)} on {slot.device}")
        if bias is not None and slot.numel() != bias_len:
            raise ValueError(f"{who}: slot and bias must have one length 2L - 1, got {slot.numel()} and {bias_len}")
        rel_len = slot.numel()
        slot = slot.contiguous()
    if (rel_len + 1) // 2 < max_seqlen and (bias is not None or slot is not None):
        raise ValueError(f"{who}: the relative lookups cover sequences up to {(rel_len + 1) // 2} tokens, "
                         f"max_seqlen is {max_seqlen}")
    terms = []
    for name, t in (("c2p", c2p), ("p2c", p2c)):
        if t is None:
            terms.append(None)
            continue
        if t.dim() != 3 or t.shape[:2] != (total, heads) or t.shape[2] < 1 or t.dtype != q.dtype \
                or t.device != q.device:
            raise ValueError(f"{who}: {name} must be {q.dtype} (total_tokens={total}, heads={heads}, slots) on "
                             f"{q.device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
        if slots > 1 and t.shape[2] != slots:
            raise ValueError(f"{who}: c2p and p2c must have one number of slots, got {slots} and {t.shape[2]}")
        slots = t.shape[2]
        terms.append(t.contiguous())
    if positions is not None:
        if bias is None and slot is None:
            raise ValueError(f"{who}: positions needs a relative term (bias, c2p or p2c)")
        if positions.shape != (total,) or positions.dtype != torch.int32 or positions.device != q.device:
            raise ValueError(f"{who}: positions must be int32 (total_tokens={total},) on {q.device}, got "
                             f"{positions.dtype} {tuple(positions.shape)} on {positions.device}")
        positions = positions.contiguous()
    if total * heads * slots >= 2 ** 62:
        raise ValueError(f"{who}: c2p / p2c hold too many elements ({total} x {heads} x {slots})")
    return Relative(positions, terms[0], terms[1], slot, rel_len, slots)
