"""Bidirectional self-attention on packed tokens: one fused QKV GEMM, optional RoPE, varlen attention, out proj.

The packed layout (total_tokens, hidden) with int32 cu_seqlens is FlashAttention's varlen convention; the
attention kernel is fastenc.ops.attention (backend chosen by the registry).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import ops
from fastenc.layers.linear import Linear
from fastenc.ops._common import needs_grad
from fastenc.padding import gather_rows


class SelfAttention(nn.Module):
    """Wqkv: (3*hidden, hidden), rows [q; k; v] each laid out (heads, head_dim); Wo: (hidden, hidden).

    window: None (global) or (left, right) — query i sees keys i-left..i+right of its own sequence.
    dropout: attention-probability dropout in training mode (inside ops.attention).
    """

    def __init__(self, hidden: int, heads: int, bias: bool = True, out_bias: bool | None = None,
                 window: tuple[int, int] | None = None, device=None, dtype=None, dropout: float = 0.0):
        super().__init__()
        self.dropout = float(dropout)
        if hidden % heads:
            raise ValueError(f"SelfAttention: hidden ({hidden}) must be a multiple of heads ({heads})")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.window = window
        self.Wqkv = Linear(hidden, 3 * hidden, bias=bias, device=device, dtype=dtype)
        self.Wo = Linear(hidden, hidden, bias=bias if out_bias is None else out_bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, out_bias: bool = True) -> torch.Tensor:
        """x: (tokens, hidden); cu_seqlens int32 (batch+1,); rope: (cos, sin, positions int32 (tokens,)) or None.
        out_bias=False leaves Wo's bias to the caller (fused into the next LayerNorm as its input_bias)."""
        return self.Wo(self.attend(x, cu_seqlens, max_seqlen, rope), with_bias=out_bias)

    def attend(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
               rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, plan=None) -> torch.Tensor:
        """The attention output before Wo: (tokens, hidden). plan: the forward's fastenc.ops.direct.Plan (over
        these cu_seqlens) or None: with it, one Wqkv GEMM (tokens, 3 * hidden) whose q, k and v column blocks the
        cpu kernels read in place (its row stride 3 * hidden: at 16 tokens one N = 3 * hidden GEMM is ~1.1-1.6x
        faster than three N = hidden ones); RoPE rotates q and k into new tensors."""
        t = x.shape[0]
        if plan is not None:
            q, k, v = self.Wqkv(x).view(t, 3, self.heads, self.head_dim).unbind(1)
            if rope is not None:
                q, k = plan.rope(q, k, *rope)
            return plan.attention(q, k, v, self.window).view(t, self.hidden)
        if (x.device.type == "cpu" and type(self.Wqkv) is Linear  # (a Wqkv carrying unmerged LoRA: own forward)
                and not needs_grad(x, self.Wqkv.weight, self.Wqkv.bias)):
            # Inference: the fused Wqkv's three (hidden, hidden) blocks are multiplied into three contiguous
            # (tokens, hidden) planes of one buffer: the attention kernel then reads q, k and v with no copy (a
            # single GEMM would leave them interleaved per token).
            q, k, v = (u.view(t, self.heads, self.head_dim) for u in self.Wqkv.planes(x, 3))
        else:
            qkv = self.Wqkv(x)
            p = self.dropout if self.training else 0.0
            extra = {"dropout_p": p} if p > 0 else {}  # (passed only when on: the argument is newer than the op)
            if rope is None:  # q, k, v read from qkv in place; their gradient comes back as one (t, 3 * hidden)
                o = ops.attention_qkv(qkv, self.heads, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                      window=self.window, **extra)
                return o.reshape(t, self.hidden)
            q, k, v = qkv.view(t, 3, self.heads, self.head_dim).unbind(1)
        if rope is not None:
            cos, sin, pos = rope
            q, k = ops.rope(q, k, cos, sin, position_ids=pos)
        p = self.dropout if self.training else 0.0
        extra = {"dropout_p": p} if p > 0 else {}  # (passed only when on: the argument is newer than the op)
        o = ops.attention(q, k, v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, window=self.window, **extra)
        return o.reshape(t, self.hidden)

    def attend_rows(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rows: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """attend(x, ...)[rows] for a few query rows (rows int64 (n,), packed indices, e.g. each sequence's first
        token for a head that reads no other): k and v are projected for every token, q for `rows` only, and each
        query attends over its own sequence's keys in its window. (n, hidden).

        The n queries run in plain PyTorch (fp32 math, softmax over the visible keys), n x keys scores in all; a
        query whose sequence is empty gets zeros. Attention-probability dropout belongs to the attention kernels
        (the mask regenerated in their backward, never stored), so in training with dropout on, as with a Wqkv
        carrying unmerged adapters or int8 weights, the layer runs whole (attend(), then the rows)."""
        h, heads, d = self.hidden, self.heads, self.head_dim
        n, t = rows.numel(), x.shape[0]
        if (type(self.Wqkv) is not Linear or self.Wqkv.int8 is not None or n == 0 or t == 0
                or (self.training and self.dropout > 0)):
            return gather_rows(self.attend(x, cu_seqlens, max_seqlen, rope), rows)
        w, b = self.Wqkv.weight, self.Wqkv.bias
        q = F.linear(gather_rows(x, rows), w[:h], None if b is None else b[:h]).view(n, heads, d)
        kv = F.linear(x, w[h:], None if b is None else b[h:]).view(t, 2, heads, d)
        k, v = kv[:, 0], kv[:, 1]
        if rope is not None:
            cos, sin, pos = rope
            q = ops.rope(q, q, cos, sin, position_ids=pos.index_select(0, rows))[0]
            k = ops.rope(k, k, cos, sin, position_ids=pos)[1]
        # each query's sequence, its place in it and the keys it sees: [lo, hi) of the sequence
        cu = cu_seqlens.long()
        seq = torch.searchsorted(cu, rows, right=True) - 1
        start, length = cu[seq], cu[seq + 1] - cu[seq]
        i = rows - start
        lo = torch.zeros_like(i) if self.window is None else (i - self.window[0]).clamp(min=0)
        hi = length if self.window is None else torch.minimum(length, i + self.window[1] + 1)
        span = (hi - lo).clamp(min=0)
        lk = max(int(span.max()), 1)
        ar = torch.arange(lk, device=x.device)
        seen = ar[None, :] < span[:, None]  # (n, lk)
        kidx = ((start + lo)[:, None] + ar[None, :]).clamp(0, max(t - 1, 0)).flatten()
        kg = gather_rows(k.reshape(t, h), kidx).view(n, lk, heads, d).float()
        vg = gather_rows(v.reshape(t, h), kidx).view(n, lk, heads, d).float()
        s = torch.einsum("nhd,nlhd->nhl", q.float(), kg) * (d ** -0.5)
        s = s.masked_fill(~seen[:, None, :], float("-inf"))
        blind = span == 0  # an empty sequence: uniform weights over zeros-to-be, then zeroed
        s = s.masked_fill(blind[:, None, None], 0.0)
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("nhl,nlhd->nhd", p, vg).reshape(n, h)
        o = o.masked_fill(blind[:, None], 0.0) if bool(blind.any()) else o
        return o.to(x.dtype)
