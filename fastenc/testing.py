"""The one tolerance rule, shape sets and helpers shared by tests and benchmarks.

Tolerance (FlashAttention's rule): a low-precision implementation is compared with the reference computed
in fp32/fp64, and may err by at most twice what the reference itself errs when run in the same low
precision, plus a small floor:  max|out - ref32| <= 2 * max|ref_lowp - ref32| + floor[dtype].
fp32 implementations must match the fp32 reference to ~1e-5 relative.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from fastenc import registry

FLOORS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-10}
# Odd hidden sizes and lengths that real models use or that break power-of-two assumptions.
HIDDEN_SIZES = (384, 1000, 1152)
SEQ_LENS = (1, 17, 129)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dtype_id(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def tolerance(ref32: torch.Tensor, ref_lowp: torch.Tensor | None, dtype: torch.dtype, extra: float = 0.0) -> float:
    """Allowed max abs error for an output of `dtype` against the fp32 reference `ref32`.

    `extra` widens the floor for documented reasons (e.g. one bf16 ulp for the Triton interpreter's
    truncating fp32->bf16 cast).
    """
    scale = float(ref32.abs().max()) if ref32.numel() else 0.0
    if dtype == torch.float32 or ref_lowp is None:
        return FLOORS[torch.float32] * max(1.0, scale) + extra
    lowp_err = float((ref_lowp.double() - ref32.double()).abs().max()) if ref32.numel() else 0.0
    return 2.0 * lowp_err + FLOORS[dtype] * max(1.0, scale) + extra


def bf16_ulp(ref32: torch.Tensor) -> float:
    """One bf16 unit in the last place at the magnitude of `ref32` (2^-7 relative)."""
    return float(ref32.abs().max()) * 2.0 ** -7 if ref32.numel() else 0.0


def assert_close(out: torch.Tensor, ref32: torch.Tensor, ref_lowp: torch.Tensor | None = None, *,
                 dtype: torch.dtype | None = None, extra: float = 0.0, name: str = "out") -> None:
    """Assert the tolerance rule; NaN or Inf never passes; shapes must match exactly."""
    dtype = dtype or out.dtype
    assert out.shape == ref32.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref32.shape)}"
    if out.numel() == 0:
        return
    o = out.detach().double().cpu()
    r = ref32.detach().double().cpu()
    assert torch.isfinite(o).all(), f"{name}: non-finite values in output ({(~torch.isfinite(o)).sum().item()} of {o.numel()})"
    err = float((o - r).abs().max())
    tol = tolerance(ref32.detach().cpu(), None if ref_lowp is None else ref_lowp.detach().cpu(), dtype, extra)
    assert err <= tol, f"{name}: max abs error {err:.3e} > tolerance {tol:.3e} ({dtype_id(dtype)})"


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so an element a kernel forgets to write fails the comparison."""
    return t.fill_(float("nan"))


def randn(*shape: int, dtype=torch.float32, device="cpu", scale: float = 1.0, seed: int | None = None) -> torch.Tensor:
    """Fresh random data (never zeros); `seed` for reproducibility within a test."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed if seed is not None else torch.seed() % (2**31))
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def shape_id(shape) -> str:
    """Readable test id of a shape: (17, 1000) -> '17x1000'."""
    return "x".join(map(str, shape))


def interpreter_extra(backend: str, dtype: torch.dtype, ref32: torch.Tensor) -> float:
    """One bf16 ulp of slack for the Triton interpreter's truncating fp32->bf16 cast (0 elsewhere)."""
    if backend == "triton" and dtype == torch.bfloat16 and registry.interpreter_on():
        return bf16_ulp(ref32)
    return 0.0


TEST_BACKENDS_ENV = "FASTENC_TEST_BACKENDS"


def selected_backends() -> tuple[str, ...] | None:
    """Backends named by FASTENC_TEST_BACKENDS (comma-separated; unset or empty: all). The GPU check runs the
    cuda and triton cases in separate processes with it, so a device fault in one cannot poison the other."""
    import os

    value = os.environ.get(TEST_BACKENDS_ENV, "").strip()
    return registry._parse_backends(value, TEST_BACKENDS_ENV) if value else None


