"""LoRA merge reference: W' = W + scale * B @ A (Hu et al. 2021, "LoRA"), fp32 accumulation, one rounding."""
from __future__ import annotations

import torch


def merge_lora_ref(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float,
                   upcast: bool = True) -> torch.Tensor:
    """weight: (out, in); lora_a: (r, in); lora_b: (out, r); any float dtypes. Returns weight's dtype.

    upcast=True: W + scale * (B @ A) in fp32 (fp64 if weight is fp64), rounded once to weight's dtype.
    upcast=False: the way PEFT merges in the adapter's low precision on a GPU: delta = (B @ A) * scale
    rounded to the adapter dtype after each step, then W + delta rounded to weight's dtype.
    """
    if upcast:
        acc = torch.float64 if weight.dtype == torch.float64 else torch.float32
        w = weight.to(acc)
        return (w + float(scale) * (lora_b.to(acc) @ lora_a.to(acc))).to(weight.dtype)
    delta = (lora_b @ lora_a) * scale
    return (weight + delta.to(weight.dtype)).to(weight.dtype)
