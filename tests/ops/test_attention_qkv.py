"""attention_qkv: attention read straight from one fused QKV buffer, its gradient written into one buffer. Output and
d qkv of every backend against autograd through the fp64 reference (odd sizes, length-1 and empty sequences,
windows, dropout with the same keep-mask forward and backward, row-strided buffers); the training layer runs it
with no copy of q, k, v and no concatenation of their gradients; bad buffers raise naming the argument."""
import math

import pytest
import torch

from fastenc import extension, ops, registry, testing
from fastenc.layers import SelfAttention
from fastenc.reference.attention import attention_varlen_ref

BACKENDS = testing.backends_for("attention_bwd", device="cpu")
INTERP = registry.interpreter_on() and not torch.cuda.is_available()


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


def _seed_offset(generator_seed):
    """The (seed, offset) ops draw from a generator seeded with generator_seed."""
    g = torch.Generator().manual_seed(generator_seed)
    return torch.randint(0, 2 ** 63 - 1, (2,), generator=g, dtype=torch.int64).tolist()


def _reference(qkv, g, heads, cu, window, scale, dropout_p=0.0, seed=0, offset=0):
    """(out, d qkv) by autograd through the reference forward in fp64."""
    x = qkv.detach().double().requires_grad_(True)
    t = x.shape[0]
    q, k, v = x.view(t, 3, heads, -1).unbind(1)
    w = window if window is not None else (-1, -1)
    out = attention_varlen_ref(q, k, v, cu, w, scale, dropout_p=dropout_p, seed=seed, offset=offset)
    out.backward(g.double())
    return out.detach(), x.grad


# (id, lengths, heads, head_dim, window, dropout_p)
CASES = [
    ("s1-17-0-5-h3d13", (1, 17, 0, 5), 3, 13, None, 0.0),
    ("s1-40-h2d24-win", (1, 40, 1), 2, 24, (4, 7), 0.0),
    ("s70-h2d16-win0", (70, 3), 2, 16, (0, 0), 0.0),
    ("s33-1-h3d8-drop", (33, 1, 9), 3, 8, None, 0.3),
    ("s50-h2d16-win-drop", (50, 2), 2, 16, (5, 3), 0.25),
]


def _params():
    out = []
    for be in BACKENDS:
        for case in CASES:
            if be == "triton" and (case[3] % 8 or case[5] > 0):
                continue  # head dims the Triton kernels take; dropout is covered by its own tests
            out.append(pytest.param(be, *case[1:], id=f"{be}-{case[0]}"))
    return out


@pytest.mark.parametrize("backend,lens,heads,head_dim,window,dropout_p", _params())
@pytest.mark.parametrize("row_pad", [0, 5], ids=["dense", "strided"])
def test_matches_fp64_reference(backend, lens, heads, head_dim, window, dropout_p, row_pad):
    total, hidden = sum(lens), heads * head_dim
    # row_pad > 0: qkv is a column slice of a wider buffer (row stride 3 * hidden + row_pad)
    base = testing.randn(total, 3 * hidden + row_pad)
    qkv = base[:, row_pad:].detach().requires_grad_(True) if row_pad == 0 else None
    if qkv is None:
        leaf = base.requires_grad_(True)
        qkv = leaf[:, row_pad:]
    g = testing.randn(total, heads, head_dim)
    cu = _cu(lens)
    kw = {"dropout_p": dropout_p, "generator": torch.Generator().manual_seed(7)} if dropout_p else {}
    out = ops.attention_qkv(qkv, heads, cu_seqlens=cu, window=window, backend=backend, **kw)
    out.backward(g)
    grad = qkv.grad if row_pad == 0 else leaf.grad[:, row_pad:]
    seed, offset = _seed_offset(7) if dropout_p else (0, 0)
    ref_out, ref_grad = _reference(qkv, g, heads, cu, window, head_dim ** -0.5, dropout_p, seed, offset)
    tol = 2e-5 if backend != "triton" else 2e-4
    assert out.shape == (total, heads, head_dim) and grad.shape == qkv.shape
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(grad.double(), ref_grad, atol=tol, rtol=tol)
    if row_pad:
        assert (leaf.grad[:, :row_pad] == 0).all()


