"""lora_linear backward: gradients of x, lora_a, lora_b (and of the base weight and bias only when they require
grad) on every backend x dtype x odd shapes against torch.autograd of the fp32 reference; strided and zero-stride
upstream gradients; merge_lora's backward refusing by name; bad gradients."""
import itertools

import pytest
import torch

from fastenc import ops, registry, testing
from fastenc.reference.lora_linear import lora_linear_bwd_ref, lora_linear_ref

OP = "lora_linear"
NAMES = ("x", "weight", "bias", "lora_a", "lora_b")
# (in_features, out_features, rank) x tokens 1/17/129
DIMS = [(384, 1152, 8), (1000, 384, 1), (1001, 1152, 16), (1152, 1001, 8)]
TOKENS = (1, 17, 129)


def _dtypes(backend):
    # the triton forward's bf16 tl.dot is wrong under the interpreter: bf16 triton runs on a GPU only
    if backend == "triton" and registry.interpreter_on():
        return (torch.float32, torch.float16)
    return testing.DTYPES


def _tensors(tokens, in_f, out_f, r, dtype, device):
    return (testing.randn(tokens, in_f, dtype=dtype, device=device),
            testing.randn(out_f, in_f, dtype=dtype, device=device, scale=in_f ** -0.5),
            testing.randn(out_f, dtype=dtype, device=device),
            testing.randn(r, in_f, dtype=dtype, device=device, scale=in_f ** -0.5),
            testing.randn(out_f, r, dtype=dtype, device=device, scale=0.5))


def _grads(fn, tensors, need, gy):
    leaves = [t.detach().clone().requires_grad_(n) for t, n in zip(tensors, need)]
    y = fn(*leaves)
    got = torch.autograd.grad(y, [l for l, n in zip(leaves, need) if n], gy)
    return dict(zip([k for k, n in zip(NAMES, need) if n], got))


def _check(backend, dtype, tokens, in_f, out_f, r, need=(True, False, False, True, True), scale=2.0, gy=None):
    dev = testing.device_for(backend)
    ts = _tensors(tokens, in_f, out_f, r, dtype, dev)
    gy = testing.randn(tokens, out_f, dtype=dtype, device=dev) if gy is None else gy
    got = _grads(lambda x, w, b, a, bb: ops.lora_linear(x, w, b, a, bb, scale, backend=backend), ts, need, gy)
    ref32 = _grads(lambda *t: lora_linear_ref(*t, scale), [t.float() for t in ts], need, gy.float())
    lowp = (_grads(lambda *t: lora_linear_ref(*t, scale, upcast=False), ts, need, gy)
            if dtype != torch.float32 else {})
    assert set(got) == {k for k, n in zip(NAMES, need) if n}
    for k in got:
        assert got[k].dtype == dtype
        testing.assert_close(got[k], ref32[k], lowp.get(k), dtype=dtype,
                             extra=testing.interpreter_extra(backend, dtype, ref32[k]), name="d" + k)
    return got


def _shapes(backend):
    # Under the interpreter the triton forward (a fused GEMM) costs ~30-90 s per odd-sized case on a busy CPU:
    # three shapes there (every shape on a GPU); its backward is torch GEMMs, as the cpu backend's.
    if backend == "triton" and registry.interpreter_on():
        return [(1, (384, 1152, 8)), (17, (1000, 384, 1)), (17, (1001, 384, 16))]
    return list(itertools.product(TOKENS, DIMS))


CASES = [pytest.param(be, dt, t, d, id=f"{be}-{testing.dtype_id(dt)}-{t}x{d[0]}x{d[1]}-r{d[2]}")
         for be in testing.backends_for(OP + "_bwd") if be in testing.backends_for(OP)
         for dt in _dtypes(be) for t, d in _shapes(be)]


