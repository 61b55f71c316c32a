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
