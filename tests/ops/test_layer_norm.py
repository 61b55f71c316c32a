"""layer_norm: every backend against the fp32 reference, with and without bias and fused residual add."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference import layer_norm_ref

OP = "layer_norm"
BACKENDS = testing.backends_for(OP)
# (leading dims..., hidden): odd hidden sizes, one and several rows, extra leading dims; rows stay small
# because the triton backend runs under the interpreter here.
SHAPES = [(1, 384), (17, 1000), (3, 5, 1152)]


def _as_tuple(v, n):
    return v if isinstance(v, tuple) else (v,) * n if v is None else (v,)


def _check(backend, x, w, b, r, eps=1e-5):
    """Outputs (y, and h = x + r with a residual) against the fp32 reference, under the tolerance rule."""
    out = fastenc.ops.layer_norm(x, w, b, eps=eps, residual=r, backend=backend)
    ref = layer_norm_ref(x, w, b, eps, r)
    lowp = layer_norm_ref(x, w, b, eps, r, upcast=False) if x.dtype != torch.float32 else None
    n = 2 if r is not None else 1
    for name, o, rf, lp in zip(("y", "h"), _as_tuple(out, n), _as_tuple(ref, n), _as_tuple(lowp, n)):
        assert o.dtype == x.dtype and o.shape == x.shape
        testing.assert_close(o, rf, lp, extra=testing.interpreter_extra(backend, x.dtype, rf), name=name)


def _x(backend, dtype=torch.float32, shape=(2, 384)):
    """The call a case makes, described for the registry (x on the backend's test device)."""
    return {"x": testing.fake(*shape, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, itertools.product(BACKENDS, testing.DTYPES, SHAPES, (True, False), (False, True)),
                      lambda be, dt, sh, bias, res: _x(be, dt, sh),
                      ids=lambda be, dt, sh, bias, res: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-"
                                                        f"{'bias' if bias else 'nobias'}{'-res' if res else ''}")
FP32 = testing.backend_cases(OP, _x)


@pytest.mark.parametrize("backend,dtype,shape,bias,residual", CASES)
def test_layer_norm(backend, dtype, shape, bias, residual):
    dev = testing.device_for(backend)
    hidden = shape[-1]
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=2.0) + 0.5  # non-zero mean
    w = testing.randn(hidden, dtype=dtype, device=dev)
    b = testing.randn(hidden, dtype=dtype, device=dev) if bias else None
    r = testing.randn(*shape, dtype=dtype, device=dev) if residual else None
    _check(backend, x, w, b, r)


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, (torch.float32, torch.bfloat16),
                                                             lambda b, dt: _x(b, dt, (2, 20000))))
def test_layer_norm_wide_row(backend, dtype):
    """Hidden 20000 (> the fused block): the Triton kernel's chunked three-pass path."""
    dev = testing.device_for(backend)
    x = testing.randn(2, 20000, dtype=dtype, device=dev) + 3.0
    r = testing.randn(2, 20000, dtype=dtype, device=dev)
    _check(backend, x, testing.randn(20000, dtype=dtype, device=dev), testing.randn(20000, dtype=dtype, device=dev), r)


@pytest.mark.parametrize("backend", FP32)
def test_layer_norm_non_contiguous(backend):
    dev = testing.device_for(backend)
    x = testing.randn(1000, 9, device=dev).t()           # (9, 1000), column-major
    r = testing.randn(9, 2000, device=dev)[:, ::2]        # strided rows
    w = testing.randn(2000, device=dev)[::2]
    b = testing.randn(3000, device=dev)[::3]
    assert not (x.is_contiguous() or r.is_contiguous() or w.is_contiguous() or b.is_contiguous())
    _check(backend, x, w, b, r)
    _check(backend, x, w, None, None)


@pytest.mark.parametrize("backend", FP32)
@pytest.mark.parametrize("shape", [(0, 384), (2, 0, 768), (3, 0)], ids=testing.shape_id)
def test_layer_norm_empty(backend, shape):
    dev = testing.device_for(backend)
    x = torch.empty(shape, device=dev)
    w = torch.ones(shape[-1], device=dev)
    y = fastenc.ops.layer_norm(x, w, backend=backend)
    assert y.shape == x.shape
    y, h = fastenc.ops.layer_norm(x, w, torch.zeros_like(w), residual=torch.empty(shape, device=dev), backend=backend)
    assert y.shape == x.shape and h.shape == x.shape


