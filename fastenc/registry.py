"""Op registry: each op's implementations declare what they support; dispatch picks one.

Modelled on xformers' fmha dispatch: every implementation answers `not_supported_reasons(inputs)`, the
dispatcher walks a priority list and, when nothing fits an explicit choice, raises listing every reason.

Choice order: explicit `backend=` argument, then `fastenc.use_backend(...)`, then the `FASTENC_BACKEND`
environment variable (comma-separated preference list), then each implementation's default priority.
Nothing here touches a GPU, imports triton or builds an extension at import time.

The backends are declared in fastenc.backends, one module each: BACKENDS (their names, in listing order) and the
device rules of `runs_on` come from those declarations, and an implementation takes its backend's devices,
availability and checks (fastenc.ops._backends.implement builds it).

Cost of a dispatch: a decision is remembered per (op, the backend argument, the use_backend choice, the
FASTENC_BACKEND and TRITON_INTERPRET values, and each input's dtype, device type and shape, or value when it is not
a tensor): the facts every `check` reads. A repeated call looks the decision up instead of asking every
implementation again (and repeats the fallback warning only if the warned-once set was cleared). Availability
answers are taken as fixed once given (the extension remembers its build result); registering an implementation
forgets every decision. Nothing that guards memory is remembered: the ops validate cu_seqlens and positions on
every call, and the kernels bounds-check what they read.

Under torch.compile: dynamo traces `select` like any Python (the checks on shapes, dtypes and devices become its
guards) except for what it cannot trace, which is resolved by functions it treats as constants
(`_traced_constant`): the use_backend / FASTENC_BACKEND choice, each backend's availability, the TRITON_INTERPRET
flag and the fallback warning. Those are read once, when the graph is traced, and are not guarded: a compiled
graph keeps the backends chosen when it was traced; after changing use_backend or FASTENC_BACKEND around compiled
code, call torch.compiler.reset() (or compile afresh). The backend argument is a constant of the traced code and
is guarded like any other. So the public ops trace with no graph break and the backend name reaches the custom op
as a constant, while eager dispatch keeps its exact semantics. (Chosen over moving the choice into the custom ops'
bodies: the public functions also pick the backward before the forward runs, so that an unservable backward fails
before any kernel, and every op, attention included, dispatches through this one function.)
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from fastenc import backends as _declared
from fastenc.backends import ANY, FLOAT_DTYPES, serves, visible  # noqa: F401 (ANY, FLOAT_DTYPES: public names)
from fastenc.backends._env import compiling as _compiling, env as _env, primary_tensor as _primary_tensor
from fastenc.backends._env import traced_constant as _traced_constant
from fastenc.backends.triton import interpreter_on, triton_available, triton_check  # noqa: F401 (public names)

log = logging.getLogger("fastenc")

BACKENDS = _declared.names()

_REGISTRY: dict[str, dict[str, "Impl"]] = {}
_CONTEXT: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("fastenc_backend", default=None)
_WARNED: set[tuple] = set()
# op -> (its implementations when filled, {key: (implementation, fallback warning or None)}); see "Cost of a dispatch"
_DECISIONS: dict[str, tuple[tuple, dict[tuple, tuple]]] = {}
_DECISIONS_MAX = 4096  # forgotten all at once when full (varying token counts make new keys)


@dataclass(frozen=True)
class Impl:
    """One implementation of one op.

    fn:        the callable doing the work (same signature as the op's custom-op body).
    devices:   torch device types it can run on ("cpu", "cuda"; ANY: every one).
    dtypes:    input dtypes it accepts.
    priority:  higher wins in automatic selection.
    available: () -> reason string or None; may be costly (builds an extension), called only at dispatch.
    check:     (inputs) -> list of reasons these particular inputs cannot be served (head dim, sizes ...); may read
               only the tensors' dtype, device type and shape and the non-tensor values (the decision is
               remembered per those facts).
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
        if self.available is None:
            return None
        if _compiling():
            return _unavailable_traced(self.op, self.backend)
        return self.available()

    def may_serve(self, t: torch.Tensor | None, auto: bool) -> bool:
        """Cheap pre-check on device and dtype only (no reason strings): False means not_supported_reasons
        would name the device or dtype."""
        if t is None:
            return True
        dev = t.device.type
        if not serves(self.devices, dev) or t.dtype not in self.dtypes:
            return False
        return not (auto and self.auto_devices is not None and dev not in self.auto_devices)

    def not_supported_reasons(self, inputs: Mapping[str, Any], auto: bool = False) -> list[str]:
        """Why this implementation cannot serve `inputs` (empty list: it can)."""
        reasons: list[str] = []
        t = _primary_tensor(inputs)
        if t is not None:
            if not serves(self.devices, t.device.type):
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


