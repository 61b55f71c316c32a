"""swiglu silu(gate) * up, fused (..., 2N) = [gate | up] and two (..., N) inputs: every backend against the fp32
reference, odd widths, layouts and bad input."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import testing
from fastenc.reference import swiglu_ref

OP = "swiglu"
BACKENDS = testing.backends_for(OP)
# (leading dims, N): N = 1, 383 (odd), 1000, 1152; rows 1, 17, 129; extra leading dims.
SHAPES = [((1,), 1), ((17,), 383), ((129,), 1000), ((2, 3), 1152), ((17,), 1)]
FORMS = ("fused", "two")


def _inputs(form, lead, n, dtype, device):
    """(args of swiglu, the gate and up it must use)."""
    if form == "fused":
        x = testing.randn(*lead, 2 * n, dtype=dtype, device=device, scale=3.0)
        return (x,), (x[..., :n], x[..., n:])
    gate = testing.randn(*lead, n, dtype=dtype, device=device, scale=3.0)
    up = testing.randn(*lead, n, dtype=dtype, device=device, scale=2.0)
    return (gate, up), (gate, up)


def _check(backend, args, gate, up):
    out = fastenc.ops.swiglu(*args, backend=backend)
    ref = swiglu_ref(gate, up)
    lowp = swiglu_ref(gate, up, upcast=False) if gate.dtype != torch.float32 else None
    assert out.dtype == gate.dtype and out.shape == gate.shape
    testing.assert_close(out, ref, lowp, extra=testing.interpreter_extra(backend, gate.dtype, ref))


def _x(backend, dtype=torch.float32, lead=(2,), n=384):
    """The call a case makes, described for the registry (x on the backend's test device)."""
    return {"x": testing.fake(*lead, 2 * n, dtype=dtype, device=testing.device_for(backend)), "up": None}


CASES = testing.cases(OP, itertools.product(BACKENDS, testing.DTYPES, SHAPES, FORMS),
                      lambda be, dt, sh, form: _x(be, dt, *sh),
                      ids=lambda be, dt, sh, form: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id((*sh[0], sh[1]))}"
                                                   f"-{form}")
FP32 = testing.backend_cases(OP, _x)


@pytest.mark.parametrize("backend,dtype,shape,form", CASES)
def test_swiglu(backend, dtype, shape, form):
    args, (gate, up) = _inputs(form, *shape, dtype, testing.device_for(backend))
    _check(backend, args, gate, up)


def test_swiglu_matches_llama_mlp():
    """silu(gate_proj(x)) * up_proj(x), as transformers' LlamaMLP (ACT2FN['silu']): the two-input form, and the
    fused form over the concatenation [gate | up]."""
    from transformers.activations import ACT2FN

    gate, up = testing.randn(5, 1000, scale=3.0), testing.randn(5, 1000)
    expected = ACT2FN["silu"](gate) * up
    for (backend,) in (p.values for p in FP32):
        testing.assert_close(fastenc.ops.swiglu(gate, up, backend=backend), expected, name=backend)
        testing.assert_close(fastenc.ops.swiglu(torch.cat([gate, up], -1), backend=backend), expected, name=backend)
        testing.assert_close(fastenc.ops.swiglu(gate, up=up, backend=backend), expected, name=backend)


@pytest.mark.parametrize("backend", FP32)
def test_swiglu_non_contiguous(backend):
    dev = testing.device_for(backend)
    x = testing.randn(2000, 9, device=dev, scale=3.0).t()
    _check(backend, (x,), x[:, :1000], x[:, 1000:])
    g, u = testing.randn(9, 2002, device=dev, scale=3.0)[:, ::2], testing.randn(1001, 9, device=dev).t()
    _check(backend, (g, u), g, u)


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, lambda b, dt: _x(b, dt)))
def test_swiglu_misaligned(backend, dtype):
    """N = 1001 and storage-offset-1 views: no aligned-vector assumption, in either form."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 2002 + 1, dtype=dtype, device=dev, scale=3.0)[1:].view(3, 2002)
    assert x.storage_offset() == 1
    _check(backend, (x,), x[:, :1001], x[:, 1001:])
    g = testing.randn(3 * 1001 + 1, dtype=dtype, device=dev, scale=3.0)[1:].view(3, 1001)
    u = testing.randn(3, 1001, dtype=dtype, device=dev)
    _check(backend, (g, u), g, u)


@pytest.mark.parametrize("backend", FP32)
def test_swiglu_tails_and_specials(backend):
    """Far tails (exp overflow) and the infinities as torch's F.silu: silu(-inf) = NaN (-inf * 0), silu(+inf) = inf,
    NaN -> NaN."""
    dev = testing.device_for(backend)
    g = torch.tensor([[-1e30, -200.0, -100.0, -88.5, -30.0, -5.0, -1e-30, 0.0, 1e-30, 0.5, 5.0, 30.0, 100.0, 1e30,
                       float("-inf"), float("inf"), float("nan")]], device=dev)
    up = torch.full_like(g, 1.5)
    want = (F.silu(g.double()) * 1.5).float()
    for got in (fastenc.ops.swiglu(g, up, backend=backend), fastenc.ops.swiglu(torch.cat([g, up], -1), backend=backend)):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("shape", [(0, 768), (2, 0, 2000), (3, 0)], ids=testing.shape_id)
def test_swiglu_empty(backend, shape):
    dev = testing.device_for(backend)
    x = torch.empty(shape, device=dev)
    assert fastenc.ops.swiglu(x, backend=backend).shape == (*shape[:-1], shape[-1] // 2)
    assert fastenc.ops.swiglu(x, x.clone(), backend=backend).shape == shape


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Output poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.swiglu import swiglu_fwd

    x = testing.randn(5, 5002, dtype=dtype, device=testing.device_for("triton"), scale=3.0)
    y = testing.poison(x.new_empty(5, 2501))
    swiglu_fwd(x, out=y)
    ref = swiglu_ref(x)
    testing.assert_close(y, ref, swiglu_ref(x, upcast=False) if dtype != torch.float32 else None,
                         extra=testing.interpreter_extra("triton", dtype, ref))


def test_swiglu_reference_form_is_gate_first():
    """The fused input's first half is the gate: swapping the halves changes the result."""
    x = testing.randn(4, 64, scale=3.0)
    gate, up = x.chunk(2, -1)
    torch.testing.assert_close(swiglu_ref(x), F.silu(gate) * up)
    assert not torch.allclose(swiglu_ref(x), F.silu(up) * gate)
