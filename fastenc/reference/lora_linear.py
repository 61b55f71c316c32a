"""Unmerged LoRA linear reference: y = x W^T + b + scale * (x A^T) B^T (Hu et al. 2021, "LoRA")."""
from __future__ import annotations

import torch


def lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                    lora_b: torch.Tensor, scale: float, upcast: bool = True) -> torch.Tensor:
    """x: (..., in); weight: (out, in); bias: (out,) or None; lora_a: (r, in); lora_b: (out, r).

    upcast=True: all math in fp32 (fp64 for fp64 x), rounded once to x's dtype. upcast=False: PEFT's unmerged
    forward in x's dtype: base = x W^T + b, lora = (x A^T) B^T * scale, each rounded, then base + lora.
    Returns (..., out) in x's dtype.
    """
    if upcast:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        t = x.to(acc)
        y = t @ weight.to(acc).t()
        if bias is not None:
            y = y + bias.to(acc)
        y = y + float(scale) * ((t @ lora_a.to(acc).t()) @ lora_b.to(acc).t())
        return y.to(x.dtype)
    y = torch.nn.functional.linear(x, weight, bias)
    return y + torch.nn.functional.linear(torch.nn.functional.linear(x, lora_a), lora_b) * scale
