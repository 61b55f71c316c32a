"""swiglu backward: [d gate | d up] in one (rows, 2N) gradient for the fused input, (d gate, d up) for two inputs,
every backend against the reference formulas, which are themselves held to torch.autograd and to gradcheck in
float64."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import testing
from fastenc.reference import swiglu_bwd_ref, swiglu_ref

OP = "swiglu_bwd"
BACKENDS = testing.backends_for(OP)
# (leading dims, N): N = 1, 383, 1000, 1152, 1001 (odd: misaligned up half); rows 1, 17, 129
SHAPES = [((1,), 1), ((17,), 383), ((129,), 1000), ((2, 3), 1152), ((33,), 1001)]


def _check_fused(backend, x, grad_out):
    xx = x.detach().requires_grad_(True)
    fastenc.ops.swiglu(xx, backend=backend).backward(grad_out)
    g = grad_out.expand(*x.shape[:-1], x.shape[-1] // 2)
    ref32 = swiglu_bwd_ref(g.float(), x.float())
    lowp = swiglu_bwd_ref(g, x, upcast=False) if x.dtype != torch.float32 else None
    assert xx.grad.dtype == x.dtype and xx.grad.shape == x.shape
    testing.assert_close(xx.grad, ref32, lowp, extra=testing.interpreter_extra(backend, x.dtype, ref32), name="dx")


def _check_two(backend, gate, up, grad_out):
    gg, uu = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
    fastenc.ops.swiglu(gg, uu, backend=backend).backward(grad_out)
    g = grad_out.expand(gate.shape)
    refs32 = swiglu_bwd_ref(g.float(), gate.float(), up.float())
    lowps = swiglu_bwd_ref(g, gate, up, upcast=False) if gate.dtype != torch.float32 else (None, None)
    for name, got, ref32, lowp in zip(("dgate", "dup"), (gg.grad, uu.grad), refs32, lowps):
        assert got.dtype == gate.dtype and got.shape == gate.shape
        testing.assert_close(got, ref32, lowp, extra=testing.interpreter_extra(backend, gate.dtype, ref32), name=name)


CASES = [pytest.param(be, dt, sh, form, id=f"{be}-{testing.dtype_id(dt)}-{testing.shape_id((*sh[0], sh[1]))}-{form}")
         for be, dt, sh, form in itertools.product(BACKENDS, testing.DTYPES, SHAPES, ("fused", "two"))]


@pytest.mark.parametrize("backend,dtype,shape,form", CASES)
def test_swiglu_backward(backend, dtype, shape, form):
    dev = testing.device_for(backend)
    lead, n = shape
    grad = testing.randn(*lead, n, dtype=dtype, device=dev)
    if form == "fused":
        _check_fused(backend, testing.randn(*lead, 2 * n, dtype=dtype, device=dev, scale=3.0), grad)
    else:
        _check_two(backend, testing.randn(*lead, n, dtype=dtype, device=dev, scale=3.0),
                   testing.randn(*lead, n, dtype=dtype, device=dev, scale=2.0), grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_backward_strided_and_broadcast_grads(backend):
    dev = testing.device_for(backend)
    x = testing.randn(9, 2000, device=dev, scale=3.0)
    g = testing.randn(1000, 9, device=dev).t()
    assert not g.is_contiguous()
    _check_fused(backend, x, g)
    _check_two(backend, x[:, :1000], x[:, 1000:], torch.ones((), device=dev).expand(9, 1000))


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_backward_misaligned(backend):
    """N = 1001 on storage-offset-1 views: no vector path may assume 16-byte alignment."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 2002 + 1, device=dev, scale=3.0)[1:].view(3, 2002)
    assert x.storage_offset() == 1
    _check_fused(backend, x, testing.randn(3, 1001, device=dev))
    _check_two(backend, x[:, 1:1002], x[:, 1000:2001], testing.randn(3, 1001, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_backward_only_some_inputs(backend):
    """Only the inputs that require grad get one; a frozen input flows nothing; through a view of a larger tensor
    only that view's part gets a gradient."""
    dev = testing.device_for(backend)
    gate, up = testing.randn(4, 383, device=dev, scale=3.0), testing.randn(4, 383, device=dev)
    assert not fastenc.ops.swiglu(gate, up, backend=backend).requires_grad
    ones = torch.ones(4, 383, device=dev)
    dgate, dup = swiglu_bwd_ref(ones, gate, up)
    u = up.clone().requires_grad_(True)
    fastenc.ops.swiglu(gate, u, backend=backend).sum().backward()
    testing.assert_close(u.grad, dup, name="dup")
    g = gate.clone().requires_grad_(True)
    fastenc.ops.swiglu(g, up, backend=backend).sum().backward()
    testing.assert_close(g.grad, dgate, name="dgate")
    big = testing.randn(4, 800, device=dev).requires_grad_(True)
    fastenc.ops.swiglu(big[:, :766], backend=backend).sum().backward()
    testing.assert_close(big.grad[:, :766], swiglu_bwd_ref(ones, big.detach()[:, :766]), name="dx")
    assert bool((big.grad[:, 766:] == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_backward_specials(backend):
    """+-inf and NaN give NaN gradients, far tails the limits, as torch's autograd of F.silu(gate) * up."""
    dev = testing.device_for(backend)
    gate = torch.tensor([[float("-inf"), -200.0, -100.0, -30.0, -2.0, 0.0, 2.0, 30.0, 100.0, float("inf"),
                          float("nan")]], device=dev)
    up = torch.full_like(gate, 1.5)
    gr, ur = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    (F.silu(gr) * ur).sum().backward()
    gg, uu = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    fastenc.ops.swiglu(gg, uu, backend=backend).sum().backward()
    torch.testing.assert_close(gg.grad, gr.grad, equal_nan=True, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(uu.grad, ur.grad, equal_nan=True, rtol=1e-5, atol=1e-6)


def test_swiglu_bwd_reference_matches_autograd():
    x = testing.randn(17, 514, scale=4.0).double().requires_grad_(True)
    g = testing.randn(17, 257).double()
    swiglu_ref(x, upcast=False).backward(g)
    torch.testing.assert_close(swiglu_bwd_ref(g, x.detach(), upcast=False), x.grad, rtol=1e-12, atol=1e-12)
    gate, up = (testing.randn(17, 257, scale=4.0).double().requires_grad_(True) for _ in range(2))
    swiglu_ref(gate, up, upcast=False).backward(g)
    dgate, dup = swiglu_bwd_ref(g, gate.detach(), up.detach(), upcast=False)
    torch.testing.assert_close(dgate, gate.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dup, up.grad, rtol=1e-12, atol=1e-12)


class _SwigluRef(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return swiglu_ref(gate, up, upcast=False)

    @staticmethod
    def backward(ctx, g):
        gate, up = ctx.saved_tensors
        return swiglu_bwd_ref(g, gate, up, upcast=False)


class _SwigluFusedRef(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return swiglu_ref(x, upcast=False)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return swiglu_bwd_ref(g, x, upcast=False)


def test_swiglu_bwd_reference_gradcheck():
    x = testing.randn(5, 14, scale=3.0).double().requires_grad_(True)
    assert torch.autograd.gradcheck(_SwigluFusedRef.apply, (x,))
    gate, up = (testing.randn(5, 7, scale=3.0).double().requires_grad_(True) for _ in range(2))
    assert torch.autograd.gradcheck(_SwigluRef.apply, (gate, up))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("reference", "cpu")])
def test_swiglu_opcheck_autograd(backend):
    x = testing.randn(5, 768).requires_grad_(True)
    torch.library.opcheck(torch.ops.fastenc.swiglu.default, (x, None, backend))
    gate, up = testing.randn(5, 383).requires_grad_(True), testing.randn(5, 383).requires_grad_(True)
    torch.library.opcheck(torch.ops.fastenc.swiglu.default, (gate, up, backend))
    torch.library.opcheck(torch.ops.fastenc.swiglu_bwd.default, (testing.randn(5, 384), x.detach(), None, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_backward_bad_gradient(backend):
    dev = testing.device_for(backend)
    x = testing.randn(5, 768, device=dev)
    with pytest.raises(ValueError, match=r"swiglu: grad must be \(5, 384\)"):
        torch.ops.fastenc.swiglu_bwd(testing.randn(5, 768, device=dev), x, None, backend)
    with pytest.raises(ValueError, match=r"swiglu: grad must be \(5, 768\) .*got \(\(5, 768\), torch.bfloat16"):
        torch.ops.fastenc.swiglu_bwd(testing.randn(5, 768, dtype=torch.bfloat16, device=dev), x, x, backend)
    y = fastenc.ops.swiglu(x.clone().requires_grad_(True), backend=backend)
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(testing.randn(5, 768, device=dev))