@pytest.mark.parametrize("backend,dtype,tokens,dims", CASES)
def test_lora_linear_backward(backend, dtype, tokens, dims):
    """The adapter's training case: dx, dA, dB; the frozen base weight and bias get no gradient."""
    _check(backend, dtype, tokens, *dims)


@pytest.mark.parametrize("backend", testing.backends_for(OP))
@pytest.mark.parametrize("which", ["all", "x", "lora_a", "lora_b", "weight+bias", "lora_a+lora_b"])
def test_lora_linear_backward_some_inputs(backend, which):
    need = tuple(True for _ in NAMES) if which == "all" else tuple(k in which.split("+") for k in NAMES)
    _check(backend, torch.float32, 5, 384, 200, 8, need=need)


@pytest.mark.parametrize("backend", testing.backends_for(OP))
@pytest.mark.parametrize("kind", ["expanded", "transposed"])
def test_lora_linear_backward_strided_upstream_gradient(backend, kind):
    dev = testing.device_for(backend)
    gy = (torch.ones((), device=dev).expand(17, 200) if kind == "expanded"
          else testing.randn(200, 17, device=dev).t())
    assert not gy.is_contiguous()
    _check(backend, torch.float32, 17, 384, 200, 8, gy=gy)


@pytest.mark.parametrize("backend", testing.backends_for(OP))
def test_lora_linear_backward_frozen_base_gets_nothing(backend):
    """A frozen base weight and bias: no .grad (and no dW GEMM: the backward op is asked for dx, dA, dB only)."""
    dev = testing.device_for(backend)
    x, w, b, a, bb = _tensors(5, 384, 200, 4, torch.float32, dev)
    a.requires_grad_(True)
    bb.requires_grad_(True)
    ops.lora_linear(x, w, b, a, bb, 0.5, backend=backend).sum().backward()
    assert w.grad is None and b.grad is None and x.grad is None
    assert a.grad is not None and bb.grad is not None


def test_lora_linear_bwd_reference_formulas_match_autograd():
    g = torch.Generator().manual_seed(1)
    x, w, a, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((7, 9), (5, 9), (3, 9), (5, 3)))
    bias = torch.randn(5, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, w, bias, a, b)]
    assert torch.autograd.gradcheck(lambda *t: lora_linear_ref(*t, 0.75), leaves)
    dy = torch.randn(7, 5, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(lora_linear_ref(*leaves, 0.75), leaves, dy)
    got = lora_linear_bwd_ref(dy, x, w, a, b, 0.75, True, True, True, True, True)
    for name, gv, wv in zip(NAMES, got, want):
        torch.testing.assert_close(gv, wv, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("backend", testing.backends_for(OP + "_bwd"))
def test_lora_linear_bwd_bad_gradient_is_named(backend):
    dev = testing.device_for(backend)
    x, w, _, a, b = _tensors(5, 40, 48, 4, torch.float32, dev)
    op = torch.ops.fastenc.lora_linear_bwd.default
    with pytest.raises(ValueError, match=r"lora_linear_bwd: dy must have shape \(5, 48\)"):
        op(testing.randn(5, 40, device=dev), x, w, a, b, 1.0, True, False, False, True, True, backend)
    with pytest.raises(ValueError, match="lora_linear_bwd: dy must be torch.float32"):
        op(testing.randn(5, 48, device=dev).half(), x, w, a, b, 1.0, True, False, False, True, True, backend)


@pytest.mark.parametrize("backend", testing.backends_for("merge_lora"))
def test_merge_lora_backward_raises_naming_the_op(backend):
    dev = testing.device_for(backend)
    w = testing.randn(48, 40, device=dev)
    a = testing.randn(8, 40, device=dev).requires_grad_()
    b = testing.randn(48, 8, device=dev)
    merged = ops.merge_lora(w, a, b, 2.0, backend=backend)
    assert merged.requires_grad
    with pytest.raises(RuntimeError, match="fastenc::merge_lora has no backward.*lora_linear"):
        merged.sum().backward()
