"""Embedding lookup whose weight gradient comes from fastenc's CPU buffer cache.

embedding(ids, weight, padding_idx) = F.embedding(ids, weight, padding_idx) in value and in gradient: the weight's
gradient is zeros with each id's row of grad_output added (index_add_), the padding row left at zero.

Why: a vocabulary-sized gradient (BERT-base 94 MB, ModernBERT-base 155 MB in fp32) is one allocation far above
glibc's mmap threshold, so torch's embedding backward gets fresh pages from the kernel at every step and faults each
of them in while zeroing (~53 ms for ModernBERT-base's on a 2-core machine, against ~6 ms to zero a block already
mapped). From the buffer cache (fastenc.extension.buffer_empty) the block freed with the previous step's gradient
is handed out again. The gradient is an ordinary tensor to autograd and the optimizer; its memory returns to the
cache when it is freed (zero_grad(set_to_none=True)). Without the extension, on other devices or under
torch.compile the buffer is torch.zeros, as in torch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastenc import extension


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None):
        ctx.save_for_backward(ids)
        ctx.rows, ctx.padding_idx = weight.shape[0], padding_idx
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.needs_input_grad[1]:
            return None, None, None
        (ids,) = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        out = extension.buffer_empty((ctx.rows, grad.shape[1]), grad) if grad.device.type == "cpu" else None
        out = torch.zeros(ctx.rows, grad.shape[1], dtype=grad.dtype, device=grad.device) if out is None else out.zero_()
        out.index_add_(0, ids.reshape(-1), grad)
        if ctx.padding_idx is not None:
            out[ctx.padding_idx] = 0
        return None, out, None


def padding_row(pad_token_id: int | None, vocab_size: int) -> int | None:
    """The word embedding's padding_idx as transformers sets it (its row gets no gradient): the config's
    pad_token_id when it names a row of the vocabulary, else None."""
    return pad_token_id if pad_token_id is not None and 0 <= pad_token_id < vocab_size else None


def embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """F.embedding(ids, weight, padding_idx) (no max_norm, dense gradient); the weight's gradient from the CPU
    buffer cache when autograd records the call."""
    if not (torch.is_grad_enabled() and weight.requires_grad):
        return F.embedding(ids, weight, padding_idx=padding_idx)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return _Embedding.apply(ids, weight, padding_idx)
