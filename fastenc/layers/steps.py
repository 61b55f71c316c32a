"""A count of torch optimizer steps, for the caches that key a derived tensor on its parameters' version counters.

torch's fused optimizers (`torch.optim.AdamW(fused=True)`, transformers Trainer's default `adamw_torch_fused`,
and the other `fused=True` ones) write the parameters in place without bumping their version counters, so after
such a step a version counter says nothing changed. Every cache that derives a tensor from parameters (the packed
GEMM weights, fastenc.accelerate's fused QKV copies, unmerged LoRA's combined A and B) also keys it on
`optimizer_steps()`, which a global post-step hook on torch.optim.Optimizer advances: any optimizer step, fused or
not, rebuilds them at the next inference call. The hook is registered at the first call (nothing at import).
A write through `.data` bumps no counter either and is not seen: write parameters under torch.no_grad().
"""
from __future__ import annotations

from torch.optim.optimizer import register_optimizer_step_post_hook

_count = 0
_hooked = False


def _advance(_optimizer, _args, _kwargs) -> None:
    global _count
    _count += 1


def optimizer_steps() -> int:
    """How many torch optimizer steps (any torch.optim.Optimizer) have run since the first call."""
    global _hooked
    if not _hooked:
        register_optimizer_step_post_hook(_advance)
        _hooked = True
    return _count
