"""Padding in one place: unpad / re-pad between (batch, seq, ...) and packed (total_tokens, ...) with cu_seqlens
(FlashAttention's bert_padding convention), the PackedBatch a model unpads once at its embedding and re-pads at
its output, and the row gather the packed layers use. The dispatch layer serves a padded attention call through
the packed kernels with unpad_input / pad_input; ops, layers and models all import it from here (so the ops never
import fastenc.models)."""
from __future__ import annotations

import torch

__all__ = ["PackedBatch", "gather_rows", "pad_input", "unpad_input"]


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


class PackedBatch:
    """A batch unpadded once at the embedding: `indices` of the real tokens in the flattened (batch*seq) grid
    (None when nothing is padded), `cu_seqlens` int32 (batch+1,), `max_seqlen`, and the padded shape."""

    __slots__ = ("indices", "cu_seqlens", "max_seqlen", "batch", "seq", "total")

    def __init__(self, mask: torch.Tensor | None, batch: int, seq: int, device):
        self.batch, self.seq = batch, seq
        # cu_seqlens as a normal tensor even under inference_mode (usable outside it, e.g. by a backward).
        with torch.inference_mode(False):
            if mask is None or bool(mask.all()):
                self.indices = None
                self.cu_seqlens = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)
                self.max_seqlen = seq
                self.total = batch * seq
            else:
                self.indices, self.cu_seqlens, self.max_seqlen = unpad_input(mask)
                self.total = int(self.indices.numel())

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (total, ...) real tokens only."""
        flat = t.reshape(self.batch * self.seq, *t.shape[2:])
        return flat if self.indices is None else flat.index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(total, ...) -> (batch, seq, ...), zeros at padded positions."""
        if self.indices is None:
            return x.view(self.batch, self.seq, *x.shape[1:])
        return pad_input(x, self.indices, self.batch, self.seq)

    def seqlens(self) -> torch.Tensor:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def first_rows(self) -> torch.Tensor:
        """(batch,) int64: each sequence's first packed row (an empty sequence gets some valid row, 0 with no rows)."""
        return self.cu_seqlens[:-1].long().clamp(max=max(self.total - 1, 0))

    def first_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(total, hidden) -> (batch, hidden): the first real token of each sequence (zeros for empty ones)."""
        out = gather_rows(x, self.first_rows()) if self.total else x.new_zeros(self.batch, *x.shape[1:])
        empty = self.seqlens() == 0
        return out.masked_fill(empty.view(-1, *([1] * (out.dim() - 1))), 0) if bool(empty.any()) else out

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """(total, hidden) -> (batch, hidden): mean over each sequence's real tokens (fp32 accumulation)."""
        lens = self.seqlens()
        seg = torch.repeat_interleave(torch.arange(self.batch, device=x.device), lens, output_size=self.total)
        acc = torch.zeros(self.batch, *x.shape[1:], device=x.device, dtype=torch.float32)
        acc.index_add_(0, seg, x.float())
        return (acc / lens.clamp(min=1).view(-1, *([1] * (x.dim() - 1))).to(acc.dtype)).to(x.dtype)


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x.index_select(0, rows) (rows int64, may repeat), whose backward under autograd scatters the gradient with
    one index_put_(accumulate=True): torch's own index_select backward goes through index_add_, which on the CPU with
    a team of threads sorts the index in several parallel passes (at 2 threads ~100x the 1-thread time for 8 rows of
    a 1024 x 768 gradient on a loaded machine). Repeated rows' gradients add up, as index_select's do."""
    if x.requires_grad and torch.is_grad_enabled():
        return _RowGather.apply(x, rows)
    return x.index_select(0, rows)


class _RowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        ctx.shape = x.shape
        return x.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        return grad.new_zeros(ctx.shape).index_put_((rows,), grad, accumulate=True), None
