"""layer_norm / rms_norm backward: every backend x dtype x odd shape against torch.autograd of the fp32 reference
forward (the tolerance rule, with the reference's own low-precision backward as ref_lowp), the explicit reference
formulas against gradcheck in float64, partial requires_grad, strided and zero-stride upstream gradients, weight
None, the training forward's statistics, and bad gradients."""
import itertools

import pytest
import torch

import fastenc
from fastenc import registry, testing
from fastenc.reference import layer_norm_ref, norm_bwd_ref, norm_stats_ref, rms_norm_ref

ROWS = (1, 17, 129)
HIDDEN = (384, 1000, 1001, 1152)


def _backends(op):
    return testing.backends_for(op + "_bwd")


def _ids(be, dt, rows, hidden):
    return f"{be}-{testing.dtype_id(dt)}-{rows}x{hidden}"


def _leaf(t, need=True):
    return t.detach().clone().requires_grad_(need)


def _ln_grads(fn, x, w, b, r, ib, gy, gh, need):
    """Gradients of (y, h) = fn(x, w, b, r, ib) for the inputs flagged in need (a dict name -> bool)."""
    leaves = {k: (_leaf(v, need[k]) if v is not None else None) for k, v in
              dict(x=x, weight=w, bias=b, residual=r, input_bias=ib).items()}
    out = fn(**leaves)
    outs, grads = (out, (gy, gh)) if isinstance(out, tuple) else ((out,), (gy,))
    outs, grads = zip(*[(o, g) for o, g in zip(outs, grads) if o.requires_grad])  # h: only when x/r/ib need grad
    wanted = [k for k in leaves if leaves[k] is not None and need[k]]
    got = torch.autograd.grad(outs, [leaves[k] for k in wanted], grads)
    return dict(zip(wanted, got))


def _check_ln(backend, dtype, rows, hidden, *, bias=True, residual=True, input_bias=True, return_residual=True,
              need=None):
    dev = testing.device_for(backend)
    need = need or dict(x=True, weight=True, bias=True, residual=True, input_bias=True)
    x = testing.randn(rows, hidden, dtype=dtype, device=dev, scale=2.0) + 0.5
    w = testing.randn(hidden, dtype=dtype, device=dev)
    b = testing.randn(hidden, dtype=dtype, device=dev) if bias else None
    r = testing.randn(rows, hidden, dtype=dtype, device=dev) if residual else None
    ib = testing.randn(hidden, dtype=dtype, device=dev) if input_bias else None
    gy = testing.randn(rows, hidden, dtype=dtype, device=dev)
    gh = testing.randn(rows, hidden, dtype=dtype, device=dev) if residual and return_residual else None

    def ours(x, weight, bias, residual, input_bias):
        return fastenc.ops.layer_norm(x, weight, bias, 1e-5, residual=residual, backend=backend,
                                      input_bias=input_bias, return_residual=return_residual)

    def ref(upcast):
        def f(x, weight, bias, residual, input_bias):
            out = layer_norm_ref(x, weight, bias, 1e-5, residual, upcast=upcast, input_bias=input_bias)
            return out if return_residual or residual is None else out[0]
        return f

    got = _ln_grads(ours, x, w, b, r, ib, gy, gh, need)
    f32 = lambda t: None if t is None else t.float()  # noqa: E731
    ref32 = _ln_grads(ref(True), f32(x), f32(w), f32(b), f32(r), f32(ib), f32(gy), f32(gh), need)
    lowp = _ln_grads(ref(False), x, w, b, r, ib, gy, gh, need) if dtype != torch.float32 else {}
    assert set(got) == set(ref32)
    for k in got:
        assert got[k].dtype == dtype and got[k].shape == ref32[k].shape, k
        testing.assert_close(got[k], ref32[k], lowp.get(k), dtype=dtype,
                             extra=testing.interpreter_extra(backend, dtype, ref32[k]), name="d" + k)
    return got


