"""Small launch helpers shared by the Triton kernel modules (no GPU access at import)."""
from __future__ import annotations

import contextlib

import torch


def on_device(t: torch.Tensor):
    """Context that makes t's GPU current for a launch (Triton launches on the current device); a no-op for
    CPU tensors, which run under TRITON_INTERPRET=1."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
