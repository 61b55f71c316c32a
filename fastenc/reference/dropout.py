"""Elementwise (inverted) dropout with a counter-based keep-mask: out = (x + bias) * Z / (1 - p), Z the keep-mask of
fastenc/reference/attention_dropout.py at head 0, row t = the element's row of the (rows, n) view, column j = its
column: u = mix(mix(c ^ mix(t ^ mix(G))) + j * G), kept when (u >> 1) >= floor(p * 2^31). A pure function of
(seed, offset) and the element's position, so the backward regenerates Z instead of saving it
(csrc/cpu/dropout.cpp computes the same bits)."""
from __future__ import annotations

import torch

from fastenc.reference.attention_dropout import GOLDEN, MASK32, mix32, row_keys, threshold


def dropout_keep_ref(seed: int, offset: int, dropout_p: float, rows: int, n: int, device="cpu") -> torch.Tensor:
    """The keep-mask (rows, n) bool."""
    r = row_keys(seed, offset, 1, torch.arange(rows, dtype=torch.int64, device=device))[0]
    cols = torch.arange(n, dtype=torch.int64, device=device)
    u = mix32((r[:, None] + cols[None, :] * GOLDEN) & MASK32)
    return (u >> 1) >= threshold(dropout_p)


def dropout_ref(x: torch.Tensor, dropout_p: float, seed: int, offset: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (rows, n); bias: (n,) or None -> (x + bias) * Z / (1 - p) in x's dtype (fp32 math)."""
    keep = dropout_keep_ref(seed, offset, dropout_p, x.shape[0], x.shape[1], x.device)
    h = x.float() if bias is None else x.float() + bias.float()
    return (h * keep / (1.0 - dropout_p)).to(x.dtype)


def dropout_bwd_ref(grad: torch.Tensor, dropout_p: float, seed: int, offset: int) -> torch.Tensor:
    """grad: (rows, n) -> d(x + bias) = grad * Z / (1 - p) in grad's dtype (fp32 math)."""
    keep = dropout_keep_ref(seed, offset, dropout_p, grad.shape[0], grad.shape[1], grad.device)
    return (grad.float() * keep / (1.0 - dropout_p)).to(grad.dtype)
