"""sparse_max (SPLADE max-pooled weights): every backend against the fp32 reference under the tolerance rule on odd
sizes (hidden 36 / 384, vocab 1237, sequences of 1, 17 and 129 tokens and an empty one), a cu_seqlens changed
between calls, the reference's gradient and the fast backends' refusal of one, bad input naming the argument."""
import pytest
import torch

from fastenc import ops, registry, testing
from fastenc.reference.sparse_max import sparse_max_ref

OP = "sparse_max"
LENGTHS = [(1, 17, 129), (17, 0, 1, 5)]
HIDDEN = [36, 384]
V = 1237


def _w(backend, dtype=torch.float32):
    dev = testing.device_for(backend)
    return {"x": testing.fake(20, 36, dtype=dtype, device=dev), "weight": testing.fake(V, 36, dtype=dtype, device=dev)}


CASES = testing.cases(OP, ((b, dt, h, lens) for b in testing.backends_for(OP) for dt in testing.DTYPES
                           for h in HIDDEN for lens in LENGTHS),
                      lambda b, dt, h, lens: _w(b, dt),
                      ids=lambda b, dt, h, lens: f"{b}-{testing.dtype_id(dt)}-h{h}-v{V}-{'_'.join(map(str, lens))}")
BACKENDS = testing.backend_cases(OP, _w)


def _cu(lens, device):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return cu.to(device)


def _inputs(lens, h, v, dtype, device, bias=True):
    x = testing.randn(sum(lens), h, dtype=dtype, device=device)
    w = testing.randn(v, h, dtype=dtype, device=device, scale=h ** -0.5)
    b = testing.randn(v, dtype=dtype, device=device, scale=0.5) if bias else None
    return x, _cu(lens, device), w, b


@pytest.mark.parametrize("backend,dtype,h,lens", CASES)
def test_sparse_max_matches_reference(backend, dtype, h, lens):
    x, cu, w, b = _inputs(lens, h, V, dtype, testing.device_for(backend), bias=h != 36)
    out = ops.sparse_max(x, cu, w, b, backend=backend)
    assert out.dtype == torch.float32 and out.shape == (len(lens), V)
    ref = sparse_max_ref(x, cu, w, b)
    assert (ref > 0).any() and (ref == 0).any()  # both sides of the relu are exercised
    lowp = None if dtype == torch.float32 else sparse_max_ref(x, cu, w, b, upcast=False)
    testing.assert_close(out, ref, lowp, dtype=dtype)
    for s, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[s].cpu(), torch.zeros(V)), "an empty sequence must give zeros"


@pytest.mark.parametrize("backend", BACKENDS)
def test_cu_seqlens_changed_between_calls(backend):
    """The same x and weight, the same cu_seqlens tensor rewritten in place: each call reads the values it is given."""
    dev = testing.device_for(backend)
    x, cu, w, b = _inputs((5, 12, 3), 36, 97, torch.float32, dev)
    first = ops.sparse_max(x, cu, w, b, backend=backend)
    testing.assert_close(first, sparse_max_ref(x, cu, w, b), dtype=torch.float32)
    cu.copy_(_cu((1, 1, 18), dev))
    second = ops.sparse_max(x, cu, w, b, backend=backend)
    testing.assert_close(second, sparse_max_ref(x, cu, w, b), dtype=torch.float32)
    assert not torch.equal(first, second)


def test_reference_is_differentiable():
    """gradcheck of the reference in fp64; the public op with backend='reference' differentiates through it."""
    x, cu, w, b = _inputs((3, 4), 8, 11, torch.float64, "cpu")
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradcheck(lambda x, w, b: sparse_max_ref(x, cu, w, b), args)
    leaves = [t.float().requires_grad_() for t in (x, w, b)]
    ops.sparse_max(leaves[0], cu, leaves[1], leaves[2], backend="reference").sum().backward()
    for leaf, t in zip(leaves, args):
        sparse = sparse_max_ref(args[0], cu, args[1], args[2]).sum()
        want = torch.autograd.grad(sparse, t)[0]
        torch.testing.assert_close(leaf.grad.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] != "reference"])
def test_fast_backends_refuse_grad(backend):
    x, cu, w, b = _inputs((3, 4), 36, 11, torch.float32, testing.device_for(backend))
    with pytest.raises(RuntimeError, match=r"sparse_max: the \w+ backend is forward only.*backend='reference'"):
        ops.sparse_max(x.requires_grad_(), cu, w, b, backend=backend)
    with torch.no_grad():
        ops.sparse_max(x, cu, w, b, backend=backend)


