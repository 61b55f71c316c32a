"""SPLADE max-pooled sparse weights reference: out[s, v] = log1p(relu(max over the tokens t of sequence s of
(x_t . W_v + b_v))) (Formal et al. 2021, "SPLADE v2": log-saturated, max-pooled MLM logits). log1p and relu are
monotone, so the max is taken first; this reference still forms the (tokens, vocab) logits, the kernels do not."""
from __future__ import annotations

import torch


def sparse_max_ref(x: torch.Tensor, cu_seqlens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   upcast: bool = True) -> torch.Tensor:
    """x: (tokens, H) packed hidden states; cu_seqlens: int32 (batch+1,), sequence s is rows [cu[s], cu[s+1]);
    weight: (V, H) the vocabulary projection (an MLM decoder); bias: (V,) or None. Returns (batch, V) fp32; an
    empty sequence gives zeros.

    upcast=True: the logits and the max in fp32 (fp64 for fp64 inputs); upcast=False: in x's dtype (the
    low-precision reference of the tolerance rule). Differentiable through autograd in x, weight and bias."""
    acc = (torch.float64 if x.dtype == torch.float64 else torch.float32) if upcast else x.dtype
    logits = x.to(acc) @ weight.to(acc).t()
    if bias is not None:
        logits = logits + bias.to(acc)
    cu = cu_seqlens.tolist()
    rows = [logits[a:b].amax(0) if b > a else logits.new_full((weight.shape[0],), float("-inf"))
            for a, b in zip(cu, cu[1:])]
    m = torch.stack(rows) if rows else logits.new_empty(0, weight.shape[0])
    out = torch.log1p(torch.relu(m))
    return out if out.dtype == torch.float64 else out.float()
