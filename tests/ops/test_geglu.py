"""geglu (..., 2N) -> (..., N) in ModernBERT's order: every backend against the fp32 reference."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference import geglu_ref

OP = "geglu"
BACKENDS = testing.backends_for(OP)
# Last dim 2N with N odd-sized (384, 1000, 1152 as ModernBERT-base, 2100 spanning two column tiles).
SHAPES = [(1, 768), (17, 2000), (2, 3, 2304), (3, 4200)]


def _check(backend, x, approximate):
    out = fastenc.ops.geglu(x, approximate=approximate, backend=backend)
    ref = geglu_ref(x, approximate)
    lowp = geglu_ref(x, approximate, upcast=False) if x.dtype != torch.float32 else None
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], x.shape[-1] // 2)
    testing.assert_close(out, ref, lowp, extra=testing.interpreter_extra(backend, x.dtype, ref))


def _x(backend, dtype=torch.float32, shape=(2, 768)):
    """The call a case makes, described for the registry (x on the backend's test device)."""
    return {"x": testing.fake(*shape, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, itertools.product(BACKENDS, testing.DTYPES, SHAPES, ("none", "tanh", "quick")),
                      lambda be, dt, sh, ap: _x(be, dt, sh),
                      ids=lambda be, dt, sh, ap: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-{ap}")
FP32 = testing.backend_cases(OP, _x)


@pytest.mark.parametrize("backend,dtype,shape,approximate", CASES)
def test_geglu(backend, dtype, shape, approximate):
    x = testing.randn(*shape, dtype=dtype, device=testing.device_for(backend), scale=2.0)
    _check(backend, x, approximate)


def test_geglu_matches_modernbert_mlp():
    """Order and activation as transformers' ModernBertMLP: input, gate = Wi(x).chunk(2); act(input) * gate."""
    from transformers.activations import ACT2FN
    from transformers import ModernBertConfig

    act = ACT2FN[ModernBertConfig().hidden_activation]
    x = testing.randn(5, 2 * 1152)
    inp, gate = x.chunk(2, dim=-1)
    expected = act(inp) * gate
    for (backend,) in (p.values for p in testing.backend_cases(OP, lambda b: {"x": testing.fake(5, 2304)})):
        testing.assert_close(fastenc.ops.geglu(x, backend=backend), expected, name=backend)


@pytest.mark.parametrize("backend", FP32)
def test_geglu_non_contiguous(backend):
    dev = testing.device_for(backend)
    _check(backend, testing.randn(2000, 9, device=dev).t(), "none")
    _check(backend, testing.randn(9, 4000, device=dev)[:, ::2], "tanh")
    _check(backend, testing.randn(9, 4000, device=dev)[:, 1::2], "quick")


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("shape", [(0, 768), (2, 0, 2000), (3, 0)], ids=testing.shape_id)
def test_geglu_empty(backend, shape):
    x = torch.empty(shape, device=testing.device_for(backend))
    assert fastenc.ops.geglu(x, backend=backend).shape == (*shape[:-1], shape[-1] // 2)


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Output poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.geglu import geglu_fwd

    x = testing.randn(5, 5000, dtype=dtype, device=testing.device_for("triton"))
    y = testing.poison(x.new_empty(5, 2500))
    geglu_fwd(x, "none", out=y)
    ref = geglu_ref(x)
    testing.assert_close(y, ref, geglu_ref(x, upcast=False) if dtype != torch.float32 else None,
                         extra=testing.interpreter_extra("triton", dtype, ref))


OUT_CASES = testing.out_cases(BACKENDS, OP)


@pytest.mark.parametrize("backend,dtype,inplace", OUT_CASES)
def test_geglu_into_out(backend, dtype, inplace):
    """out= writes the result; out = x[..., :N] computes in place over the input halves (strided rows)."""
    dev = testing.device_for(backend)
    x = testing.randn(2, 9, 2304, dtype=dtype, device=dev, scale=2.0)
    ref = geglu_ref(x)
    lowp = geglu_ref(x, upcast=False) if dtype != torch.float32 else None
    if inplace:
        buf = x.clone()
        src, target = buf, buf[..., :1152]
    else:
        src, target = x, testing.poison(torch.empty(2, 9, 1152, dtype=dtype, device=dev))
    got = fastenc.ops.geglu(src, backend=backend, out=target)
    assert got.data_ptr() == target.data_ptr() and got.shape == ref.shape
    testing.assert_close(target, ref, lowp, extra=testing.interpreter_extra(backend, dtype, ref))


def test_geglu_out_dispatch_is_the_registry():
    """geglu(out=) runs the registry's geglu_out implementation of the chosen backend (no backend rules in the op)."""
    from fastenc import registry

    assert set(registry.impls("geglu_out")) == set(registry.impls("geglu"))
    calls = []
    impl = registry.impl("geglu_out", "reference")
    spy = registry.Impl(**{**impl.__dict__, "fn": lambda *a: (calls.append(a), impl.fn(*a))[1]})
    registry.register(spy)
    try:
        x, out = testing.randn(3, 768), torch.empty(3, 384)
        fastenc.ops.geglu(x, backend="reference", out=out)
    finally:
        registry.register(impl)
    assert len(calls) == 1 and calls[0][2].data_ptr() == out.data_ptr()
    testing.assert_close(out, geglu_ref(x))


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _x))
def test_geglu_misaligned(backend, dtype):
    """N = 1001 (2N = 2002) and storage-offset-1 views of x and out: no aligned-vector assumption."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 2002 + 1, dtype=dtype, device=dev, scale=2.0)[1:].view(3, 2002)
    assert x.storage_offset() == 1
    _check(backend, x, "none")
    out = testing.poison(torch.empty(3 * 1001 + 1, dtype=dtype, device=dev))[1:].view(3, 1001)
    for approximate in ("tanh", "quick"):
        fastenc.ops.geglu(x, approximate=approximate, backend=backend, out=testing.poison(out))
        ref = geglu_ref(x, approximate)
        testing.assert_close(out, ref, geglu_ref(x, approximate, upcast=False) if dtype != torch.float32 else None,
                             extra=testing.interpreter_extra(backend, dtype, ref))
