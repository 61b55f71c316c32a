"""geglu backward: d input and d gate halves in one (rows, 2N) gradient, every backend against the reference
formulas, which are themselves held to torch.autograd and to gradcheck in float64."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference import geglu_bwd_ref, geglu_ref

OP = "geglu_bwd"
BACKENDS = testing.backends_for(OP)
# last dim 2N: N = 384, 1000, 1152 (ModernBERT-base), 1001 (odd: misaligned gate half)
SHAPES = [(1, 768), (17, 2000), (2, 3, 2304), (33, 2002)]


def _check(backend, x, approximate, grad_out):
    xx = x.detach().requires_grad_(True)
    fastenc.ops.geglu(xx, approximate=approximate, backend=backend).backward(grad_out)
    g = grad_out.expand(*x.shape[:-1], x.shape[-1] // 2)
    ref32 = geglu_bwd_ref(g.float(), x.float(), approximate)
    lowp = geglu_bwd_ref(g, x, approximate, upcast=False) if x.dtype != torch.float32 else None
    assert xx.grad.dtype == x.dtype and xx.grad.shape == x.shape
    testing.assert_close(xx.grad, ref32, lowp, extra=testing.interpreter_extra(backend, x.dtype, ref32), name="dx")


CASES = [pytest.param(be, dt, sh, ap, id=f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-{ap}")
         for be, dt, sh, ap in itertools.product(BACKENDS, testing.DTYPES, SHAPES, ("none", "tanh", "quick"))]


@pytest.mark.parametrize("backend,dtype,shape,approximate", CASES)
def test_geglu_backward(backend, dtype, shape, approximate):
    dev = testing.device_for(backend)
    x = testing.randn(*shape, dtype=dtype, device=dev, scale=2.0)
    _check(backend, x, approximate, testing.randn(*shape[:-1], shape[-1] // 2, dtype=dtype, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_backward_strided_and_broadcast_grads(backend):
    dev = testing.device_for(backend)
    x = testing.randn(9, 2000, device=dev, scale=2.0)
    g = testing.randn(1000, 9, device=dev).t()
    assert not g.is_contiguous()
    _check(backend, x, "none", g)
    ones = torch.ones((), device=dev).expand(9, 1000)
    _check(backend, x, "tanh", ones)


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_backward_misaligned(backend):
    """N = 1001 on a storage-offset-1 view: no vector path may assume 16-byte alignment."""
    dev = testing.device_for(backend)
    x = testing.randn(3 * 2002 + 1, device=dev, scale=2.0)[1:].view(3, 2002)
    assert x.storage_offset() == 1
    _check(backend, x, "none", testing.randn(3, 1001, device=dev))
    _check(backend, x, "quick", testing.randn(3, 1001, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_backward_input_without_grad(backend):
    """The input not requiring grad (e.g. a frozen upstream) flows nothing and raises nothing; with grad through a
    view of a larger tensor only that view's part gets it."""
    dev = testing.device_for(backend)
    x = testing.randn(4, 768, device=dev)
    y = fastenc.ops.geglu(x, backend=backend)
    assert not y.requires_grad
    big = testing.randn(4, 800, device=dev).requires_grad_(True)
    fastenc.ops.geglu(big[:, :768], backend=backend).sum().backward()
    ones = torch.ones(4, 384, device=dev)
    testing.assert_close(big.grad[:, :768], geglu_bwd_ref(ones, big.detach()[:, :768]), name="dx")
    assert bool((big.grad[:, 768:] == 0).all())


def test_geglu_bwd_reference_matches_autograd():
    for approximate in ("none", "tanh", "quick"):
        x = testing.randn(17, 514, scale=3.0).double().requires_grad_(True)
        g = testing.randn(17, 257).double()
        geglu_ref(x, approximate, upcast=False).backward(g)
        torch.testing.assert_close(geglu_bwd_ref(g, x.detach(), approximate, upcast=False), x.grad, rtol=1e-12,
                                   atol=1e-12)


class _GegluRef(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return geglu_ref(x, approximate, upcast=False)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return geglu_bwd_ref(g, x, ctx.approximate, upcast=False), None


@pytest.mark.parametrize("approximate", ["none", "tanh", "quick"])
def test_geglu_bwd_reference_gradcheck(approximate):
    x = testing.randn(5, 14, scale=2.0).double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: _GegluRef.apply(x, approximate), (x,))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("reference", "cpu")])
def test_geglu_opcheck_autograd(backend):
    x = testing.randn(5, 768).requires_grad_(True)
    torch.library.opcheck(torch.ops.fastenc.geglu.default, (x, "none", backend))
    torch.library.opcheck(torch.ops.fastenc.geglu_bwd.default, (testing.randn(5, 384), x.detach(), "tanh", backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_backward_bad_gradient(backend):
    dev = testing.device_for(backend)
    x = testing.randn(5, 768, device=dev)
    with pytest.raises(ValueError, match=r"geglu: grad must be \(5, 384\)"):
        torch.ops.fastenc.geglu_bwd(testing.randn(5, 768, device=dev), x, "none", backend)
    with pytest.raises(ValueError, match=r"geglu: grad must be .*got \(\(5, 384\), torch.bfloat16"):
        torch.ops.fastenc.geglu_bwd(testing.randn(5, 384, dtype=torch.bfloat16, device=dev), x, "none", backend)
    y = fastenc.ops.geglu(x.clone().requires_grad_(True), backend=backend)
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(testing.randn(5, 768, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_geglu_out_refuses_grad(backend):
    dev = testing.device_for(backend)
    x = testing.randn(5, 768, device=dev).requires_grad_(True)
    with pytest.raises(ValueError, match="out= is an inference form"):
        fastenc.ops.geglu(x, backend=backend, out=torch.empty(5, 384, device=dev))
