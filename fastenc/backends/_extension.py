"""How the extension backends (cpu, cuda) name an op's function: a symbol of one half of the C++ extension."""
from __future__ import annotations

from typing import Callable

from fastenc import extension


def extension_fn(name: str, loader: str) -> Callable:
    """The extension symbol `name` of the half extension.<loader>() returns (load: cpu, load_cuda: cuda), looked
    up per call (the build happens at the first one)."""
    def call(*args, **kwargs):
        return getattr(getattr(extension, loader)(), name)(*args, **kwargs)

    call.__name__ = name
    return call