LN_CASES = [pytest.param(be, dt, rows, hidden, id=_ids(be, dt, rows, hidden))
            for be, dt, rows, hidden in itertools.product(_backends("layer_norm"), testing.DTYPES, ROWS, HIDDEN)]


@pytest.mark.parametrize("backend,dtype,rows,hidden", LN_CASES)
def test_layer_norm_backward(backend, dtype, rows, hidden):
    """Every gradient: dx, dweight, dbias, dresidual, dinput_bias, with a gradient arriving on h as well."""
    _check_ln(backend, dtype, rows, hidden)


@pytest.mark.parametrize("backend", _backends("layer_norm"))
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
@pytest.mark.parametrize("variant", ["plain", "nobias", "post-norm", "input-bias-only", "residual-only"])
def test_layer_norm_backward_variants(backend, dtype, variant):
    kw = dict(plain=dict(residual=False, input_bias=False), nobias=dict(bias=False),
              **{"post-norm": dict(return_residual=False), "input-bias-only": dict(residual=False),
                 "residual-only": dict(input_bias=False)})[variant]
    _check_ln(backend, dtype, 17, 1001, **kw)


@pytest.mark.parametrize("backend", _backends("layer_norm"))
@pytest.mark.parametrize("which", ["x", "weight", "bias", "residual", "input_bias", "weight+bias"])
def test_layer_norm_backward_some_inputs(backend, which):
    """Only some inputs require grad: exactly those get gradients, and they are right."""
    need = {k: k in which.split("+") for k in ("x", "weight", "bias", "residual", "input_bias")}
    got = _check_ln(backend, torch.float32, 17, 384, need=need)
    assert set(got) == {k for k, v in need.items() if v}


def _rms_grads(fn, x, w, r, gy, gh, need):
    leaves = dict(x=_leaf(x, need["x"]), weight=None if w is None else _leaf(w, need["weight"]),
                  residual=None if r is None else _leaf(r, need["residual"]))
    out = fn(**leaves)
    outs, grads = (out, (gy, gh)) if isinstance(out, tuple) else ((out,), (gy,))
    outs, grads = zip(*[(o, g) for o, g in zip(outs, grads) if o.requires_grad])  # h: only when x/r/ib need grad
    wanted = [k for k in leaves if leaves[k] is not None and need[k]]
    return dict(zip(wanted, torch.autograd.grad(outs, [leaves[k] for k in wanted], grads)))


def _check_rms(backend, dtype, rows, hidden, *, weight=True, residual=True, need=None):
    dev = testing.device_for(backend)
    need = need or dict(x=True, weight=True, residual=True)
    x = testing.randn(rows, hidden, dtype=dtype, device=dev, scale=2.0)
    w = testing.randn(hidden, dtype=dtype, device=dev) if weight else None
    r = testing.randn(rows, hidden, dtype=dtype, device=dev) if residual else None
    gy = testing.randn(rows, hidden, dtype=dtype, device=dev)
    gh = testing.randn(rows, hidden, dtype=dtype, device=dev) if residual else None

    def ours(x, weight, residual):
        return fastenc.ops.rms_norm(x, weight, 1e-6, residual=residual, backend=backend)

    def ref(upcast):
        return lambda x, weight, residual: rms_norm_ref(x, weight, 1e-6, residual, upcast=upcast)

    got = _rms_grads(ours, x, w, r, gy, gh, need)
    f32 = lambda t: None if t is None else t.float()  # noqa: E731
    ref32 = _rms_grads(ref(True), f32(x), f32(w), f32(r), f32(gy), f32(gh), need)
    lowp = _rms_grads(ref(False), x, w, r, gy, gh, need) if dtype != torch.float32 else {}
    assert set(got) == set(ref32)
    for k in got:
        assert got[k].dtype == dtype and got[k].shape == ref32[k].shape, k
        testing.assert_close(got[k], ref32[k], lowp.get(k), dtype=dtype,
                             extra=testing.interpreter_extra(backend, dtype, ref32[k]), name="d" + k)
    return got


