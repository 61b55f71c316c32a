"""Standard Impl builders for the four backends, so each op file only names its functions."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from fastenc import extension, registry
from fastenc.registry import FLOAT_DTYPES, Impl


def reference(op: str, fn: Callable, **kw) -> Impl:
    return registry.register(Impl(op=op, backend="reference", fn=fn, devices=("cpu", "cuda"), priority=0, **kw))


def _lazy(module: str, name: str) -> Callable:
    """Resolve module.name at first call (keeps triton and the extension out of import time)."""
    cache: list[Callable] = []

    def call(*args, **kwargs):
        if not cache:
            cache.append(getattr(importlib.import_module(module), name))
        return cache[0](*args, **kwargs)

    call.__name__ = name
    return call


def triton(op: str, module: str, name: str, check: Callable[[Mapping[str, Any]], list[str]] | None = None,
           dtypes=FLOAT_DTYPES, priority: int = 30, limits: str = "", wrap: Callable | None = None) -> Impl:
    def full_check(inputs):
        return registry.triton_check(inputs) + (check(inputs) if check else [])

    def probe():
        why = registry.triton_available()
        if why:
            return why
        import torch
        if torch.cuda.is_available():
            return None
        return None if registry.interpreter_on() else "no CUDA device (CPU tensors need TRITON_INTERPRET=1)"

    fn = _lazy(module, name)
    return registry.register(Impl(op=op, backend="triton", fn=wrap(fn) if wrap else fn, devices=("cuda", "cpu"),
                                  auto_devices=("cuda",), dtypes=dtypes, priority=priority,
                                  available=registry.triton_available, check=full_check, probe=probe,
                                  limits=limits or "CUDA; CPU tensors under TRITON_INTERPRET=1"))


def _ext_fn(name: str, loader: str = "load") -> Callable:
    """`name` of the extension half that extension.<loader>() returns (load: cpu, load_cuda: cuda), per call."""
    def call(*args, **kwargs):
        return getattr(getattr(extension, loader)(), name)(*args, **kwargs)

    call.__name__ = name
    return call


def cpu(op: str, name: str, check=None, dtypes=FLOAT_DTYPES, priority: int = 20, limits: str = "fp32 math") -> Impl:
    return registry.register(Impl(op=op, backend="cpu", fn=_ext_fn(name), devices=("cpu",), dtypes=dtypes,
                                  priority=priority, available=extension.cpu_available, probe=extension.status,
                                  check=check, limits=limits))


def cuda(op: str, name: str, check=None, dtypes=FLOAT_DTYPES, priority: int = 20, limits: str = "",
         wrap: Callable | None = None) -> Impl:
    def probe():
        import torch
        if torch.version.cuda is None:
            return "torch has no CUDA"
        return extension.status("cuda")

    fn = _ext_fn(name, "load_cuda")
    return registry.register(Impl(op=op, backend="cuda", fn=wrap(fn) if wrap else fn, devices=("cuda",), dtypes=dtypes,
                                  priority=priority, available=extension.cuda_available, probe=probe,
                                  check=check, limits=limits))