def backends_for(op: str, device: str | None = None) -> list[str]:
    """Backends of `op` whose tests run in this process: those FASTENC_TEST_BACKENDS selects (default all) that
    can run on their test device here, device_for(backend) unless `device` is given (registry.runs_on: cuda with
    a GPU; triton on a GPU, or on CPU tensors under the interpreter; cpu and reference always)."""
    wanted = selected_backends()
    out = [name for name, impl in registry.impls(op).items()
           if (wanted is None or name in wanted) and registry.runs_on(impl, device or device_for(name)) is None]
    return sorted(out, key=registry.BACKENDS.index)


def device_for(backend: str) -> str:
    """The device a backend's tests put their tensors on: a GPU when there is one (cpu backend: CPU)."""
    if backend == "cpu":
        return "cpu"
    return "cuda" if backend == "cuda" or torch.cuda.is_available() else "cpu"


# ---- test cases derived from each backend's declared capabilities ----

_FAKE_MODE: list = []


def fake(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    """A tensor with shape, dtype and device but no data (a FakeTensor, so 'cuda' works without a GPU): what a
    test case will pass, described for the registry's checks at collection time."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not _FAKE_MODE:
        _FAKE_MODE.append(FakeTensorMode(allow_non_fake_inputs=True))
    with _FAKE_MODE[0]:
        return torch.empty(shape, dtype=dtype, device=device)


def cannot_serve(op: str, backend: str, inputs: dict[str, Any]) -> list[str]:
    """Why `backend`'s implementation of `op` cannot serve `inputs` by its declared capabilities (devices, dtypes,
    the op's own checks); whether the backend is available in this process is not asked (backends_for does)."""
    import dataclasses

    impl = registry.impl(op, backend)
    return dataclasses.replace(impl, available=None).not_supported_reasons(inputs)


# Every case list built by `cases`, as (op, param, inputs): lets a test re-check the derivation.
DERIVED: list[tuple[str, Any, dict[str, Any]]] = []


def cases(op: str, combos: Iterable[Sequence[Any]], inputs: Callable[..., dict[str, Any]],
          ids: Callable[..., str]) -> list:
    """pytest params for `combos` (tuples whose first item is the backend), keeping the ones the backend can
    serve: `inputs(*combo)` describes the case's call for the registry (`fake` tensors on the backend's test
    device, keys as the op passes them to registry.select); `ids(*combo)` names the case."""
    import pytest

    out = []
    for combo in combos:
        combo = tuple(combo)
        case_inputs = inputs(*combo)
        if cannot_serve(op, combo[0], case_inputs):
            continue
        p = pytest.param(*combo, id=ids(*combo))
        DERIVED.append((op, p, case_inputs))
        out.append(p)
    return out


def dtype_cases(op: str, dtypes: Iterable[torch.dtype] | Callable[[str], Iterable[torch.dtype]],
                inputs: Callable[[str, torch.dtype], dict[str, Any]]) -> list:
    """`cases` over backends_for(op) x dtypes (a list, or backend -> list), ids like 'cuda-bf16'."""
    per = dtypes if callable(dtypes) else (lambda b, d=tuple(dtypes): d)
    return cases(op, ((b, dt) for b in backends_for(op) for dt in per(b)), inputs,
                 ids=lambda b, dt: f"{b}-{dtype_id(dt)}")


def backend_cases(op: str, inputs: Callable[[str], dict[str, Any]]) -> list:
    """`cases` for a test parametrized by backend alone: backends_for(op) that can serve `inputs(backend)`."""
    return cases(op, ((b,) for b in backends_for(op)), inputs, ids=lambda b: b)


def out_cases(backends: Iterable[str], op: str | None = None) -> list:
    """pytest params (backend, dtype, inplace) for an op's out= tests: every backend x dtype, into a separate
    tensor and in place; with `op`, only the (backend, dtype) pairs the backend can serve (x: (rows, hidden))."""
    combos = [(be, dt, inplace) for be in backends for dt in DTYPES for inplace in (True, False)]
    ids = lambda be, dt, inplace: f"{be}-{dtype_id(dt)}-{'inplace' if inplace else 'out'}"  # noqa: E731
    if op is not None:
        return cases(op, combos, lambda be, dt, _: {"x": fake(7, 1000, dtype=dt, device=device_for(be))}, ids)
    import pytest

    return [pytest.param(*c, id=ids(*c)) for c in combos]
