"""attention backward: dq, dk, dv of every backend against the reference under the tolerance rule (varlen batches
with empty and one-token sequences, padded batches, windows, odd head counts and dims, strided and zero-stride
upstream gradients, partial requires_grad), the explicit reference formulas against autograd and gradcheck (fp64),
opcheck with autograd, the forward's lse, and bad gradients."""
import math

import pytest
import torch

from fastenc import extension, ops, registry, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref, attention_lse_varlen_ref

OP = "attention_bwd"
BACKENDS = testing.backends_for(OP)
INTERP = registry.interpreter_on() and not torch.cuda.is_available()


def _dtypes(backend):
    # The Triton interpreter's bf16 tl.dot returns garbage: bf16 Triton is checked on a GPU only.
    if backend == "triton" and INTERP:
        return (torch.float32, torch.float16)
    return testing.DTYPES


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


# (id, sequence lengths, heads, head_dim, window, scale); hidden = heads * head_dim (384, 1152, 1000, 1001)
CASES = [
    ("s17-h384", (17,), 6, 64, None, None),
    ("s1-0-129", (1, 0, 129), 2, 32, None, 0.3),
    ("win-sym", (129, 17), 2, 64, (16, 16), None),
    ("win-asym", (40, 33, 1), 2, 32, (7, 0), None),
    ("win-0", (20, 0, 3), 2, 16, (0, 0), 0.5),
    ("s17-h1152", (17, 5), 9, 128, (3, 9), None),
]
CPU_ONLY = [  # head dims the Triton kernels do not take (multiples of 8 only)
    ("s17-h1000", (17, 1, 30), 8, 125, None, None),
    ("s129-h1001", (129, 0, 5), 7, 143, (20, 4), None),
    ("s70-d8", (70, 2), 3, 8, None, None),
]


def _params():
    out = []
    for be in BACKENDS:
        for dt in _dtypes(be):
            for case in CASES + (CPU_ONLY if be in ("cpu", "reference") else []):
                if be == "triton" and INTERP and case[3] * case[2] > 400 and dt != torch.float32:
                    continue  # interpreter time: the widest cases in fp32 only
                out.append(pytest.param(be, dt, *case[1:], id=f"{be}-{testing.dtype_id(dt)}-{case[0]}"))
    return out


def _poisoned_outputs(monkeypatch, backend, shape, dtype):
    """Outputs start as NaN, so an element a kernel forgets to write fails: new tensors from torch.empty_like
    (reference, triton) are NaN-filled; the cpu backend's come from the buffer cache, primed with NaN blocks."""
    if backend == "cpu":
        ext = extension.load()
        blocks = [ext.buffer_empty(list(shape), torch.empty(0, dtype=torch.float32)).fill_(math.nan)
                  for _ in range(3)]
        del blocks
        return
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: empty_like(*a, **kw).fill_(math.nan))


def _references(g, q, k, v, cu, window, scale, dtype):
    """fp32 reference gradients (explicit formulas) and the same in the inputs' low precision (None for fp32)."""
    w = window if window is not None else (-1, -1)
    w = (w, w) if isinstance(w, int) else w
    f32 = [t.float() for t in (g, q, k, v)]
    out32 = attention_varlen_ref(*f32[1:], cu, w, scale)
    lse = attention_lse_varlen_ref(f32[1], f32[2], cu, w, scale)
    ref32 = attention_bwd_varlen_ref(f32[0], *f32[1:], out32, lse, cu, w, scale)
    if dtype == torch.float32:
        return ref32, (None, None, None)
    out_lp = attention_varlen_ref(q, k, v, cu, w, scale, upcast=False)
    return ref32, attention_bwd_varlen_ref(g, q, k, v, out_lp, lse, cu, w, scale, upcast=False)


