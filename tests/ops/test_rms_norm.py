"""rms_norm: every backend against the fp32 reference, with and without the fused residual add."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference import rms_norm_ref

OP = "rms_norm"
BACKENDS = testing.backends_for(OP)
SHAPES = [(1, 384), (17, 1000), (3, 5, 1152), (2, 4096)]


def _as_tuple(v, n):
    return v if isinstance(v, tuple) else (v,) * n if v is None else (v,)


def _check(backend, x, w, r, eps=1e-6):
    out = fastenc.ops.rms_norm(x, w, eps=eps, residual=r, backend=backend)
    ref = rms_norm_ref(x, w, eps, r)
    lowp = rms_norm_ref(x, w, eps, r, upcast=False) if x.dtype != torch.float32 else None
    n = 2 if r is not None else 1
    for name, o, rf, lp in zip(("y", "h"), _as_tuple(out, n), _as_tuple(ref, n), _as_tuple(lowp, n)):
        assert o.dtype == x.dtype and o.shape == x.shape
        testing.assert_close(o, rf, lp, extra=testing.interpreter_extra(backend, x.dtype, rf), name=name)


def _x(backend, dtype=torch.float32, shape=(2, 384)):
    """The call a case makes, described for the registry (x on the backend's test device)."""
    return {"x": testing.fake(*shape, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, itertools.product(BACKENDS, testing.DTYPES, SHAPES, (False, True)),
                      lambda be, dt, sh, res: _x(be, dt, sh),
                      ids=lambda be, dt, sh, res: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}"
                                                  f"{'-res' if res else ''}")
FP32 = testing.backend_cases(OP, _x)


@pytest.mark.parametrize("backend,dtype,shape,residual", CASES)
def test_rms_norm(backend, dtype, shape, residual):
    dev = testing.device_for(backend)
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=2.0)
    w = testing.randn(shape[-1], dtype=dtype, device=dev)
    r = testing.randn(*shape, dtype=dtype, device=dev) if residual else None
    _check(backend, x, w, r)


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _x(b, shape=(2, 20000))))
def test_rms_norm_wide_row(backend):
    """Hidden 20000 (> the fused block): the Triton kernel's chunked path."""
    dev = testing.device_for(backend)
    x, r = testing.randn(2, 20000, device=dev), testing.randn(2, 20000, device=dev)
    _check(backend, x, testing.randn(20000, device=dev), r)


@pytest.mark.parametrize("backend", FP32)
def test_rms_norm_non_contiguous(backend):
    dev = testing.device_for(backend)
    x = testing.randn(1000, 9, device=dev).t()
    r = testing.randn(9, 2000, device=dev)[:, ::2]
    w = testing.randn(2000, device=dev)[::2]
    assert not (x.is_contiguous() or r.is_contiguous() or w.is_contiguous())
    _check(backend, x, w, r)
    _check(backend, x, w, None)


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("shape", [(0, 384), (2, 0, 768)], ids=testing.shape_id)
def test_rms_norm_empty(backend, shape):
    dev = testing.device_for(backend)
    x = torch.empty(shape, device=dev)
    assert fastenc.ops.rms_norm(x, torch.ones(shape[-1], device=dev), backend=backend).shape == x.shape
    y, h = fastenc.ops.rms_norm(x, torch.ones(shape[-1], device=dev), residual=torch.empty(shape, device=dev),
                                backend=backend)
    assert y.shape == x.shape and h.shape == x.shape


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Outputs poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.rms_norm import rms_norm_fwd

    dev = testing.device_for("triton")
    x, r = (testing.randn(7, 1000, dtype=dtype, device=dev) for _ in range(2))
    w = testing.randn(1000, dtype=dtype, device=dev)
    y, h = testing.poison(torch.empty_like(x)), testing.poison(torch.empty_like(x))
    rms_norm_fwd(x, w, r, 1e-6, out=y, residual_out=h)
    ref_y, ref_h = rms_norm_ref(x, w, 1e-6, r)
    lp = rms_norm_ref(x, w, 1e-6, r, upcast=False) if dtype != torch.float32 else (None, None)
    testing.assert_close(y, ref_y, lp[0], extra=testing.interpreter_extra("triton", dtype, ref_y), name="y")
    testing.assert_close(h, ref_h, lp[1], extra=testing.interpreter_extra("triton", dtype, ref_h), name="h")


def _offset_view(rows, hidden, dtype, dev, scale=1.0):
    """A contiguous (rows, hidden) view starting one element into its storage: no 16-byte aligned row start."""
    t = testing.randn(rows * hidden + 1, dtype=dtype, device=dev, scale=scale)[1:].view(rows, hidden)
    assert t.is_contiguous() and t.storage_offset() == 1
    return t


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _x))
@pytest.mark.parametrize("hidden", [1001, 1152], ids=lambda h: f"h{h}")
def test_rms_norm_misaligned(backend, dtype, hidden):
    """Width 1001 and storage-offset-1 views: the element-access path, never a misaligned vector load."""
    dev = testing.device_for(backend)
    x, r = _offset_view(17, hidden, dtype, dev, scale=2.0), _offset_view(17, hidden, dtype, dev)
    w = _offset_view(1, hidden, dtype, dev)[0]
    _check(backend, x, w, r)
    _check(backend, x, w, None)


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _x))
@pytest.mark.parametrize("residual", [False, True], ids=["nores", "res"])
def test_rms_norm_without_weight(backend, dtype, residual):
    """weight=None: plain normalization y = h * rsqrt(mean(h^2) + eps), on every backend."""
    dev = testing.device_for(backend)
    x = testing.randn(17, 1001, dtype=dtype, device=dev, scale=2.0)
    r = testing.randn(17, 1001, dtype=dtype, device=dev) if residual else None
    _check(backend, x, None, r)
    y = fastenc.ops.rms_norm(x, None, residual=r, backend=backend)
    y = y[0] if residual else y
    h = (x.float() + r.float()).to(dtype).float() if residual else x.float()
    assert float((y.float() - h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).abs().max()) < 0.05
