"""gelu (exact erf, tanh and quick forms, optional fused bias): every backend against the fp32 reference."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import testing
from fastenc.reference import gelu_ref

OP = "gelu"
BACKENDS = testing.backends_for(OP)
# Odd widths; 4100 spans several column tiles of the Triton kernel; (2, 3, 1152) has extra leading dims.
SHAPES = [(1, 384), (17, 1000), (2, 3, 1152), (3, 4100)]


def torch_gelu(x, approximate):
    """torch's own GELU: F.gelu, or quick GELU as transformers' QuickGELUActivation, x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x) if approximate == "quick" else F.gelu(x, approximate=approximate)


def _check(backend, x, bias, approximate):
    out = fastenc.ops.gelu(x, bias, approximate=approximate, backend=backend)
    ref = gelu_ref(x, bias, approximate)
    lowp = gelu_ref(x, bias, approximate, upcast=False) if x.dtype != torch.float32 else None
    assert out.dtype == x.dtype and out.shape == x.shape
    testing.assert_close(out, ref, lowp, extra=testing.interpreter_extra(backend, x.dtype, ref))


def _x(backend, dtype=torch.float32, shape=(2, 384)):
    """The call a case makes, described for the registry (x on the backend's test device)."""
    return {"x": testing.fake(*shape, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, ((be, dt, sh, bias, ap) for be, dt, sh, (bias, ap) in itertools.product(
                          BACKENDS, testing.DTYPES, SHAPES, ((False, "none"), (True, "none"), (True, "tanh"), (True, "quick")))),
                      lambda be, dt, sh, bias, ap: _x(be, dt, sh),
                      ids=lambda be, dt, sh, bias, ap: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-{ap}"
                                                       f"{'-bias' if bias else ''}")
FP32 = testing.backend_cases(OP, _x)
ALL_DTYPES = testing.dtype_cases(OP, testing.DTYPES, _x)


@pytest.mark.parametrize("backend,dtype,shape,bias,approximate", CASES)
def test_gelu(backend, dtype, shape, bias, approximate):
    dev = testing.device_for(backend)
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=3.0)
    b = testing.randn(shape[-1], dtype=dtype, device=dev) if bias else None
    _check(backend, x, b, approximate)


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_gelu_tails_and_specials(backend, approximate):
    """Far tails (exp overflow/underflow in the tanh rewrite, erf saturation) and exact zeros, in fp32."""
    dev = testing.device_for(backend)
    x = torch.tensor([[-100.0, -30.0, -10.0, -5.5, -3.0, -1.27, -0.5, -1e-30, 0.0, 1e-30, 0.5, 1.27, 3.0, 5.5,
                       10.0, 30.0, 100.0]], device=dev)
    out = fastenc.ops.gelu(x, approximate=approximate, backend=backend)
    testing.assert_close(out, torch_gelu(x.double(), approximate).float())


@pytest.mark.parametrize("backend", FP32)
def test_gelu_non_contiguous(backend):
    dev = testing.device_for(backend)
    x = testing.randn(1000, 9, device=dev).t()
    b = testing.randn(2000, device=dev)[::2]
    assert not (x.is_contiguous() or b.is_contiguous())
    _check(backend, x, b, "none")
    _check(backend, x[:, ::3], None, "tanh")


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("shape", [(0, 384), (2, 0, 768), (3, 0), ()], ids=lambda s: testing.shape_id(s) or "scalar")
def test_gelu_empty_and_scalar(backend, shape):
    dev = testing.device_for(backend)
    x = torch.randn(shape, device=dev)
    out = fastenc.ops.gelu(x, backend=backend)
    assert out.shape == x.shape
    testing.assert_close(out, gelu_ref(x))


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Output poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.gelu import gelu_fwd

    dev = testing.device_for("triton")
    x, b = testing.randn(5, 2500, dtype=dtype, device=dev), testing.randn(2500, dtype=dtype, device=dev)
    y = testing.poison(torch.empty_like(x))
    gelu_fwd(x, b, "none", out=y)
    ref = gelu_ref(x, b)
    testing.assert_close(y, ref, gelu_ref(x, b, upcast=False) if dtype != torch.float32 else None,
                         extra=testing.interpreter_extra("triton", dtype, ref))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not registered")
@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_cpu_gelu_dense_accuracy(approximate):
    """The C++ kernel's own erf/exp (csrc/cpu/fast_math.h) on a dense fp32 grid against fp64: every form to
    1e-6 absolute everywhere (PyTorch's own fp32 GELU errs up to ~1.2e-6); the exact form to 1e-4 relative for
    x >= -3 (A&S 7.1.26's erf bound of 1.5e-7 absolute, carried through erfc without cancellation)."""
    x = torch.linspace(-12.0, 12.0, 240001)
    out = fastenc.ops.gelu(x, approximate=approximate, backend="cpu").double()
    ref = torch_gelu(x.double(), approximate)
    assert float((out - ref).abs().max()) <= 1e-6
    if approximate == "none":
        sel = x >= -3.0
        rel = ((out - ref).abs() / ref.abs().clamp_min(1e-300))[sel]
        assert float(rel.max()) <= 1e-4, float(rel.max())


OUT_CASES = testing.out_cases(BACKENDS, OP)


