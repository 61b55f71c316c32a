"""Bidirectional self-attention on packed tokens: one fused QKV GEMM, optional RoPE, varlen attention, out proj.

The packed layout (total_tokens, hidden) with int32 cu_seqlens is FlashAttention's varlen convention; the
attention kernel is fastenc.ops.attention (backend chosen by the registry).
"""
from __future__ import annotations

import torch
from torch import nn

from fastenc import ops
from fastenc.layers.linear import Linear
from fastenc.ops._common import needs_grad


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
               rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The attention output before Wo: (tokens, hidden)."""
        t = x.shape[0]
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
