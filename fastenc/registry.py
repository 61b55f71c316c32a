"""Op registry: each op's implementations declare what they support; dispatch picks one.

Modelled on xformers' fmha dispatch: every implementation answers `not_supported_reasons(inputs)`, the
dispatcher walks a priority list and, when nothing fits an explicit choice, raises listing every reason.

Choice order: explicit `backend=` argument, then `fastenc.use_backend(...)`, then the `FASTENC_BACKEND`
environment variable (comma-separated preference list), then each implementation's default priority.
Nothing here touches a GPU, imports triton or builds an extension at import time.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

log = logging.getLogger("fastenc")

BACKENDS = ("reference", "triton", "cuda", "cpu")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_REGISTRY: dict[str, dict[str, "Impl"]] = {}
_CONTEXT: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("fastenc_backend", default=None)
_WARNED: set[tuple] = set()


@dataclass(frozen=True)
class Impl:
    """One implementation of one op.

    fn:        the callable doing the work (same signature as the op's custom-op body).
    devices:   torch device types it can run on ("cpu", "cuda").
    dtypes:    input dtypes it accepts.
    priority:  higher wins in automatic selection.
    available: () -> reason string or None; may be costly (builds an extension), called only at dispatch.
    check:     (inputs) -> list of reasons these particular inputs cannot be served (head dim, sizes ...).
    limits:    human-readable limits for `fastenc info`.
    probe:     cheap version of `available` for `fastenc info` (must not build anything).
    auto_devices: devices on which automatic selection may pick it (None: all of `devices`); triton
               under the CPU interpreter is for testing, not speed, so it is never picked on CPU.
    """

    op: str
    backend: str
    fn: Callable[..., Any]
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    priority: int = 0
    available: Callable[[], str | None] | None = None
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    limits: str = ""
    probe: Callable[[], str | None] | None = None
    auto_devices: tuple[str, ...] | None = None

    def unavailable_reason(self) -> str | None:
        return self.available() if self.available is not None else None

    def may_serve(self, t: torch.Tensor | None, auto: bool) -> bool:
        """Cheap pre-check on device and dtype only (no reason strings): False means not_supported_reasons
        would name the device or dtype."""
        if t is None:
            return True
        dev = t.device.type
        if dev not in self.devices or t.dtype not in self.dtypes:
            return False
        return not (auto and self.auto_devices is not None and dev not in self.auto_devices)

    def not_supported_reasons(self, inputs: Mapping[str, Any], auto: bool = False) -> list[str]:
        """Why this implementation cannot serve `inputs` (empty list: it can)."""
        reasons: list[str] = []
        t = _primary_tensor(inputs)
        if t is not None:
            if t.device.type not in self.devices:
                reasons.append(f"device {t.device.type} not in {list(self.devices)}")
            elif auto and self.auto_devices is not None and t.device.type not in self.auto_devices:
                reasons.append(f"not chosen automatically on {t.device.type} (select it explicitly)")
            if t.dtype not in self.dtypes:
                reasons.append(f"dtype {_dt(t.dtype)} not in {[_dt(d) for d in self.dtypes]}")
        if not reasons and self.check is not None:
            reasons.extend(self.check(inputs))
        if not reasons:
            why = self.unavailable_reason()
            if why:
                reasons.append(why)
        return reasons


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _primary_tensor(inputs: Mapping[str, Any]) -> torch.Tensor | None:
    for v in inputs.values():
        if isinstance(v, torch.Tensor):
            return v
    return None


_RANKED: dict[str, tuple[tuple["Impl", ...], list["Impl"]]] = {}


def register(impl: Impl) -> Impl:
    if impl.backend not in BACKENDS:
        raise ValueError(f"register: backend must be one of {BACKENDS}, got {impl.backend!r}")
    _REGISTRY.setdefault(impl.op, {})[impl.backend] = impl
    return impl


def _ranked(op: str) -> list[Impl]:
    """The op's implementations by priority, highest first; recomputed whenever the op's table changed."""
    table = _REGISTRY.get(op)
    current = tuple(table.values()) if table is not None else tuple(impls(op).values())
    cached = _RANKED.get(op)
    if cached is None or len(cached[0]) != len(current) or any(a is not b for a, b in zip(cached[0], current)):
        cached = _RANKED[op] = (current, sorted(current, key=lambda i: -i.priority))
    return cached[1]


def ops() -> list[str]:
    return sorted(_REGISTRY)


def impls(op: str) -> dict[str, Impl]:
    if op not in _REGISTRY:
        raise ValueError(f"unknown op {op!r}; known ops: {ops()}")
    return dict(_REGISTRY[op])


def impl(op: str, backend: str) -> Impl:
    """The op's `backend` implementation (no copy of the table: the custom ops call this on every dispatch)."""
    try:
        return _REGISTRY[op][backend]
    except KeyError:
        raise ValueError(f"{op}: no {backend!r} implementation; registered: {sorted(impls(op))}") from None


def _parse_backends(value: str | Sequence[str], source: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for n in names:
        for part in str(n).split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in BACKENDS:
                raise ValueError(f"{source}: unknown backend {part!r}; expected one of {list(BACKENDS)}")
            out.append(part)
    if not out:
        raise ValueError(f"{source}: no backend named (expected one of {list(BACKENDS)})")
    return tuple(out)


@contextlib.contextmanager
def use_backend(*names: str):
    """Prefer these backends, in order, inside the block: `with fastenc.use_backend("cpu"): ...`.

    The first listed backend that can serve the inputs is used; if none can, the op raises listing why.
    """
    token = _CONTEXT.set(_parse_backends(names, "use_backend"))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def _requested(backend: str | Sequence[str] | None) -> tuple[tuple[str, ...] | None, str]:
    if backend is not None:
        return _parse_backends(backend, "backend"), "backend argument"
    ctx = _CONTEXT.get()
    if ctx is not None:
        return ctx, "use_backend"
    env = os.environ.get("FASTENC_BACKEND", "").strip()
    if env:
        return _parse_backends(env, "FASTENC_BACKEND"), "FASTENC_BACKEND"
    return None, ""


def requested_backends() -> tuple[str, ...] | None:
    """The backend choice in force (use_backend, else FASTENC_BACKEND), None for automatic selection; ValueError
    naming FASTENC_BACKEND when it names no backend."""
    return _requested(None)[0]


def backend_allowed(backend: str) -> bool:
    """Whether the backend choice in force for this call (use_backend, else FASTENC_BACKEND) admits `backend`;
    True under automatic selection. Layers ask this before using a backend's own resources (the cpu backend's
    buffer cache), so under use_backend("reference") nothing of the other backends runs."""
    wanted, _ = _requested(None)
    return wanted is None or backend in wanted


def select(op: str, inputs: Mapping[str, Any], backend: str | Sequence[str] | None = None) -> Impl:
    """Pick the implementation of `op` for `inputs` (see module docstring for the order)."""
    wanted, source = _requested(backend)
    if wanted is not None:
        table = impls(op)
        reasons: list[str] = []
        for name in wanted:
            impl = table.get(name)
            if impl is None:
                reasons.append(f"{name}: {op} has no {name} implementation")
                continue
            why = impl.not_supported_reasons(inputs)
            if not why:
                return impl
            reasons.append(f"{name}: " + "; ".join(why))
        raise ValueError(f"{op}: {source} {list(wanted)} cannot serve these inputs: " + " | ".join(reasons))
    skipped: list[str] = []
    t = _primary_tensor(inputs)
    for impl in _ranked(op):
        if not impl.may_serve(t, auto=True):  # a device/dtype skip: never warned about, so no reason kept
            continue
        why = impl.not_supported_reasons(inputs, auto=True)
        if not why:
            if skipped and any(s.split(":")[0] != "reference" for s in skipped):
                _warn_once(op, impl.backend, skipped)
            return impl
        skipped.append(f"{impl.backend}: " + "; ".join(why))
    skipped = [f"{i.backend}: " + "; ".join(i.not_supported_reasons(inputs, auto=True)) for i in _ranked(op)]
    raise ValueError(f"{op}: no implementation can serve these inputs: " + " | ".join(skipped))


def select_backward(op: str, inputs: Mapping[str, Any], forward_backend: str) -> Impl:
    """Pick the implementation of a backward op (`<op>_bwd`) for `inputs`.

    The backward runs on the backend that ran the forward when that backend's backward can serve the inputs;
    otherwise the automatic choice (highest priority that can serve) takes it and a warning says so once.
    When nothing can serve, ValueError lists every backend's reason. Ops call this before running the forward
    when a gradient will be needed, so an unservable backward fails before any kernel runs.
    """
    table = impls(op)
    own = table.get(forward_backend)
    why = ([f"{op} has no {forward_backend} implementation"] if own is None
           else own.not_supported_reasons(inputs))
    if not why:
        return own
    reasons: list[str] = []
    for impl in _ranked(op):
        r = impl.not_supported_reasons(inputs, auto=True)
        if not r:
            key = (op, forward_backend, impl.backend, tuple(why))
            if key not in _WARNED:
                _WARNED.add(key)
                msg = f"fastenc: {op} runs on {impl.backend}, not {forward_backend}: " + "; ".join(why)
                log.warning(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
            return impl
        reasons.append(f"{impl.backend}: " + "; ".join(r))
    raise ValueError(f"{op}: the forward ran on {forward_backend}, and no backend can compute the backward for "
                     f"these inputs: {forward_backend}: " + "; ".join(why) + " | " + " | ".join(reasons))


def _warn_once(op: str, chosen: str, skipped: list[str]) -> None:
    # Only warn when a backend that would normally serve this device was unavailable (not for the
    # ordinary "triton is cuda-only" skips on CPU).
    real = [s for s in skipped if "device " not in s and "not chosen automatically" not in s and "dtype " not in s]
    if not real:
        return
    key = (op, chosen, tuple(real))
    if key in _WARNED:
        return
    _WARNED.add(key)
    msg = f"fastenc: {op} falls back to {chosen}: " + " | ".join(real)
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


# ---- availability probes (called at dispatch time, never at import) ----

def triton_available() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_NEEDS_INTERPRETER = "CPU tensors need TRITON_INTERPRET=1 (set before triton is imported)"


def triton_check(inputs: Mapping[str, Any]) -> list[str]:
    """Shared check for Triton implementations: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    t = _primary_tensor(inputs)
    if t is not None and t.device.type == "cpu" and not interpreter_on():
        return [_NEEDS_INTERPRETER]
    return []


def runs_on(impl: Impl, device: str | torch.device, *, for_speed: bool = False) -> str | None:
    """Why `impl` cannot run on `device` in this process (None: it can). The one statement of the device rules
    that tests, benchmarks and the GPU check ask instead of restating them:
      - the implementation's declared devices;
      - a CUDA device only when torch sees one;
      - Triton on CPU tensors only under the interpreter (TRITON_INTERPRET=1);
      - for_speed: only devices automatic selection picks it on (`auto_devices`): Triton under the CPU
        interpreter is a test path, never a speed path, so benchmarks do not time it.
    """
    dev = torch.device(device).type
    if dev not in impl.devices:
        return f"runs on {list(impl.devices)}, not {dev}"
    if dev == "cuda" and not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if impl.backend == "triton" and dev == "cpu" and not interpreter_on():
        return _NEEDS_INTERPRETER
    if for_speed and impl.auto_devices is not None and dev not in impl.auto_devices:
        return (f"not chosen automatically on {dev}: a test path (CPU tensors run under the Triton interpreter), "
                f"not a speed path")
    return None


def info_table() -> list[tuple[str, str, str]]:
    """(op, backend, 'available' or the reason not) for every registered implementation."""
    rows = []
    for op in ops():
        for backend in BACKENDS:
            impl = _REGISTRY[op].get(backend)
            if impl is None:
                rows.append((op, backend, "not implemented"))
                continue
            why = (impl.probe or impl.available or (lambda: None))()
            rows.append((op, backend, "available" + (f" ({impl.limits})" if impl.limits else "") if not why else why))
    return rows
