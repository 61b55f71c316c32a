"""gelu backward (dx and the fused bias's dbias), exact, tanh and quick: every backend against the reference formulas,
which are themselves held to torch.autograd and to gradcheck in float64."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import testing
from fastenc.reference import gelu_bwd_ref, gelu_ref

OP = "gelu_bwd"
BACKENDS = testing.backends_for(OP)
# odd widths; (129, 1001) is misaligned for every vector width; (2, 3, 1152) has extra leading dims
SHAPES = [(1, 384), (17, 1000), (2, 3, 1152), (129, 1001)]


def _grads(backend, x, bias, approximate, grad_out):
    x = x.detach().requires_grad_(True)
    b = None if bias is None else bias.detach().requires_grad_(True)
    y = fastenc.ops.gelu(x, b, approximate=approximate, backend=backend)
    y.backward(grad_out)
    return x.grad, (None if b is None else b.grad)


def _check(backend, x, bias, approximate, grad_out):
    dx, db = _grads(backend, x, bias, approximate, grad_out)
    g = grad_out.expand(x.shape)
    n = x.shape[-1]
    ref = gelu_bwd_ref(g, x, bias, approximate).float()  # fp32 math, rounded to x's dtype
    ref32 = gelu_bwd_ref(g.float(), x.float(), None if bias is None else bias.float(), approximate)
    lowp = gelu_bwd_ref(g, x, bias, approximate, upcast=False) if x.dtype != torch.float32 else None
    assert dx.dtype == x.dtype and dx.shape == x.shape
    testing.assert_close(dx, ref32, lowp, extra=testing.interpreter_extra(backend, x.dtype, ref), name="dx")
    if bias is not None:
        db32 = ref32.reshape(-1, n).sum(0)
        db_lowp = lowp.reshape(-1, n).sum(0) if lowp is not None else None
        assert db.dtype == bias.dtype and db.shape == bias.shape
        testing.assert_close(db, db32, db_lowp, extra=testing.interpreter_extra(backend, x.dtype, db32), name="dbias")


CASES = [pytest.param(be, dt, sh, bias, ap,
                      id=f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-{ap}{'-bias' if bias else ''}")
         for be, dt, sh, (bias, ap) in itertools.product(BACKENDS, testing.DTYPES, SHAPES,
                                                         ((False, "none"), (True, "none"), (True, "tanh"),
                                                          (True, "quick")))]


@pytest.mark.parametrize("backend,dtype,shape,bias,approximate", CASES)
def test_gelu_backward(backend, dtype, shape, bias, approximate):
    dev = testing.device_for(backend)
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=3.0)
    b = testing.randn(shape[-1], dtype=dtype, device=dev) if bias else None
    _check(backend, x, b, approximate, testing.randn(*shape, dtype=dtype, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_backward_strided_and_broadcast_grads(backend):
    """Upstream gradients that are not contiguous (transposed) or have zero strides (sum's expanded ones)."""
    dev = testing.device_for(backend)
    x, b = testing.randn(9, 1000, device=dev, scale=3.0), testing.randn(1000, device=dev)
    g = testing.randn(1000, 9, device=dev).t()
    assert not g.is_contiguous()
    _check(backend, x, b, "none", g)
    ones = torch.ones((), device=dev).expand(x.shape)
    assert ones.stride() == (0, 0)
    _check(backend, x, b, "tanh", ones)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_backward_only_some_inputs(backend):
    """Only bias requires grad, or only x: the other gets no gradient, the one asked for is right."""
    dev = testing.device_for(backend)
    x, b = testing.randn(5, 384, device=dev, scale=3.0), testing.randn(384, device=dev)
    g = testing.randn(5, 384, device=dev)
    ref = gelu_bwd_ref(g, x, b)
    bb = b.clone().requires_grad_(True)
    xx = x.clone()
    fastenc.ops.gelu(xx, bb, backend=backend).backward(g)
    assert xx.grad is None
    testing.assert_close(bb.grad, ref.sum(0), name="dbias")
    xx = x.clone().requires_grad_(True)
    fastenc.ops.gelu(xx, b, backend=backend).backward(g)
    testing.assert_close(xx.grad, ref, name="dx")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gelu_backward_computes_only_the_gradients_needed(backend, dtype):
    """The backward kernel is told which gradients autograd needs: the others come back empty (not written, not
    summed), and the needed one still matches the reference (dbias alone: from per-tile sums where the kernel can)."""
    dev = testing.device_for(backend)
    x, b = testing.randn(37, 1000, dtype=dtype, device=dev, scale=3.0), testing.randn(1000, dtype=dtype, device=dev)
    g = testing.randn(37, 1000, dtype=dtype, device=dev)
    ref32 = gelu_bwd_ref(g.float(), x.float(), b.float())
    lowp = gelu_bwd_ref(g, x, b, upcast=False) if dtype != torch.float32 else None
    extra = testing.interpreter_extra(backend, dtype, ref32)
    for need_dx, need_db in ((True, False), (False, True), (True, True)):
        dx, db = torch.ops.fastenc.gelu_bwd(g, x, b, "none", need_dx, need_db, backend)
        if need_dx:
            testing.assert_close(dx, ref32, lowp, extra=extra, name="dx")
        else:
            assert dx.numel() == 0
        if need_db:
            testing.assert_close(db, ref32.sum(0), None if lowp is None else lowp.float().sum(0),
                                 extra=testing.interpreter_extra(backend, dtype, ref32.sum(0)), name="dbias")
        else:
            assert db.numel() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_autograd_asks_only_for_the_gradients_needed(backend, monkeypatch):
    """Autograd passes needs_input_grad down: the backend's backward is asked for dx or dbias alone."""
    import dataclasses

    from fastenc import registry

    asked = []
    impl = registry.impl(OP, backend)

    def recording(grad, x, bias, approximate, need_dx, need_dbias):
        asked.append((need_dx, need_dbias))
        return impl.fn(grad, x, bias, approximate, need_dx, need_dbias)

    monkeypatch.setitem(registry._REGISTRY[OP], backend, dataclasses.replace(impl, fn=recording))
    dev = testing.device_for(backend)
    x, b = testing.randn(5, 384, device=dev), testing.randn(384, device=dev)
    fastenc.ops.gelu(x.clone().requires_grad_(True), b, backend=backend).sum().backward()
    fastenc.ops.gelu(x, b.clone().requires_grad_(True), backend=backend).sum().backward()
    fastenc.ops.gelu(x.clone().requires_grad_(True), backend=backend).sum().backward()
    assert asked == [(True, False), (False, True), (True, False)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_gelu_backward_specials(backend, approximate):
    """+-inf and NaN give NaN gradients, far tails the step (1 or 0), as torch's gelu_backward."""
    dev = testing.device_for(backend)
    x = torch.tensor([[float("-inf"), -30.0, -13.5, -2.0, 0.0, 2.0, 13.5, 30.0, float("inf"), float("nan")]],
                     device=dev)
    xr = x.clone().requires_grad_(True)
    (xr * torch.sigmoid(1.702 * xr) if approximate == "quick" else F.gelu(xr, approximate=approximate)).sum().backward()
    xx = x.clone().requires_grad_(True)
    fastenc.ops.gelu(xx, approximate=approximate, backend=backend).sum().backward()
    torch.testing.assert_close(xx.grad, xr.grad, equal_nan=True, rtol=1e-5, atol=1e-6)


def test_gelu_bwd_reference_matches_autograd():
    """The explicit derivative formulas against torch.autograd of the reference forward (fp64)."""
    for approximate in ("none", "tanh", "quick"):
        x = testing.randn(33, 257, scale=4.0).double().requires_grad_(True)
        b = testing.randn(257).double().requires_grad_(True)
        g = testing.randn(33, 257).double()
        gelu_ref(x, b, approximate, upcast=False).backward(g)
        want = gelu_bwd_ref(g, x.detach(), b.detach(), approximate, upcast=False)
        torch.testing.assert_close(want, x.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(want.sum(0), b.grad, rtol=1e-12, atol=1e-12)


class _GeluRef(torch.autograd.Function):
    """gelu_ref forward with gelu_bwd_ref as its backward: gradcheck then tests the formulas numerically."""

    @staticmethod
    def forward(ctx, x, b, approximate):
        ctx.save_for_backward(x, b)
        ctx.approximate = approximate
        return gelu_ref(x, b, approximate, upcast=False)

    @staticmethod
    def backward(ctx, g):
        x, b = ctx.saved_tensors
        dx = gelu_bwd_ref(g, x, b, ctx.approximate, upcast=False)
        return dx, dx.sum(0), None


@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_gelu_bwd_reference_gradcheck(approximate):
    x = testing.randn(7, 13, scale=2.0).double().requires_grad_(True)
    b = testing.randn(13).double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, b: _GeluRef.apply(x, b, approximate), (x, b))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("reference", "cpu")])
