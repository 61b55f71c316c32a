"""The one tolerance rule, shape sets and helpers shared by tests and benchmarks.

Tolerance (FlashAttention's rule): a low-precision implementation is compared with the reference computed
in fp32/fp64, and may err by at most twice what the reference itself errs when run in the same low
precision, plus a small floor:  max|out - ref32| <= 2 * max|ref_lowp - ref32| + floor[dtype].
fp32 implementations must match the fp32 reference to ~1e-5 relative.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

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


# ---- reproducible random data -------------------------------------------------------------------------------
# Every seed derives from one base seed per test (tests/conftest.py sets it from the test's node id) and a counter:
# the n-th randn call of a test draws from stable_seed(base, n), so each call has its own stream, the same node id
# gives the same data in every run, and torch's global generator is never touched. Outside a test (benchmarks,
# scripts) the base is 0: reproducible per process as well.
_SEED_STATE: tuple[str, int, Iterator[int]] = ("", 0, itertools.count())


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from the text of `parts`, the same in every process (sha256, not Python's salted hash())."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seed_for_test(node_id: str) -> int:
    """Base seed of the test `node_id`: FASTENC_TEST_SEED when set (an integer, for every test), else
    stable_seed(node_id)."""
    env = os.environ.get("FASTENC_TEST_SEED", "").strip()
    if env:
        try:
            return int(env, 0) & (2**63 - 1)
        except ValueError:
            raise ValueError(f"FASTENC_TEST_SEED must be an integer, got {env!r}") from None
    return stable_seed(node_id)


def set_test_seed(node_id: str, base: int | None = None) -> int:
    """Start the seed stream of test `node_id` (base from seed_for_test unless given); returns the base."""
    global _SEED_STATE
    base = seed_for_test(node_id) if base is None else int(base)
    _SEED_STATE = (node_id, base, itertools.count())
    return base


def current_seed() -> tuple[str, int]:
    """(node id, base seed) of the running test ('', 0 outside a test)."""
    return _SEED_STATE[0], _SEED_STATE[1]


def next_seed() -> int:
    """The seed of the next random draw in this test: stable_seed(base, n) for its n-th draw."""
    _, base, counter = _SEED_STATE
    return stable_seed(base, next(counter))


def generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator seeded with `seed`, or with next_seed() when none is given."""
    return torch.Generator(device="cpu").manual_seed(next_seed() if seed is None else int(seed))


def randn(*shape: int, dtype=torch.float32, device="cpu", scale: float = 1.0, seed: int | None = None) -> torch.Tensor:
    """Fresh standard-normal data of `shape` (times `scale`) in `dtype` on `device`, drawn on the CPU.

    seed: an explicit seed (the same data wherever it is called); by default the next seed of the running test's
    stream (next_seed()). Never reads or advances torch's global generator.
    """
    return (torch.randn(*shape, generator=generator(seed)) * scale).to(device=device, dtype=dtype)


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
    """The device a backend's tests put their tensors on: the first of its declared test devices that torch sees
    (a GPU when there is one; the cpu backend: CPU), else the first (then registry.runs_on skips its tests)."""
    from fastenc import backends

    devices = backends.get(backend).test_devices
    return next((d for d in devices if backends.visible(d)), devices[0])


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