_RANKED: dict[str, tuple[tuple["Impl", ...], list["Impl"]]] = {}


def register(impl: Impl) -> Impl:
    if impl.backend not in BACKENDS:
        raise ValueError(f"register: backend must be one of {BACKENDS}, got {impl.backend!r}")
    _REGISTRY.setdefault(impl.op, {})[impl.backend] = impl
    _DECISIONS.clear()
    return impl


@_traced_constant
def _unavailable_traced(op: str, backend: str) -> str | None:
    return _REGISTRY[op][backend].available()


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
    if _compiling():
        return _requested_traced()
    return _requested_now()


def _requested_now() -> tuple[tuple[str, ...] | None, str]:
    ctx = _CONTEXT.get()
    if ctx is not None:
        return ctx, "use_backend"
    env = _env("FASTENC_BACKEND").strip()
    if env:
        return _parse_backends(env, "FASTENC_BACKEND"), "FASTENC_BACKEND"
    return None, ""


_requested_traced = _traced_constant(lambda: _requested_now())  # a ContextVar is not traceable: read at trace time


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


def _facts(inputs: Mapping[str, Any]) -> tuple:
    """What the implementations' checks may read of `inputs` (see Impl.check): the key of a remembered decision."""
    return tuple((k, v.dtype, v.device.type, v.shape) if isinstance(v, torch.Tensor) else (k, v)
                 for k, v in inputs.items())


def _remembered(op: str, key: tuple) -> tuple[dict | None, tuple["Impl", tuple | None] | None]:
    """(the op's decision table, the decision for `key` or None). The table is forgotten when the op's
    implementations changed since it was filled (register, or a test swapping an entry)."""
    table = _REGISTRY.get(op)
    if table is None:
        return None, None
    current = tuple(table.values())
    entry = _DECISIONS.get(op)
    if entry is None or entry[0] != current:
        if len(_DECISIONS) >= _DECISIONS_MAX:
            _DECISIONS.clear()
        entry = _DECISIONS[op] = (current, {})
    decisions = entry[1]
    try:
        return decisions, decisions.get(key)
    except TypeError:  # an unhashable non-tensor input: not remembered
        return None, None


def _remember(decisions: dict | None, key: tuple, decision: tuple["Impl", tuple | None]) -> None:
    if decisions is None:
        return
    if len(decisions) >= _DECISIONS_MAX:
        decisions.clear()
    decisions[key] = decision


def select(op: str, inputs: Mapping[str, Any], backend: str | Sequence[str] | None = None) -> Impl:
    """Pick the implementation of `op` for `inputs` (see module docstring for the order)."""
    if _compiling():
        chosen, warning = _choose(op, inputs, backend)
        _emit(warning)
        return chosen
    ctx = _CONTEXT.get() if backend is None else None
    key = (backend if backend is None or isinstance(backend, str) else tuple(backend), ctx,
           _env("FASTENC_BACKEND") if backend is None and ctx is None else "", _env("TRITON_INTERPRET"),
           _facts(inputs))
    decisions, hit = _remembered(op, key)
    if hit is None:
        hit = _choose(op, inputs, backend)
        _remember(decisions, key, hit)
    _emit(hit[1])
    return hit[0]


def _choose(op: str, inputs: Mapping[str, Any], backend) -> tuple[Impl, tuple | None]:
    """(the implementation, the fallback warning to give once or None); ValueError listing every reason."""
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
                return impl, None
            reasons.append(f"{name}: " + "; ".join(why))
        raise ValueError(f"{op}: {source} {list(wanted)} cannot serve these inputs: " + " | ".join(reasons))
    skipped: list[str] = []
    t = _primary_tensor(inputs)
    for impl in _ranked(op):
        if not impl.may_serve(t, auto=True):  # a device/dtype skip: never warned about, so no reason kept
            continue
        why = impl.not_supported_reasons(inputs, auto=True)
        if not why:
            warning = None
            if skipped and any(s.split(":")[0] != "reference" for s in skipped):
                warning = _fallback_warning(op, impl.backend, skipped)
            return impl, warning
        skipped.append(f"{impl.backend}: " + "; ".join(why))
    skipped = [f"{i.backend}: " + "; ".join(i.not_supported_reasons(inputs, auto=True)) for i in _ranked(op)]
    raise ValueError(f"{op}: no implementation can serve these inputs: " + " | ".join(skipped))


