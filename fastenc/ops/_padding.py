"""Unpad / re-pad between (batch, seq, ...) and packed (total_tokens, ...), with cu_seqlens (FlashAttention's
bert_padding convention): the dispatch layer serves a padded attention call through the packed kernels with
these, and the models (fastenc.models.padding) unpad once at the embedding and re-pad at the output."""
from __future__ import annotations

import torch


def unpad_input(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """mask: (batch, seq) bool/int, True/1 = real token.

    Returns (indices into the flattened batch*seq, int64 (total,); cu_seqlens int32 (batch+1,); max_seqlen).
    """
    m = mask.bool()
    seqlens = m.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(m.flatten(), as_tuple=False).flatten()
    cu = torch.zeros(m.shape[0] + 1, dtype=torch.int32, device=m.device)
    cu[1:] = torch.cumsum(seqlens, dim=0, dtype=torch.int32)
    return indices, cu, int(seqlens.max()) if seqlens.numel() else 0


def pad_input(x: torch.Tensor, indices: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """x: (total, ...) -> (batch, seq, ...) with zeros at padded positions."""
    out = x.new_zeros((batch * seq, *x.shape[1:]))
    out.index_copy_(0, indices, x)
    return out.view(batch, seq, *x.shape[1:])