RMS_CASES = [pytest.param(be, dt, rows, hidden, id=_ids(be, dt, rows, hidden))
             for be, dt, rows, hidden in itertools.product(_backends("rms_norm"), testing.DTYPES, ROWS, HIDDEN)]


@pytest.mark.parametrize("backend,dtype,rows,hidden", RMS_CASES)
def test_rms_norm_backward(backend, dtype, rows, hidden):
    _check_rms(backend, dtype, rows, hidden)


@pytest.mark.parametrize("backend", _backends("rms_norm"))
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
@pytest.mark.parametrize("weight,residual", [(False, False), (False, True), (True, False)],
                         ids=["noweight", "noweight-res", "weight"])
def test_rms_norm_backward_variants(backend, dtype, weight, residual):
    _check_rms(backend, dtype, 17, 1001, weight=weight, residual=residual)


@pytest.mark.parametrize("backend", _backends("rms_norm"))
@pytest.mark.parametrize("which", ["x", "weight", "residual"])
def test_rms_norm_backward_some_inputs(backend, which):
    need = {k: k == which for k in ("x", "weight", "residual")}
    assert set(_check_rms(backend, torch.float32, 17, 384, need=need)) == {which}


@pytest.mark.parametrize("backend", _backends("layer_norm"))
@pytest.mark.parametrize("kind", ["expanded", "transposed"])
def test_norm_backward_strided_upstream_gradient(backend, kind):
    """Zero-stride (ones(()).expand) and transposed upstream gradients give the contiguous gradient's result."""
    dev = testing.device_for(backend)
    x, r = testing.randn(17, 384, device=dev), testing.randn(17, 384, device=dev)
    w, b = testing.randn(384, device=dev), testing.randn(384, device=dev)
    if kind == "expanded":
        gy, gh = torch.ones((), device=dev).expand(17, 384), torch.ones((), device=dev).expand(17, 384)
    else:
        gy, gh = testing.randn(384, 17, device=dev).t(), testing.randn(384, 17, device=dev).t()
    assert not gy.is_contiguous()
    for op in ("layer_norm", "rms_norm"):
        leaves = [_leaf(t) for t in (x, w, r)]
        if op == "layer_norm":
            y, h = fastenc.ops.layer_norm(leaves[0], leaves[1], b, residual=leaves[2], backend=backend)
        else:
            y, h = fastenc.ops.rms_norm(leaves[0], leaves[1], residual=leaves[2], backend=backend)
        got = torch.autograd.grad((y, h), leaves, (gy, gh))
        leaves2 = [_leaf(t) for t in (x, w, r)]
        if op == "layer_norm":
            y2, h2 = layer_norm_ref(leaves2[0], leaves2[1], b, 1e-5, leaves2[2])
        else:
            y2, h2 = rms_norm_ref(leaves2[0], leaves2[1], 1e-6, leaves2[2])
        want = torch.autograd.grad((y2, h2), leaves2, (gy.contiguous(), gh.contiguous()))
        for name, g, wv in zip(("dx", "dweight", "dresidual"), got, want):
            testing.assert_close(g, wv, name=f"{op} {name}")