def _run(backend, q, k, v, g, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = ops.attention(*leaves, backend=backend, **kw)
    out.backward(g)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("backend,dtype,lens,heads,head_dim,window,scale", _params())
def test_varlen_backward_matches_reference(monkeypatch, backend, dtype, lens, heads, head_dim, window, scale):
    device = testing.device_for(backend)
    total = sum(lens)
    q, k, v, g = (testing.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(4))
    cu = _cu(lens).to(device)
    _poisoned_outputs(monkeypatch, backend, (total, heads, head_dim), dtype)
    got = _run(backend, q, k, v, g, cu_seqlens=cu, window=window, scale=scale)
    monkeypatch.undo()
    refs32, lowps = _references(g, q, k, v, cu, window, scale if scale is not None else head_dim ** -0.5, dtype)
    for name, out, r32, rlp in zip(("dq", "dk", "dv"), got, refs32, lowps):
        assert out.dtype == dtype
        testing.assert_close(out, r32, rlp, dtype=dtype, extra=testing.interpreter_extra(backend, dtype, r32),
                             name=name)


def _compiled_backends():
    return [b for b in BACKENDS if b != "reference"]


@pytest.mark.parametrize("backend", _compiled_backends())
def test_padded_backward_with_key_padding_mask(backend):
    """Padded batch with rows of 17, 1 and 0 real tokens: gradients match autograd through the padded reference;
    padded positions get zero gradient."""
    device = testing.device_for(backend)
    b, s, h, d = 3, 17, 2, 32
    q, k, v, g = (testing.randn(b, s, h, d, device=device) for _ in range(4))
    mask = torch.zeros(b, s, dtype=torch.bool, device=device)
    mask[0, :] = True
    mask[1, 4] = True
    got = _run(backend, q, k, v, g, key_padding_mask=mask)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    attention_ref(*leaves, key_padding_mask=mask).backward(g)
    for name, out, leaf in zip(("dq", "dk", "dv"), got, leaves):
        testing.assert_close(out, leaf.grad, name=name)
        assert out[~mask].abs().max() == 0, f"{name}: padded positions must get zero gradient"


@pytest.mark.parametrize("backend", _compiled_backends())
@pytest.mark.parametrize("kind", ["transposed", "zero-stride"])
def test_strided_upstream_gradient(backend, kind):
    device = testing.device_for(backend)
    lens = (17, 5)
    q, k, v = (testing.randn(sum(lens), 2, 32, device=device) for _ in range(3))
    if kind == "zero-stride":
        g = torch.ones((), device=device).expand(q.shape)  # e.g. from out.sum()
    else:
        g = testing.randn(32, 2, sum(lens), device=device).permute(2, 1, 0)
        assert not g.is_contiguous()
    cu = _cu(lens).to(device)
    got = _run(backend, q, k, v, g, cu_seqlens=cu)
    refs, _ = _references(g.contiguous(), q, k, v, cu, None, 32 ** -0.5, torch.float32)
    for name, out, r in zip(("dq", "dk", "dv"), got, refs):
        testing.assert_close(out, r, name=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("need", ["q", "kv", "v"])
def test_only_some_inputs_require_grad(backend, need):
    device = testing.device_for(backend)
    lens = (9, 4)
    q, k, v, g = (testing.randn(sum(lens), 2, 16, device=device) for _ in range(4))
    cu = _cu(lens).to(device)
    leaves = [t.detach().clone().requires_grad_(name in need) for name, t in zip("qkv", (q, k, v))]
    ops.attention(*leaves, cu_seqlens=cu, window=(2, 3), backend=backend).backward(g)
    refs, _ = _references(g, q, k, v, cu, (2, 3), 0.25, torch.float32)
    for name, leaf, r in zip("qkv", leaves, refs):
        if name in need:
            testing.assert_close(leaf.grad, r, name="d" + name)
        else:
            assert leaf.grad is None


# ---------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("window", [(-1, -1), (2, 1), (0, 0), (0, 3)])
def test_reference_formulas_match_autograd(window):
    lens = (1, 0, 9, 17)
    cu = _cu(lens)
    q, k, v, g = (testing.randn(sum(lens), 3, 8, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention_varlen_ref(*leaves, cu, window, 0.4, upcast=False)  # fp64 math
    want = torch.autograd.grad(out, leaves, g)
    lse = attention_lse_varlen_ref(q, k, cu, window, 0.4)
    got = attention_bwd_varlen_ref(g, q, k, v, out.detach(), lse, cu, window, 0.4)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        testing.assert_close(a, b, name=name)


class _ExplicitAttention(torch.autograd.Function):
    """The reference forward with the reference's explicit backward as its derivative (for gradcheck)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, window, scale):
        out = attention_varlen_ref(q, k, v, cu, window, scale, upcast=False)
        lse = attention_lse_varlen_ref(q, k, cu, window, scale)
        ctx.save_for_backward(q, k, v, out, lse, cu)
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, cu = ctx.saved_tensors
        return (*attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, ctx.window, ctx.scale), None, None, None)


@pytest.mark.parametrize("window", [(-1, -1), (1, 2)])
def test_reference_backward_gradcheck_fp64(window):
    cu = _cu((5, 0, 1, 4))
    q, k, v = (testing.randn(10, 2, 4, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: _ExplicitAttention.apply(a, b, c, cu, window, 0.7), (q, k, v))


# ---------------------------------------------------------------- the forward's lse, op registration, errors


@pytest.mark.parametrize("backend", testing.backends_for("attention"))
@pytest.mark.parametrize("window", [None, (3, 0)])
def test_forward_lse_matches_reference(backend, window):
    device = testing.device_for(backend)
    lens = (17, 0, 1, 40)
    q, k, v = (testing.randn(sum(lens), 3, 32, device=device) for _ in range(3))
    cu = _cu(lens).to(device)
    w = window or (-1, -1)
    out, lse = torch.ops.fastenc.attention.default(q, k, v, cu, max(lens), w[0], w[1], 0.3, backend)
    assert lse.dtype == torch.float32 and lse.shape == (3, sum(lens))
    testing.assert_close(lse, attention_lse_varlen_ref(q, k, cu, w, 0.3), name="lse")
    testing.assert_close(out, attention_varlen_ref(q, k, v, cu, w, 0.3), name="out")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("reference", "cpu")])
def test_opcheck_attention_with_autograd(backend):
    cu = _cu((4, 0, 5))
    q, k, v = (testing.randn(9, 2, 16).requires_grad_(True) for _ in range(3))
    torch.library.opcheck(torch.ops.fastenc.attention.default, (q, k, v, cu, 5, 2, -1, 0.25, backend))
    g, o = testing.randn(9, 2, 16), testing.randn(9, 2, 16)
    lse = attention_lse_varlen_ref(q.detach(), k.detach(), cu, (2, -1), 0.25)
    torch.library.opcheck(torch.ops.fastenc.attention_bwd.default,
                          (g, q.detach(), k.detach(), v.detach(), o, lse, cu, 5, 2, -1, 0.25, backend))


def test_wrong_gradient_dtype_or_shape_is_refused():
    cu = _cu((4, 5))
    q, k, v = (testing.randn(9, 2, 16) for _ in range(3))
    out, lse = torch.ops.fastenc.attention.default(q, k, v, cu, 5, -1, -1, 0.25, "reference")
    bwd = torch.ops.fastenc.attention_bwd.default
    with pytest.raises(ValueError, match="attention_bwd: grad must have q's dtype float32, got float16"):
        bwd(out.half(), q, k, v, out, lse, cu, 5, -1, -1, 0.25, "reference")
    with pytest.raises(ValueError, match=r"attention_bwd: grad must have q's shape \(9, 2, 16\), got \(9, 2, 8\)"):
        bwd(out[..., :8], q, k, v, out, lse, cu, 5, -1, -1, 0.25, "reference")
    with pytest.raises(ValueError, match="attention_bwd: lse must be float32"):
        bwd(out, q, k, v, out, lse.T, cu, 5, -1, -1, 0.25, "reference")
    leaf = q.clone().requires_grad_(True)
    y = ops.attention(leaf, k, v, cu_seqlens=cu)
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(torch.ones(9, 2, 15))


def test_second_order_gradient_raises():
    cu = _cu((4,))
    q = testing.randn(4, 1, 8).requires_grad_(True)
    y = ops.attention(q, q.detach(), q.detach(), cu_seqlens=cu, backend="reference")
    (gq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="attention_bwd has no backward"):
        gq.sum().backward()


def test_cuda_backward_is_served_by_triton():
    impl = registry.impls(OP)["cuda"]
    assert "served by the Triton kernel" in impl.limits


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not available")
def test_triton_clamps_corrupt_cu_seqlens_where_read():
    """The kernels read cu_seqlens themselves: entries past total_tokens are clamped (no read or write outside the
    tensors); the intact first sequence still gets its exact gradients."""
    from fastenc.kernels.attention_bwd import attention_bwd

    device = testing.device_for("triton")
    q, k, v, g = (testing.randn(9, 2, 16, device=device) for _ in range(4))
    good = _cu((5, 4)).to(device)
    out, lse = torch.ops.fastenc.attention.default(q, k, v, good, 5, -1, -1, 0.25, "reference")
    bad = torch.tensor([0, 5, 1 << 30], dtype=torch.int32, device=device)
    dq, dk, dv = attention_bwd(g, q, k, v, out, lse, bad, 5, -1, -1, 0.25)
    refs = attention_bwd_varlen_ref(g, q, k, v, out, lse, good, (-1, -1), 0.25)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        testing.assert_close(got, ref, name=name)