def test_custom_op_backward_raises_naming_the_op():
    from fastenc.ops.sparse_max import _sparse_max_op

    x, cu, w, b = _inputs((3, 4), 8, 11, torch.float32, "cpu")
    out = _sparse_max_op(x.requires_grad_(), cu, w, b, "reference")
    with pytest.raises(RuntimeError, match="fastenc::sparse_max has no backward"):
        out.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad,match", [
    (lambda x, cu, w, b: (x, cu.long(), w, b), "sparse_max: cu_seqlens must be int32, got int64"),
    (lambda x, cu, w, b: (x, torch.tensor([0, 5, 3, 7], dtype=torch.int32, device=cu.device), w, b),
     "sparse_max: cu_seqlens must be non-decreasing"),
    (lambda x, cu, w, b: (x, torch.tensor([0, 3, 99], dtype=torch.int32, device=cu.device), w, b),
     "sparse_max: cu_seqlens must end at total_tokens=7, got 99"),
    (lambda x, cu, w, b: (x, torch.tensor([1, 7], dtype=torch.int32, device=cu.device), w, b),
     "sparse_max: cu_seqlens must start at 0"),
    (lambda x, cu, w, b: (x, cu[:1], w, b), "sparse_max: cu_seqlens must be 1-D of length batch\\+1"),
    (lambda x, cu, w, b: (x, cu, w[:, :5], b), r"sparse_max: weight must be \(vocab, 8\)"),
    (lambda x, cu, w, b: (x, cu, w, b[:3]), r"sparse_max: bias must have shape \(11,\)"),
    (lambda x, cu, w, b: (x, cu, w.double(), b), "sparse_max: weight must be float32, float16 or bfloat16"),
    (lambda x, cu, w, b: (x, cu, w.half(), b), "sparse_max: weight must have x's dtype float32"),
    (lambda x, cu, w, b: (x.int(), cu, w, b), "sparse_max: x must be float32, float16 or bfloat16"),
    (lambda x, cu, w, b: (x[None], cu, w, b), r"sparse_max: x must be \(tokens, hidden\)"),
], ids=["cu-int64", "cu-decreasing", "cu-past-end", "cu-start", "cu-short", "weight-hidden", "bias-shape",
        "weight-fp64", "weight-dtype", "x-int", "x-3d"])
def test_bad_input(backend, bad, match):
    x, cu, w, b = _inputs((3, 4), 8, 11, torch.float32, testing.device_for(backend))
    with pytest.raises((ValueError, TypeError), match=match):
        ops.sparse_max(*bad(x, cu, w, b), backend=backend)


def test_cpu_kernel_checks_cu_seqlens_itself():
    """The C++ wrapper validates cu_seqlens where it reads it (memory safety without the Python checks)."""
    if "cpu" not in testing.backends_for(OP):
        pytest.skip("the cpu extension cannot load here")
    from fastenc import extension

    ext = extension.load()
    x, cu, w, b = _inputs((3, 4), 8, 11, torch.float32, "cpu")
    for bad, match in (([0, 5, 3], "non-decreasing"), ([0, 3, 8], "within x's 7 rows"), ([-1, 7], ">= 0")):
        with pytest.raises(RuntimeError, match=match):
            ext.sparse_max(x, torch.tensor(bad, dtype=torch.int32), w, b)
    # a window of rows (not starting at 0, ending before the last row) is served
    cu = torch.tensor([2, 4, 6], dtype=torch.int32)
    testing.assert_close(ext.sparse_max(x, cu, w, b), sparse_max_ref(x[2:6], cu - 2, w, b), dtype=torch.float32)


def _ext_or_skip():
    if "cpu" not in testing.backends_for(OP):
        pytest.skip("the cpu extension cannot load here")
    from fastenc import extension

    return extension.load()


def test_cpu_kernel_on_prepacked_panels_equals_packing_in_the_call():
    ext = _ext_or_skip()
    x, cu, w, b = _inputs((1, 17, 40), 36, V, torch.float32, "cpu")
    panels = ext.sparse_max_pack(w)
    assert torch.equal(ext.sparse_max(x, cu, w, b, panels), ext.sparse_max(x, cu, w, b))
    for bad in (panels[:-1], panels.transpose(1, 2), panels.double(), ext.sparse_max_pack(w[:-40])):
        with pytest.raises(RuntimeError, match="panels must be"):
            ext.sparse_max(x, cu, w, b, bad)


def test_cpu_backend_keeps_the_panels_while_the_weight_lives_and_repacks_a_changed_one():
    _ext_or_skip()
    import gc
    import importlib

    sm = importlib.import_module("fastenc.ops.sparse_max")  # (the module: fastenc.ops.sparse_max is the function)

    x, cu, w, b = _inputs((3, 9), 36, 301, torch.float32, "cpu")
    first = ops.sparse_max(x, cu, w, b, backend="cpu")
    panels = sm._PANELS[id(w)][2]
    ops.sparse_max(x, cu, w, b, backend="cpu")
    assert sm._PANELS[id(w)][2] is panels  # packed once
    with torch.no_grad():
        w.mul_(-1.5)  # changed in place: repacked, the result follows the new weight
    out = ops.sparse_max(x, cu, w, b, backend="cpu")
    assert sm._PANELS[id(w)][2] is not panels and not torch.equal(out, first)
    testing.assert_close(out, sparse_max_ref(x, cu, w, b), dtype=torch.float32)
    key = id(w)
    del w
    gc.collect()
    assert key not in sm._PANELS  # dropped with the weight


def test_registered_backends():
    assert {"reference", "cpu", "triton"} <= set(registry.impls(OP))