def test_reference_backward_formulas_gradcheck():
    """The explicit formulas of norm_bwd_ref equal autograd of the reference forward in float64, and the
    reference forward passes gradcheck (math in float64: upcast=False)."""
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    w, b, ib = (torch.randn(7, generator=g, dtype=torch.float64) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (x, w, b, r, ib)]
    assert torch.autograd.gradcheck(
        lambda x, w, b, r, ib: layer_norm_ref(x, w, b, 1e-5, r, upcast=False, input_bias=ib), leaves)
    assert torch.autograd.gradcheck(lambda x, w, r: rms_norm_ref(x, w, 1e-6, r, upcast=False),
                                    [leaves[0], leaves[1], leaves[3]])
    assert torch.autograd.gradcheck(lambda x: rms_norm_ref(x, None, 1e-6, upcast=False), [leaves[0]])
    dy, dh = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    for rms in (False, True):
        xs = [t.clone().requires_grad_() for t in (x, w)]
        y = (rms_norm_ref(xs[0], xs[1], 1e-6, upcast=False) if rms
             else layer_norm_ref(xs[0], xs[1], None, 1e-6, upcast=False))
        want = torch.autograd.grad(y, xs, dy)
        mean, rstd = norm_stats_ref(x, 1e-6, rms=rms)
        dx, dw, db = norm_bwd_ref(dy, x, w, mean, rstd.double(), dh=dh)
        torch.testing.assert_close(dx, want[0] + dh, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(dw, want[1], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(db, dy.sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", testing.backends_for("layer_norm"))
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_training_forward_statistics(backend, dtype):
    """The training forward's mean and rstd (fp32) are those of the normalized h, and y is still right."""
    dev = testing.device_for(backend)
    x, r = testing.randn(17, 1001, dtype=dtype, device=dev) + 1.0, testing.randn(17, 1001, dtype=dtype, device=dev)
    w, b = testing.randn(1001, dtype=dtype, device=dev), testing.randn(1001, dtype=dtype, device=dev)
    op = torch.ops.fastenc.layer_norm.default
    y, h, mean, rstd = op(x, w, b, r, None, 1e-5, True, True, backend)
    y0, h0, mean0, rstd0 = op(x, w, b, r, None, 1e-5, True, False, backend)
    assert mean0.numel() == 0 and rstd0.numel() == 0  # inference pays nothing for them
    ref_mean, ref_rstd = norm_stats_ref(h, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == (17,)
    testing.assert_close(mean, ref_mean, name="mean")
    testing.assert_close(rstd, ref_rstd, name="rstd")
    ref_y, _ = layer_norm_ref(x, w, b, 1e-5, r)
    lowp = layer_norm_ref(x, w, b, 1e-5, r, upcast=False)[0] if dtype != torch.float32 else None
    for name, out in (("y", y), ("y (inference)", y0)):
        testing.assert_close(out, ref_y, lowp, extra=testing.interpreter_extra(backend, dtype, ref_y), name=name)
    rop = torch.ops.fastenc.rms_norm.default
    _, hr, rstd = rop(x, None, r, 1e-6, True, backend)
    testing.assert_close(rstd, norm_stats_ref(hr, 1e-6, rms=True)[1], name="rms rstd")


@pytest.mark.skipif("triton" not in _backends("layer_norm"), reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_triton_backward_writes_every_element(dtype, rms):
    """dx poisoned with NaN before the launch: an element the kernel forgets stays NaN and fails."""
    from fastenc.kernels.norm_bwd import norm_bwd

    dev = testing.device_for("triton")
    h, dy, dh = (testing.randn(37, 1001, dtype=dtype, device=dev) for _ in range(3))
    w = testing.randn(1001, dtype=dtype, device=dev)
    mean, rstd = norm_stats_ref(h, 1e-5, rms=rms)
    dx = testing.poison(torch.empty_like(h))
    _, dw, db = norm_bwd(dy, dh, h, w, mean, rstd, True, not rms, dx_out=dx)
    ref = norm_bwd_ref(dy, h, w, mean, rstd, dh)
    lowp = norm_bwd_ref(dy, h, w, mean, rstd, dh, upcast=False) if dtype != torch.float32 else (None,) * 3
    ref32 = norm_bwd_ref(dy.float(), h.float(), w.float(), mean, rstd, dh.float())
    testing.assert_close(dx, ref32[0], lowp[0], extra=testing.interpreter_extra("triton", dtype, ref32[0]), name="dx")
    testing.assert_close(dw, ref32[1], lowp[1], extra=testing.interpreter_extra("triton", dtype, ref32[1]), name="dw")
    assert db is None if rms else db is not None
    del ref


@pytest.mark.parametrize("backend", _backends("layer_norm"))
def test_norm_backward_bad_gradient_is_named(backend):
    """The backward ops check their gradients: shape and dtype errors name the argument."""
    dev = testing.device_for(backend)
    h, w = testing.randn(5, 384, device=dev), testing.randn(384, device=dev)
    mean, rstd = norm_stats_ref(h, 1e-5)
    op = torch.ops.fastenc.layer_norm_bwd.default
    with pytest.raises(ValueError, match=r"layer_norm_bwd: dy must be of shape \(5, 384\)"):
        op(testing.randn(5, 383, device=dev), None, h, w, mean, rstd, True, True, backend)
    with pytest.raises(ValueError, match="layer_norm_bwd: dh must be torch.float32"):
        op(testing.randn(5, 384, device=dev), testing.randn(5, 384, device=dev, dtype=torch.float16), h, w, mean,
           rstd, True, True, backend)
    with pytest.raises(ValueError, match="rms_norm_bwd: rstd must be"):
        torch.ops.fastenc.rms_norm_bwd.default(testing.randn(5, 384, device=dev), None, h, w, rstd[:3], True, backend)
    # through autograd: a gradient of the wrong shape is refused before our backward runs
    x = testing.randn(5, 384, device=dev).requires_grad_()
    y = fastenc.ops.layer_norm(x, w, backend=backend)
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(testing.randn(5, 385, device=dev))


@pytest.mark.skipif("triton" not in _backends("layer_norm"), reason="triton backend not runnable here")
def test_backward_too_wide_for_triton_falls_back_with_a_warning():
    """Hidden 9000 > the Triton backward's register row: the backward runs elsewhere, says so, and is right."""
    dev = testing.device_for("triton")
    x, w = testing.randn(2, 9000, device=dev).requires_grad_(), testing.randn(9000, device=dev).requires_grad_()
    gy = testing.randn(2, 9000, device=dev)
    with pytest.warns(RuntimeWarning, match="layer_norm_bwd runs on .*, not triton"):
        y = fastenc.ops.layer_norm(x, w, backend="triton")
        got = torch.autograd.grad(y, (x, w), gy)
    x2, w2 = _leaf(x), _leaf(w)
    want = torch.autograd.grad(layer_norm_ref(x2, w2), (x2, w2), gy)
    for name, g, wv in zip(("dx", "dweight"), got, want):
        testing.assert_close(g, wv, name=name)


def _saved_storages(fn) -> set[int]:
    """Data pointers of the storages autograd saves while `fn` runs."""
    ptrs = set()

    def pack(t):
        ptrs.add(t.untyped_storage().data_ptr())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return ptrs, out


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_training_forward_keeps_only_the_normalized_input(op):
    """With a residual, the backward reads h = x (+ input_bias) + residual and its statistics: x and residual are
    not kept for it (they would double the activation memory of a post-norm block), and the gradients still match
    the reference's."""
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(37, 96, generator=g).requires_grad_() for _ in range(2))
    w = (torch.rand(96, generator=g) + 0.5).requires_grad_()
    if op == "layer_norm":
        ib = torch.randn(96, generator=g).requires_grad_()
        call = lambda: fastenc.ops.layer_norm(x, w, None, 1e-5, residual=r, input_bias=ib, return_residual=False)
        ref = lambda: layer_norm_ref(x, w, None, 1e-5, r, input_bias=ib)[0]
        inputs = (x, r, w, ib)
    else:
        call = lambda: fastenc.ops.rms_norm(x, w, 1e-6, residual=r)[0]
        ref = lambda: rms_norm_ref(x, w, 1e-6, r)[0]
        inputs = (x, r, w)
    ptrs, y = _saved_storages(call)
    assert x.untyped_storage().data_ptr() not in ptrs and r.untyped_storage().data_ptr() not in ptrs
    gy = torch.randn(y.shape, generator=g)
    got = torch.autograd.grad(y, inputs, gy)
    want = torch.autograd.grad(ref(), inputs, gy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
