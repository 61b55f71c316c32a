"""Checks of command-line arguments, run before any work: each returns the checked value or raises UsageError,
whose message names the argument, what it expects and what it got. fastenc.cli.main prints it as one line on
stderr (`fastenc <command>: <message>`) and exits 2."""
from __future__ import annotations

import math
import os
from pathlib import Path


class UsageError(ValueError):
    """A command-line argument that cannot work (the message names it, what it expects and what it got)."""


def device(value: str | None, flag: str = "--device"):
    """None (the command's default) or a torch.device: cpu, cuda or cuda:N; cuda only when a CUDA device is
    available, cuda:N only for an existing device N."""
    if value is None:
        return None
    import torch

    expected = f"{flag} must be cpu, cuda or cuda:N"
    try:
        d = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"{expected}, got {value!r}") from None
    if d.type not in ("cpu", "cuda"):
        raise UsageError(f"{expected}, got {value!r}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{flag} {value!r} needs a CUDA device, but torch sees none (torch {torch.__version__}, "
                             f"built with CUDA {torch.version.cuda}); use --device cpu")
        n = torch.cuda.device_count()
        if d.index is not None and not 0 <= d.index < n:
            raise UsageError(f"{flag} must name one of the {n} CUDA device(s) (cuda:0 to cuda:{n - 1}), got {value!r}")
    return d


def at_least(value, low: int, flag: str):
    """None (the default) or an integer >= low."""
    if value is not None and value < low:
        raise UsageError(f"{flag} must be an integer >= {low}, got {value}")
    return value


def threads(value: int | None, flag: str = "--threads") -> int | None:
    """None (all cores) or a thread count >= 1."""
    return at_least(value, 1, flag)


def positive(value: float | None, flag: str) -> float | None:
    """None (the default) or a finite number > 0 (a learning rate)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a finite number > 0, got {value:g}")
    return value


def output_folder(value, flag: str = "--out") -> Path:
    """A folder that can be created or written: not an existing file, under no existing file, and the nearest
    existing folder on its path writable by this process."""
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} must be a folder (new or existing), got the existing file {str(p)!r}")
    parent = p
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{flag} must be a folder (new or existing), got {str(p)!r} under the file {str(parent)!r}")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} must be a folder this process can write, got {str(p)!r} ({str(parent)!r} is not "
                         f"writable)")
    return p