def select_backward(op: str, inputs: Mapping[str, Any], forward_backend: str) -> Impl:
    """Pick the implementation of a backward op (`<op>_bwd`) for `inputs`.

    The backward runs on the backend that ran the forward when that backend's backward can serve the inputs;
    otherwise the automatic choice (highest priority that can serve) takes it and a warning says so once.
    When nothing can serve, ValueError lists every backend's reason. Ops call this before running the forward
    when a gradient will be needed, so an unservable backward fails before any kernel runs. Remembered like
    `select`'s decisions (it reads no backend choice, only the forward's backend).
    """
    if _compiling():
        chosen, warning = _choose_backward(op, inputs, forward_backend)
        _emit(warning)
        return chosen
    key = (forward_backend, _env("TRITON_INTERPRET"), _facts(inputs))
    decisions, hit = _remembered(op, key)
    if hit is None:
        hit = _choose_backward(op, inputs, forward_backend)
        _remember(decisions, key, hit)
    _emit(hit[1])
    return hit[0]


def _choose_backward(op: str, inputs: Mapping[str, Any], forward_backend: str) -> tuple[Impl, tuple | None]:
    table = impls(op)
    own = table.get(forward_backend)
    why = ([f"{op} has no {forward_backend} implementation"] if own is None
           else own.not_supported_reasons(inputs))
    if not why:
        return own, None
    reasons: list[str] = []
    for impl in _ranked(op):
        r = impl.not_supported_reasons(inputs, auto=True)
        if not r:
            msg = f"fastenc: {op} runs on {impl.backend}, not {forward_backend}: " + "; ".join(why)
            return impl, ((op, forward_backend, impl.backend, tuple(why)), msg)
        reasons.append(f"{impl.backend}: " + "; ".join(r))
    raise ValueError(f"{op}: the forward ran on {forward_backend}, and no backend can compute the backward for "
                     f"these inputs: {forward_backend}: " + "; ".join(why) + " | " + " | ".join(reasons))


def _fallback_warning(op: str, chosen: str, skipped: list[str]) -> tuple | None:
    # Only warn when a backend that would normally serve this device was unavailable (not for the
    # ordinary "triton is cuda-only" skips on CPU).
    real = [s for s in skipped if "device " not in s and "not chosen automatically" not in s and "dtype " not in s]
    if not real:
        return None
    return (op, chosen, tuple(real)), f"fastenc: {op} falls back to {chosen}: " + " | ".join(real)


def _emit(warning: tuple | None, stacklevel: int = 4) -> None:
    """Give a (key, message) warning once per key: logged, and a RuntimeWarning pointing `stacklevel` frames up
    from the dispatch function's caller's caller (the op's caller)."""
    if warning is None:
        return
    if _compiling():
        _warn_traced(warning)  # the warned-once set is read at trace time, not guarded on
    elif warning[0] not in _WARNED:
        _warn(warning, stacklevel + 1)


def _warn(warning: tuple, stacklevel: int) -> None:
    _WARNED.add(warning[0])
    log.warning(warning[1])
    warnings.warn(warning[1], RuntimeWarning, stacklevel=stacklevel)


_warn_traced = _traced_constant(lambda warning: None if warning[0] in _WARNED else _warn(warning, 2))


def runs_on(impl: Impl, device: str | torch.device, *, for_speed: bool = False) -> str | None:
    """Why `impl` cannot run on `device` in this process (None: it can). The one statement of the device rules
    that tests, benchmarks and the GPU check ask instead of restating them:
      - the implementation's declared devices;
      - a device other than the CPU only when torch sees one (a CUDA device: torch.cuda.is_available());
      - its backend's device rule (Triton on CPU tensors only under the interpreter, TRITON_INTERPRET=1);
      - for_speed: only devices automatic selection picks it on (`auto_devices`): Triton under the CPU
        interpreter is a test path, never a speed path, so benchmarks do not time it.
    """
    dev = torch.device(device).type
    if not serves(impl.devices, dev):
        return f"runs on {list(impl.devices)}, not {dev}"
    if not visible(dev):
        return f"no {dev.upper()} device visible to torch"
    rule = _declared.get(impl.backend).device_rule
    why = rule(dev) if rule is not None else None
    if why:
        return why
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
