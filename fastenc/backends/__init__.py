"""The backends. Each is one module of this package declaring `BACKEND = Backend(...)`: its name, the devices it
serves (ANY: every torch device type), those automatic selection picks it on, where its tests put tensors, its
availability (costly, at dispatch) and probe (cheap, for `fastenc info`), the check every one of its
implementations adds, its device rule, and how an op names its function (`resolve`). The registry derives its
backend names and device rules from these declarations; op modules declare their implementations with
fastenc.ops._backends.implement(op, backend, target...); testing, benchmarks and the CLI iterate `declared()`.
Adding a backend is one new module here (and its implementations of the ops it serves).
Nothing here imports triton or builds an extension at import time.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

ANY = "*"  # in Backend.devices: every torch device type
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Backend:
    """One backend's declaration.

    name:         what backend=, use_backend and FASTENC_BACKEND call it.
    order:        its place in listings (fastenc info, test ids), lowest first.
    devices:      torch device types its implementations run on (ANY: all).
    resolve:      (target...) -> the callable an implementation runs: how an op names its function for this
                  backend (a Python callable, a "module", "name" pair imported at first call, an extension symbol).
    priority:     default priority of its implementations (higher wins in automatic selection).
    auto_devices: devices automatic selection picks it on (None: all of `devices`).
    test_devices: where its tests put tensors: the first one torch sees, else the first.
    limits:       default human-readable limits for `fastenc info`.
    available:    () -> reason or None, may be costly (called at dispatch only).
    probe:        () -> reason or None, cheap (for `fastenc info`; must not build anything).
    check:        (inputs) -> reasons, added before every implementation's own check.
    device_rule:  (device type) -> reason or None: a device it declares but cannot use in this process.
    """

    name: str
    order: int
    devices: tuple[str, ...]
    resolve: Callable[..., Callable]
    priority: int = 0
    auto_devices: tuple[str, ...] | None = None
    test_devices: tuple[str, ...] = ("cpu",)
    limits: str = ""
    available: Callable[[], str | None] | None = None
    probe: Callable[[], str | None] | None = None
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    device_rule: Callable[[str], str | None] | None = None


def serves(devices: tuple[str, ...], device: str) -> bool:
    """Whether a devices tuple (a Backend's or an implementation's) takes `device`."""
    return ANY in devices or device in devices


def visible(device: str) -> bool:
    """Whether torch sees a `device` device in this process (cpu and meta always; cuda, xpu, mps ... when their
    torch module says it is available)."""
    if device in ("cpu", "meta"):
        return True
    module = getattr(torch, device, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


def lazy(module: str, name: str) -> Callable:
    """module.name resolved at first call (keeps triton and the kernels out of import time)."""
    cache: list[Callable] = []

    def call(*args, **kwargs):
        if not cache:
            cache.append(getattr(importlib.import_module(module), name))
        return cache[0](*args, **kwargs)

    call.__name__ = name
    return call


_DECLARED: list[tuple[Backend, ...]] = []


def declared() -> tuple[Backend, ...]:
    """Every backend of this package, by `order` (the modules are imported on the first call)."""
    if not _DECLARED:
        found = []
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                found.append(importlib.import_module(f"{__name__}.{info.name}").BACKEND)
        names = [b.name for b in found]
        if len(set(names)) != len(names):
            raise ValueError(f"fastenc.backends: a backend name is declared twice: {sorted(names)}")
        _DECLARED.append(tuple(sorted(found, key=lambda b: (b.order, b.name))))
    return _DECLARED[0]


def names() -> tuple[str, ...]:
    return tuple(b.name for b in declared())


def get(name: str) -> Backend:
    for b in declared():
        if b.name == name:
            return b
    raise ValueError(f"unknown backend {name!r}; expected one of {list(names())}")