def test_gelu_opcheck_autograd(backend):
    """torch.library.opcheck with inputs that require grad: the autograd registration is exercised."""
    for bias in (True, False):
        x = testing.randn(5, 384).requires_grad_(True)
        b = testing.randn(384).requires_grad_(True) if bias else None
        torch.library.opcheck(torch.ops.fastenc.gelu.default, (x, b, "none", backend))
        g = testing.randn(5, 384)
        torch.library.opcheck(torch.ops.fastenc.gelu_bwd.default, (g, x.detach(), None if b is None else b.detach(),
                                                                   "tanh", True, bias, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_backward_bad_gradient(backend):
    """A gradient of the wrong shape or dtype is refused with the expected and received named."""
    dev = testing.device_for(backend)
    x = testing.randn(5, 384, device=dev)
    with pytest.raises(ValueError, match=r"gelu: grad must match x \(\(5, 384\)"):
        torch.ops.fastenc.gelu_bwd(testing.randn(5, 383, device=dev), x, None, "none", True, False, backend)
    with pytest.raises(ValueError, match="grad must match x.*torch.float16"):
        torch.ops.fastenc.gelu_bwd(testing.randn(5, 384, dtype=torch.float16, device=dev), x, None, "none", True,
                                   False, backend)
    y = fastenc.ops.gelu(x.clone().requires_grad_(True), backend=backend)
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(testing.randn(5, 383, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_out_refuses_grad(backend):
    dev = testing.device_for(backend)
    x = testing.randn(5, 384, device=dev).requires_grad_(True)
    with pytest.raises(ValueError, match="out= is an inference form"):
        fastenc.ops.gelu(x, backend=backend, out=torch.empty(5, 384, device=dev))
    b = testing.randn(384, device=dev).requires_grad_(True)
    with pytest.raises(ValueError, match="out= is an inference form"):
        fastenc.ops.gelu(x.detach(), b, backend=backend, out=torch.empty(5, 384, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_backward_misaligned(backend):
    """Width 1001 on a storage-offset-1 view: no vector path may assume 16-byte alignment."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 1001 + 1, device=dev, scale=3.0)[1:].view(3, 1001)
    b = testing.randn(1002, device=dev)[1:]
    assert x.storage_offset() == 1 and b.storage_offset() == 1
    _check(backend, x, b, "none", testing.randn(3, 1001, device=dev))
