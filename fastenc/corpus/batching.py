"""Token-budget batching for the corpus job: texts are tokenized a window at a time, sorted by length within the
window (longest first) and cut into batches whose padded size (rows x longest row) stays within a token budget, so
every batch costs about the same whatever the lengths; the window's input order is restored after embedding."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch


@dataclass(frozen=True)
class Batch:
    rows: list[int]        # positions in the window, longest first
    ids: torch.Tensor      # (len(rows), width) int64, 0-padded
    mask: torch.Tensor     # (len(rows), width) bool
    tokens: int            # real tokens in the batch


def token_budget_batches(seqs: Sequence[Sequence[int]], max_batch_tokens: int, max_batch_size: int) -> Iterator[Batch]:
    """Cut `seqs` (token-id sequences: lists or 1-d integer arrays) into batches of at most `max_batch_tokens` padded
    tokens and `max_batch_size` rows; a sequence longer than the budget gets a batch of its own. The arguments are
    checked at the call; the batches' tensors are built one at a time as the result is iterated, so a window holds
    one batch's padded ids at a time, whatever its length."""
    if not isinstance(max_batch_tokens, int) or isinstance(max_batch_tokens, bool) or max_batch_tokens < 1:
        raise ValueError(f"embed: max_batch_tokens must be a positive int, got {max_batch_tokens!r}")
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
        raise ValueError(f"embed: max_batch_size must be a positive int, got {max_batch_size!r}")
    return _batches(seqs, max_batch_tokens, max_batch_size)


def _batches(seqs: Sequence[Sequence[int]], max_batch_tokens: int, max_batch_size: int) -> Iterator[Batch]:
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    start = 0
    while start < len(order):
        width = max(1, len(seqs[order[start]]))  # the longest of the batch: sorted, so the first
        n = max(1, min(max_batch_size, max_batch_tokens // width, len(order) - start))
        rows = order[start:start + n]
        ids = torch.zeros(n, width, dtype=torch.long)
        mask = torch.zeros(n, width, dtype=torch.bool)
        tokens = 0
        for r, i in enumerate(rows):
            s = seqs[i]
            if len(s):
                ids[r, :len(s)] = torch.as_tensor(s, dtype=torch.long)
                mask[r, :len(s)] = True
            tokens += len(s)
        yield Batch(rows, ids, mask, tokens)
        start += n
