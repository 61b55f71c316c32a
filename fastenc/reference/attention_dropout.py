"""Attention-probability dropout: the counter-based keep-mask every backend regenerates (reference in torch integer
ops; csrc/cpu/attention_dropout.h and fastenc/kernels/attention.py compute the same function bit for bit).

A call with dropout_p = p > 0 draws (seed, offset), two int64, from its generator; nothing else is saved for the
backward, which regenerates the mask from them. Each element (sequence b, head h, query row i, key column j) of
the attention probabilities gets a 32-bit number u from a pure function of (seed, offset, h, t, j):

  mix(x)    = x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16   (uint32, wrapping;
              a bijection of uint32 with full avalanche)
  call key  c = mix(s0 ^ mix(s1 ^ mix(o0 ^ mix(o1))))   s0, s1 / o0, o1: low, high 32 bits of seed / offset
  row key   r = mix(c ^ mix(t ^ mix(h ^ G)))              G = 0x9E3779B9
  element   u = mix(r + j * G)
  keep      (u >> 1) >= floor(p * 2^31)                    (keep probability 1 - p to within 2^-31)

Counter layout: t is the query's row in the packed layout (total_tokens, heads, head_dim), i.e.
t = cu_seqlens[b] + i, and j the key's position within its own sequence (0 .. len_b - 1). The padded layout
(batch, seq, ...) without key_padding_mask is the packed layout with cu_seqlens = 0, seq, 2 seq, ...
(t = b * seq + i, j = key position); with key_padding_mask it is the packed layout of the real tokens, in order
(t = number of real tokens before the query in the flattened batch, j = number of real keys before the key in
its row). Kept probabilities are scaled by 1/(1-p) (inverted dropout, as torch.nn.functional.dropout):
  out = (P * Z / (1-p)) V  with P the softmax and Z the keep-mask; lse stays the log-sum-exp of the undropped
scores. One short hash per element keeps the CPU kernel's cost low: Philox4x32-10 (10 rounds of two 32x32->64
multiplies per 4 outputs) would cost more per element on AVX2 than the forward's two products at head dim 64.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B
GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32): in 16-bit halves, so no int64 product overflows."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The finalizer above on an int64 tensor of uint32 values; returns int64 in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_C1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_C2)
    return x ^ (x >> 16)


def mix32_int(x: int) -> int:
    """mix32 on one Python int (host side: the call key)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * MIX_C1) & MASK32
    x ^= x >> 15
    x = (x * MIX_C2) & MASK32
    return x ^ (x >> 16)


def call_key(seed: int, offset: int) -> int:
    """c = mix(s0 ^ mix(s1 ^ mix(o0 ^ mix(o1)))) from the int64 seed and offset (two's complement words)."""
    s, o = seed & (2 ** 64 - 1), offset & (2 ** 64 - 1)
    x = mix32_int(o >> 32)
    x = mix32_int((o & MASK32) ^ x)
    x = mix32_int((s >> 32) ^ x)
    return mix32_int((s & MASK32) ^ x)


def threshold(dropout_p: float) -> int:
    """floor(p * 2^31): an element is kept when (u >> 1) >= it."""
    return int(float(dropout_p) * 2.0 ** 31)


def row_keys(seed: int, offset: int, heads: int, tokens: torch.Tensor) -> torch.Tensor:
    """Row keys r for heads 0..heads-1 x the packed token indices `tokens` (int64 (n,)) -> (heads, n) int64."""
    c = call_key(seed, offset)
    hk = mix32(torch.arange(heads, dtype=torch.int64, device=tokens.device) ^ GOLDEN)        # mix(h ^ G)
    return mix32(c ^ mix32(tokens[None, :].to(torch.int64) ^ hk[:, None]))


def keep_mask(seed: int, offset: int, dropout_p: float, heads: int, tokens: torch.Tensor,
              keys: torch.Tensor) -> torch.Tensor:
    """Keep-mask (heads, len(tokens), len(keys)) bool for query rows `tokens` (packed indices) and key columns
    `keys` (positions within the sequence), both int64 1-D."""
    r = row_keys(seed, offset, heads, tokens)
    u = mix32((r[:, :, None] + keys.to(torch.int64)[None, None, :] * GOLDEN) & MASK32)
    return (u >> 1) >= threshold(dropout_p)


def sequence_keep_scale(seed: int, offset: int, dropout_p: float, heads: int, start: int, length: int,
                        device, dtype) -> torch.Tensor:
    """Z / (1-p) for one packed sequence starting at token `start`: (heads, length, length) in `dtype`."""
    pos = torch.arange(length, dtype=torch.int64, device=device)
    keep = keep_mask(seed, offset, dropout_p, heads, pos + start, pos)
    return keep.to(dtype) / (1.0 - dropout_p)


def padded_keep_scale(seed: int, offset: int, dropout_p: float, heads: int, batch: int, seq: int,
                      key_padding_mask: torch.Tensor | None, device, dtype) -> torch.Tensor:
    """Z / (1-p) for the padded layout (batch, heads, seq, seq) in `dtype`, with the counters of the layout above
    (rows and columns at padded positions are 0)."""
    if key_padding_mask is None:
        tokens = torch.arange(batch * seq, dtype=torch.int64, device=device).view(batch, seq)
        cols = torch.arange(seq, dtype=torch.int64, device=device).expand(batch, seq)
        real = torch.ones(batch, seq, dtype=torch.bool, device=device)
    else:
        real = key_padding_mask
        tokens = (real.reshape(-1).to(torch.int64).cumsum(0) - 1).view(batch, seq)
        cols = real.to(torch.int64).cumsum(1) - 1
    r = row_keys(seed, offset, heads, tokens.clamp(min=0).reshape(-1)).view(heads, batch, seq).transpose(0, 1)
    u = mix32((r[:, :, :, None] + cols.clamp(min=0)[:, None, None, :] * GOLDEN) & MASK32)
    keep = ((u >> 1) >= threshold(dropout_p)) & real[:, None, :, None] & real[:, None, None, :]
    return keep.to(dtype) / (1.0 - dropout_p)
