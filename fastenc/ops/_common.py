"""Argument checks shared by the public ops: every error names the argument, the expected and the received."""
from __future__ import annotations

from typing import Any

import torch

from fastenc.registry import FLOAT_DTYPES, _dt


def check_float(name: str, op: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {_dt(t.dtype)}")
    return t


def check_like(name: str, op: str, t: torch.Tensor | None, ref: torch.Tensor, ref_name: str = "x",
               shape: tuple[int, ...] | None = None, same_dtype: bool = True) -> None:
    """`t` (if given) must be a float tensor on ref's device, with ref's dtype and the given shape."""
    if t is None:
        return
    check_float(name, op, t)
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} must be on {ref_name}'s device {ref.device}, got {t.device}")
    if same_dtype and t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} must have {ref_name}'s dtype {_dt(ref.dtype)}, got {_dt(t.dtype)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_eps(op: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"{op}: eps must be > 0, got {eps}")
    return float(eps)


def check_approximate(op: str, approximate: Any) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


def rows_view(x: torch.Tensor, width: int) -> torch.Tensor:
    """(..., width) -> (rows, width) contiguous (copies only if needed)."""
    return x.reshape(-1, width).contiguous()


def empty_or(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent optional output travels as an empty tensor."""
    return t if t is not None else like.new_empty(0)


def check_cu_seqlens(cu_seqlens, total: int, device, op: str = "attention") -> list[int]:
    """Validate FlashAttention-style cu_seqlens; returns it as a Python list."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{op}: cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"{op}: cu_seqlens must be int32, got {str(cu_seqlens.dtype).replace('torch.', '')}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{op}: cu_seqlens must be 1-D of length batch+1 >= 2, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{op}: cu_seqlens must be on {device}, got {cu_seqlens.device}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{op}: cu_seqlens must start at 0, got {cu[0]}")
    if any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{op}: cu_seqlens must be non-decreasing, got {cu}")
    if cu[-1] != total:
        raise ValueError(f"{op}: cu_seqlens must end at total_tokens={total}, got {cu[-1]}")
    return cu