def test_same_as_attention_on_the_three_views():
    lens, heads, d = (9, 1, 31), 3, 16
    total = sum(lens)
    qkv = testing.randn(total, 3 * heads * d)
    g = testing.randn(total, heads, d)
    cu = _cu(lens)
    a = qkv.clone().requires_grad_(True)
    out_a = ops.attention_qkv(a, heads, cu_seqlens=cu, window=(6, 2))
    out_a.backward(g)
    b = qkv.clone().requires_grad_(True)
    q, k, v = b.view(total, 3, heads, d).unbind(1)
    out_b = ops.attention(q, k, v, cu_seqlens=cu, window=(6, 2))
    out_b.backward(g)
    torch.testing.assert_close(out_a, out_b, atol=0, rtol=0)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-6)


def test_fp16_input_gets_fp16_gradient():
    lens, heads, d = (5, 12), 2, 8
    qkv = testing.randn(sum(lens), 3 * heads * d, dtype=torch.float16).requires_grad_(True)
    g = testing.randn(sum(lens), heads, d, dtype=torch.float16)
    out = ops.attention_qkv(qkv, heads, cu_seqlens=_cu(lens), backend="cpu")
    out.backward(g)
    assert out.dtype == torch.float16 and qkv.grad.dtype == torch.float16
    ref_out, ref_grad = _reference(qkv, g, heads, _cu(lens), None, d ** -0.5)
    torch.testing.assert_close(qkv.grad.double(), ref_grad, atol=3e-3, rtol=3e-3)