@pytest.mark.parametrize("backend,dtype,inplace", OUT_CASES)
def test_gelu_into_out(backend, dtype, inplace):
    """out= writes the result into the given tensor, which may be x itself (over the GEMM output it consumes)."""
    dev = testing.device_for(backend)
    x = testing.randn(3, 7, 1000, dtype=dtype, device=dev, scale=3.0)
    b = testing.randn(1000, dtype=dtype, device=dev)
    ref = gelu_ref(x, b)
    lowp = gelu_ref(x, b, upcast=False) if dtype != torch.float32 else None
    target = x.clone() if inplace else testing.poison(torch.empty_like(x))
    src = target if inplace else x
    got = fastenc.ops.gelu(src, b, backend=backend, out=target)
    assert got.data_ptr() == target.data_ptr()
    testing.assert_close(target, ref, lowp, extra=testing.interpreter_extra(backend, dtype, ref))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not available")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cpu_gelu_limits(approximate):
    """The CPU kernel's tail cut (x < -13 -> -0) near the infinities; -inf gives NaN as torch's F.gelu, NaN stays NaN."""
    x = torch.tensor([[float("-inf"), -1e30, -13.5, -12.9, float("inf"), 1e30, float("nan")]])
    out = fastenc.ops.gelu(x, approximate=approximate, backend="cpu")
    assert out[0, 1:4].abs().max() < 1e-30 and bool(torch.signbit(out[0, 1])) and bool(out[0, 0].isnan())
    assert out[0, 4] == float("inf") and out[0, 5] == 1e30 and bool(out[0, 6].isnan())


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not available")
def test_cpu_quick_gelu_limits():
    """Quick GELU's tail cut on the CPU (1.702 x < -87 -> -0) near the infinities: -inf gives NaN (-inf * 0, as
    x * sigmoid(1.702 x) in torch), +inf gives +inf, NaN stays NaN."""
    x = torch.tensor([[float("-inf"), -1e30, -60.0, -51.0, float("inf"), 1e30, float("nan")]])
    out = fastenc.ops.gelu(x, approximate="quick", backend="cpu")
    assert out[0, 1:4].abs().max() < 1e-30 and bool(torch.signbit(out[0, 1])) and bool(out[0, 0].isnan())
    assert out[0, 4] == float("inf") and out[0, 5] == 1e30 and bool(out[0, 6].isnan())


@pytest.mark.parametrize("backend,dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_gelu_infinities_and_nan_as_torch(backend, approximate, dtype):
    """gelu(+inf) = +inf, gelu(-inf) = NaN (torch computes -inf * 0), NaN -> NaN: torch's F.gelu, every backend."""
    dev = testing.device_for(backend)
    x = torch.tensor([[float("inf"), float("-inf"), float("nan"), -20.0, 2.0]], device=dev, dtype=dtype)
    # torch's fp64 GELU: its vectorized fp32 erf form gives NaN for +inf on some CPUs (AVX-512 on AMD EPYC)
    want = torch_gelu(x.double(), approximate).float()
    assert bool(want[0, 1].isnan()) and want[0, 0] == float("inf")
    for bias in (None, torch.zeros(5, device=dev, dtype=dtype)):
        out = fastenc.ops.gelu(x, bias, approximate=approximate, backend=backend).float()
        torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-2, atol=1e-6)
    y = fastenc.ops.geglu(torch.cat([x, torch.ones_like(x)], -1), approximate=approximate, backend=backend).float()
    torch.testing.assert_close(y, want, equal_nan=True, rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("backend", FP32)
def test_gelu_inplace_column(backend):
    """An (N, 1) tensor torch calls contiguous (its size-1 dim's stride is N) is accepted as out=x."""
    dev = testing.device_for(backend)
    x = testing.randn(1, 37, device=dev).t()
    assert x.is_contiguous() and x.stride() == (1, 37)
    ref = gelu_ref(x)
    assert fastenc.ops.gelu(x, backend=backend, out=x) is x
    testing.assert_close(x, ref)


def test_gelu_out_dispatch_is_the_registry():
    """gelu(out=) runs the registry's gelu_out implementation of the chosen backend (no backend rules in the op)."""
    from fastenc import registry

    assert set(registry.impls("gelu_out")) == set(registry.impls("gelu"))
    calls = []
    impl = registry.impl("gelu_out", "reference")
    spy = registry.Impl(**{**impl.__dict__, "fn": lambda *a: (calls.append(a), impl.fn(*a))[1]})
    registry.register(spy)
    try:
        x, out = testing.randn(3, 384), torch.empty(3, 384)
        fastenc.ops.gelu(x, backend="reference", out=out)
    finally:
        registry.register(impl)
    assert len(calls) == 1 and calls[0][3].data_ptr() == out.data_ptr()
    testing.assert_close(out, gelu_ref(x))


@pytest.mark.parametrize("backend,dtype", ALL_DTYPES)
def test_gelu_misaligned(backend, dtype):
    """Width 1001 and storage-offset-1 views of x, bias and out: every backend, no aligned-vector assumption."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 1001 + 1, dtype=dtype, device=dev, scale=3.0)[1:].view(3, 1001)
    b = testing.randn(1002, dtype=dtype, device=dev)[1:]
    assert x.storage_offset() == 1 and b.storage_offset() == 1
    _check(backend, x, b, "none")
    out = testing.poison(torch.empty(3 * 1001 + 1, dtype=dtype, device=dev))[1:].view(3, 1001)
    for approximate in ("tanh", "quick"):
        fastenc.ops.gelu(x, b, approximate=approximate, backend=backend, out=testing.poison(out))
        ref = gelu_ref(x, b, approximate)
        testing.assert_close(out, ref, gelu_ref(x, b, approximate, upcast=False) if dtype != torch.float32 else None,
                             extra=testing.interpreter_extra(backend, dtype, ref))