def test_layer_norm_eps_and_large_mean():
    """A common offset 30x the spread must not leak into the variance (two-pass variance); eps=1e-12 as BERT uses."""
    for backend in BACKENDS:
        dev = testing.device_for(backend)
        x = testing.randn(4, 384, device=dev) + 30.0
        _check(backend, x, testing.randn(384, device=dev), testing.randn(384, device=dev), None, eps=1e-12)


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Outputs poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.layer_norm import layer_norm_fwd

    dev = testing.device_for("triton")
    x = testing.randn(7, 1500, dtype=dtype, device=dev)[:, :1000]  # strided rows go to the kernel as they are
    r = testing.randn(7, 1000, dtype=dtype, device=dev)
    w, b = (testing.randn(1000, dtype=dtype, device=dev) for _ in range(2))
    y, h = testing.poison(torch.empty_like(r)), testing.poison(torch.empty_like(r))
    layer_norm_fwd(x, w, b, r, 1e-5, out=y, residual_out=h)
    ref_y, ref_h = layer_norm_ref(x, w, b, 1e-5, r)
    lp = layer_norm_ref(x, w, b, 1e-5, r, upcast=False) if dtype != torch.float32 else (None, None)
    testing.assert_close(y, ref_y, lp[0], extra=testing.interpreter_extra("triton", dtype, ref_y), name="y")
    testing.assert_close(h, ref_h, lp[1], extra=testing.interpreter_extra("triton", dtype, ref_h), name="h")


FUSED_CASES = testing.cases(OP, ((be, dt, res, keep) for be, dt, res, keep
                                 in itertools.product(BACKENDS, testing.DTYPES, (True, False), (True, False))
                                 if res or keep),
                            lambda be, dt, res, keep: _x(be, dt, (37, 1000)),
                            ids=lambda be, dt, res, keep: f"{be}-{testing.dtype_id(dt)}{'-res' if res else ''}"
                                                          f"{'-keep' if keep else '-drop'}")


@pytest.mark.parametrize("backend,dtype,residual,keep", FUSED_CASES)
def test_layer_norm_input_bias(backend, dtype, residual, keep):
    """y = LN(x + input_bias (+ residual)): the preceding linear's bias fused; return_residual=False returns y
    alone (a post-norm block drops x + residual)."""
    dev = testing.device_for(backend)
    shape = (37, 1000)
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=2.0) + 0.5
    w, b, ib = (testing.randn(1000, dtype=dtype, device=dev) for _ in range(3))
    r = testing.randn(*shape, dtype=dtype, device=dev) if residual else None
    out = fastenc.ops.layer_norm(x, w, b, residual=r, input_bias=ib, return_residual=keep, backend=backend)
    ref = layer_norm_ref(x, w, b, 1e-5, r, input_bias=ib)
    lowp = layer_norm_ref(x, w, b, 1e-5, r, upcast=False, input_bias=ib) if dtype != torch.float32 else None
    with_h = residual and keep
    outs = out if with_h else (out,)
    refs = ref if residual else (ref,)
    lows = (lowp if residual else (lowp,)) if lowp is not None else (None, None)
    assert len(outs) == (2 if with_h else 1)
    for name, o, rf, lp in zip(("y", "h"), outs, refs, lows):
        assert o.dtype == dtype and o.shape == x.shape
        testing.assert_close(o, rf, lp, extra=testing.interpreter_extra(backend, dtype, rf), name=name)


def test_layer_norm_input_bias_reference_is_the_unfused_sum():
    x, r = testing.randn(9, 384), testing.randn(9, 384)
    w, b, ib = testing.randn(384), testing.randn(384), testing.randn(384)
    y, h = layer_norm_ref(x, w, b, 1e-12, r, input_bias=ib)
    torch.testing.assert_close(h, x + ib + r)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x + ib + r, (384,), w, b, 1e-12), rtol=1e-5, atol=1e-5)


def _offset_view(rows, hidden, dtype, dev, scale=1.0):
    """A contiguous (rows, hidden) view starting one element into its storage: no 16-byte aligned row start."""
    t = testing.randn(rows * hidden + 1, dtype=dtype, device=dev, scale=scale)[1:].view(rows, hidden)
    assert t.is_contiguous() and t.storage_offset() == 1
    return t


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _x))
@pytest.mark.parametrize("hidden", [1001, 1152], ids=lambda h: f"h{h}")
def test_layer_norm_misaligned(backend, dtype, hidden):
    """Width 1001 (no whole 16-byte vectors per row) and storage-offset-1 views of x, residual, weight and bias:
    the element-access path of the vectorized kernels, never a misaligned vector load."""
    dev = testing.device_for(backend)
    x = _offset_view(17, hidden, dtype, dev, scale=2.0)
    r = _offset_view(17, hidden, dtype, dev)
    w, b = _offset_view(1, hidden, dtype, dev)[0], _offset_view(1, hidden, dtype, dev)[0]
    _check(backend, x, w, b, r)
    _check(backend, x, w, None, None)