def _events(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return prof.events()


COPIES = ("aten::cat", "aten::stack", "aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy")


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_forward_and_backward_make_no_copies(dropout):
    lens, heads, d = (20, 1, 7), 4, 12
    t, cu = sum(lens), _cu(lens)
    qkv = testing.randn(t, 3 * heads * d).requires_grad_(True)
    g = testing.randn(t, heads, d)
    events = _events(lambda: ops.attention_qkv(qkv, heads, cu_seqlens=cu, dropout_p=dropout).backward(g))
    names = [e.name for e in events]
    assert names.count("fastenc::attention_qkv") == 1 and names.count("fastenc::attention_qkv_bwd") == 1
    # the only copies: cu_seqlens, (batch + 1,) int32, read into a private copy where checked
    copies = [(e.name, e.input_shapes) for e in events if e.name in COPIES and e.input_shapes[0] != [len(lens) + 1]]
    assert copies == []
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_training_layer_uses_the_fused_buffer(dropout):
    layer = SelfAttention(48, 4, dropout=dropout).train()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(testing.randn(*p.shape, scale=0.2))
    x = testing.randn(21, 48).requires_grad_(True)
    cu, t = _cu((20, 1)), 21
    torch.manual_seed(3)  # (seed, offset) of the dropout mask come from the default generator
    names = [e.name for e in _events(lambda: layer(x, cu, 20).sum().backward())]
    assert names.count("fastenc::attention_qkv") == 1 and names.count("fastenc::attention_qkv_bwd") == 1
    assert "aten::stack" not in names and "aten::cat" not in names
    # the gradients are those of the three-view form with the same mask
    w, dx = layer.Wqkv.weight.grad.clone(), x.grad.clone()
    layer.zero_grad()
    x.grad = None
    torch.manual_seed(3)
    q, k, v = layer.Wqkv(x).view(t, 3, 4, 12).unbind(1)
    o = ops.attention(q, k, v, cu_seqlens=cu, dropout_p=dropout)
    layer.Wo(o.reshape(t, 48)).sum().backward()
    torch.testing.assert_close(layer.Wqkv.weight.grad, w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, dx, atol=1e-5, rtol=1e-5)


def test_bad_qkv_raises_naming_it():
    cu = _cu((4, 3))
    with pytest.raises(ValueError, match=r"attention_qkv: qkv must be \(total_tokens, 3 \* heads \* head_dim\)"):
        ops.attention_qkv(testing.randn(7, 3 * 2 * 8 + 1), 2, cu_seqlens=cu)
    with pytest.raises(ValueError, match="attention_qkv: heads must be a positive int"):
        ops.attention_qkv(testing.randn(7, 48), 0, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens"):
        ops.attention_qkv(testing.randn(8, 48), 2, cu_seqlens=cu)


def test_cpu_backward_checks_grad_qkv_and_strides():
    ext = extension.load()
    t, h, d = 7, 2, 8
    cu = _cu((4, 3))
    qkv = testing.randn(t, 3 * h * d)
    q, k, v = qkv.view(t, 3, h, d).unbind(1)
    out, lse = ext.attention(q, k, v, cu, 4, -1, -1, d ** -0.5)
    g = testing.randn(t, h, d)
    for bad in (torch.empty(t, 3 * h * d - 1), torch.empty(t + 1, 3 * h * d), torch.empty(3 * h * d, t).t(),
                torch.empty(t, 3 * h * d, dtype=torch.float64)):
        with pytest.raises(RuntimeError, match="attention_bwd: grad_qkv must be float32"):
            ext.attention_bwd(g, q, k, v, out, lse, cu, 4, -1, -1, d ** -0.5, grad_qkv=bad)
    # q, k, v of different strides are copied (not read with q's stride): the same gradients as contiguous ones
    dq0, dk0, dv0 = ext.attention_bwd(g, q.contiguous(), k.contiguous(), v.contiguous(), out, lse, cu, 4, -1, -1,
                                      d ** -0.5)
    dq1, dk1, dv1 = ext.attention_bwd(g, q, k.contiguous(), v, out, lse, cu, 4, -1, -1, d ** -0.5)
    for a, b in ((dq0, dq1), (dk0, dk1), (dv0, dv1)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # into a buffer: views of it, poisoned first so an unwritten element fails; blocks not asked for are zero
    buf = torch.full((t, 3 * h * d), math.nan)
    ext.attention_bwd(g, q, k, v, out, lse, cu, 4, -1, -1, d ** -0.5, 0.0, 0, 0, True, False, grad_qkv=buf)
    got = buf.view(t, 3, h, d)
    torch.testing.assert_close(got[:, 0], dq0, atol=0, rtol=0)
    assert (got[:, 1:] == 0).all()


@pytest.mark.parametrize("backend", [b for b in ("reference", "cpu") if b in BACKENDS])
def test_opcheck(backend):
    r = testing.randn
    cu = _cu((4, 0, 5))
    fwd = torch.ops.fastenc.attention_qkv.default
    torch.library.opcheck(fwd, (r(9, 3 * 2 * 16).requires_grad_(True), cu, 5, -1, -1, 0.25, 2, backend))
    torch.library.opcheck(fwd, (r(7, 3 * 3 * 8, dtype=torch.bfloat16).requires_grad_(True), _cu((7,)), 7, 2, 1,
                                8 ** -0.5, 3, backend, 0.2, 5, 7))
    qkv = r(9, 3 * 2 * 16)
    out, lse = fwd(qkv, cu, 5, -1, -1, 0.25, 2, backend)
    torch.library.opcheck(torch.ops.fastenc.attention_qkv_bwd.default,
                          (r(9, 2, 16), qkv, out, lse, cu, 5, -1, -1, 0.25, 2, backend, 0.1, 3, 4, False, True))


def test_compiled_fullgraph_matches_eager():
    lens, heads, d = (20, 1), 2, 8
    t, cu = sum(lens), _cu(lens)
    qkv = testing.randn(t, 3 * heads * d).requires_grad_(True)
    g = testing.randn(t, heads, d)
    f = torch.compile(lambda x, c: ops.attention_qkv(x, heads, cu_seqlens=c, window=(3, 2)), fullgraph=True,
                      backend="aot_eager")
    out = f(qkv, cu)
    out.backward(g)
    got = qkv.grad.clone()
    qkv.grad = None
    want = ops.attention_qkv(qkv, heads, cu_seqlens=cu, window=(3, 2))
    want.backward(g)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    torch.testing.assert_close(got, qkv.grad, atol=0, rtol=0)
