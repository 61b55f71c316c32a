"""attention dropout: every backend that serves dropout_p > 0 against the reference with the same (seed, offset)
(forward and dq/dk/dv under the tolerance rule, varlen batches with empty and one-token sequences, windows, padded
masks), the keep-mask read back from a backend's output (equal to the reference's; kept fraction within a binomial
bound), reproducibility (same generator state: bit-identical; other seed: different), gradcheck in float64 on the
reference, opcheck, the gradients computed only when needed, and bad dropout_p."""
import math

import pytest
import torch

from fastenc import extension, ops, registry, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref, attention_lse_varlen_ref
from fastenc.reference.attention_dropout import keep_mask

OP = "attention"
INTERP = registry.interpreter_on() and not torch.cuda.is_available()
P = 0.3


def _dtypes(backend):
    # The Triton interpreter's bf16 tl.dot returns garbage: bf16 Triton is checked on a GPU only.
    if backend == "triton" and INTERP:
        return (torch.float32, torch.float16)
    return testing.DTYPES


def _inputs(backend, dtype=torch.float32, head_dim=32):
    """The call a case makes, for the registry: packed q on the test device, with dropout on."""
    return {"q": testing.fake(17, 2, head_dim, dtype=dtype, device=testing.device_for(backend)), "dropout_p": P}


# (id, sequence lengths, heads, head_dim, window)
SHAPES = [("s17-0-1-40", (17, 0, 1, 40), 3, 32, None), ("win-5-2", (33, 1, 20), 2, 16, (5, 2))]
CASES = testing.cases(OP, ((b, dt, *s) for b in testing.backends_for(OP) for dt in _dtypes(b) for s in SHAPES),
                      lambda b, dt, *_: _inputs(b, dt), ids=lambda b, dt, name, *_: f"{b}-{testing.dtype_id(dt)}-{name}")
FP32 = testing.backend_cases(OP, _inputs)


def _cu(lens, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _draw(seed):
    """The (seed, offset) ops.attention draws from a generator seeded with `seed`."""
    return torch.randint(0, 2 ** 63 - 1, (2,), generator=torch.Generator().manual_seed(seed)).tolist()


def _poison(monkeypatch, backend):
    """New outputs start as NaN: torch.empty_like (reference, triton) NaN-filled; the cpu backend's buffer cache
    primed with NaN blocks."""
    if backend == "cpu":
        ext = extension.load()
        blocks = [ext.buffer_empty([4096], torch.empty(0)).fill_(math.nan) for _ in range(4)]
        del blocks
        return
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: empty_like(*a, **kw).fill_(math.nan))


@pytest.mark.parametrize("backend,dtype,name,lens,heads,head_dim,window", CASES)
def test_forward_and_backward_match_reference(monkeypatch, backend, dtype, name, lens, heads, head_dim, window):
    device = testing.device_for(backend)
    total = sum(lens)
    q, k, v, g = (testing.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(4))
    cu = _cu(lens, device)
    gen_seed = testing.next_seed()
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    _poison(monkeypatch, backend)
    gen = torch.Generator(device=device).manual_seed(gen_seed)
    out = ops.attention(*leaves, cu_seqlens=cu, window=window, dropout_p=P, generator=gen, backend=backend)
    out.backward(g)
    monkeypatch.undo()
    seed, offset = _draw(gen_seed)
    w = window or (-1, -1)
    drop = dict(dropout_p=P, seed=seed, offset=offset)
    f32 = [t.float() for t in (q, k, v, g)]
    out32 = attention_varlen_ref(*f32[:3], cu, w, **drop)
    lse = attention_lse_varlen_ref(f32[0], f32[1], cu, w)
    grads32 = attention_bwd_varlen_ref(f32[3], *f32[:3], out32, lse, cu, w, **drop)
    if dtype == torch.float32:
        out_lp, grads_lp = None, (None,) * 3
    else:
        out_lp = attention_varlen_ref(q, k, v, cu, w, upcast=False, **drop)
        grads_lp = attention_bwd_varlen_ref(g, q, k, v, out_lp, lse, cu, w, upcast=False, **drop)
    testing.assert_close(out, out32, out_lp, dtype=dtype, extra=testing.interpreter_extra(backend, dtype, out32))
    for gname, leaf, r32, rlp in zip(("dq", "dk", "dv"), leaves, grads32, grads_lp):
        testing.assert_close(leaf.grad, r32, rlp, dtype=dtype, extra=testing.interpreter_extra(backend, dtype, r32),
                             name=gname)


@pytest.mark.parametrize("backend", FP32)
def test_keep_mask_read_back_equals_reference_and_kept_fraction(backend):
    """q = 0 makes every probability 1/len, v = identity puts key j in feature j: out[i, h, j] * len * (1-p) is
    the keep-mask Z[h, i, j] itself. It must equal the reference's mask exactly, and the kept fraction of its
    n elements must lie within 5 standard deviations of n (1-p) (binomial; fails by chance with p < 1e-6)."""
    device = testing.device_for(backend)
    lens, heads, d = (64, 48), 4, 64
    total = sum(lens)
    q = torch.zeros(total, heads, d, device=device)
    v = torch.zeros(total, heads, d, device=device)
    for a, n in ((0, 64), (64, 48)):
        v[a:a + n] = torch.eye(n, d, device=device)[:, None, :]
    out, _ = torch.ops.fastenc.attention.default(q, q, v, _cu(lens, device), 64, -1, -1, 1.0, backend, P, 987, 654)
    kept = n_all = 0
    for a, n in ((0, 64), (64, 48)):
        z = out[a:a + n, :, :n].float().cpu() * n * (1 - P)                     # (i, h, j)
        assert float((z - z.round()).abs().max()) < 1e-3 and set(z.round().unique().tolist()) <= {0.0, 1.0}
        pos = torch.arange(n)
        want = keep_mask(987, 654, P, heads, pos + a, pos).permute(1, 0, 2)    # (i, h, j)
        assert torch.equal(z.round().bool(), want), "keep-mask differs from the reference's"
        kept += int(want.sum())
        n_all += want.numel()
    sd = math.sqrt(n_all * P * (1 - P))
    assert abs(kept - n_all * (1 - P)) < 5 * sd, f"kept {kept} of {n_all}, expected {n_all * (1 - P):.0f} +- {sd:.0f}"


@pytest.mark.parametrize("backend", FP32)
def test_same_generator_state_is_bit_identical_other_seed_differs(backend):
    device = testing.device_for(backend)
    q, k, v = (testing.randn(2, 33, 2, 32, device=device) for _ in range(3))

    def run(seed):
        return ops.attention(q, k, v, dropout_p=P, generator=torch.Generator(device=device).manual_seed(seed),
                             backend=backend)

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    torch.manual_seed(11)
    d = ops.attention(q, k, v, dropout_p=P, backend=backend)
    torch.manual_seed(11)
    assert torch.equal(ops.attention(q, k, v, dropout_p=P, backend=backend), d)


@pytest.mark.parametrize("backend", FP32)
def test_padded_with_key_padding_mask(backend):
    """The padded layout with a mask (rows of 17, 1 and 0 real tokens, one with a hole): the keep-mask of the packed
    real tokens (the counter layout of the reference's docstring), forward and gradients."""
    device = testing.device_for(backend)
    b, s, h, d = 3, 17, 2, 32
    q, k, v, g = (testing.randn(b, s, h, d, device=device) for _ in range(4))
    mask = torch.zeros(b, s, dtype=torch.bool, device=device)
    mask[0, :] = True
    mask[0, 5] = False
    mask[1, 4] = True
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = ops.attention(*leaves, key_padding_mask=mask, dropout_p=P, generator=torch.Generator(device=device).manual_seed(3),
                        backend=backend)
    out.backward(g)
    seed, offset = _draw(3)
    refs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    want = attention_ref(*refs, key_padding_mask=mask, dropout_p=P, seed=seed, offset=offset)
    want.backward(g)
    testing.assert_close(out, want)
    for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, refs):
        testing.assert_close(leaf.grad, ref.grad, name=name)


def test_padded_reference_without_mask_is_the_packed_layout():
    q, k, v = (testing.randn(2, 9, 2, 8) for _ in range(3))
    out = attention_ref(q, k, v, dropout_p=0.5, seed=1, offset=2)
    packed = attention_varlen_ref(*(t.reshape(18, 2, 8) for t in (q, k, v)), _cu((9, 9)), dropout_p=0.5, seed=1,
                                  offset=2)
    testing.assert_close(out.reshape(18, 2, 8), packed)
    assert not torch.allclose(out, attention_ref(q, k, v), atol=1e-3)  # dropout did act


def test_reference_gradcheck_fp64_with_dropout():
    """The reference forward (autograd) and its explicit backward formulas both pass gradcheck with dropout on."""
    cu, window = _cu((4, 0, 1, 3)), (1, 2)
    q, k, v = (testing.randn(8, 1, 4, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    drop = dict(dropout_p=0.4, seed=77, offset=5)
    assert torch.autograd.gradcheck(
        lambda a, b, c: attention_varlen_ref(a, b, c, cu, window, 0.7, upcast=False, **drop), (q, k, v))

    class Explicit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            out = attention_varlen_ref(a, b, c, cu, window, 0.7, upcast=False, **drop)
            ctx.save_for_backward(a, b, c, out)
            return out

        @staticmethod
        def backward(ctx, go):
            a, b, c, out = ctx.saved_tensors
            lse = attention_lse_varlen_ref(a, b, cu, window, 0.7)
            return attention_bwd_varlen_ref(go, a, b, c, out, lse, cu, window, 0.7, **drop)

    assert torch.autograd.gradcheck(Explicit.apply, (q, k, v))


@pytest.mark.parametrize("backend", [b for b in testing.backends_for(OP) if b in ("reference", "cpu")])
def test_opcheck_with_dropout(backend):
    cu = _cu((4, 0, 5))
    q, k, v = (testing.randn(9, 2, 16).requires_grad_(True) for _ in range(3))
    torch.library.opcheck(torch.ops.fastenc.attention.default, (q, k, v, cu, 5, 2, -1, 0.25, backend, P, 12, 34))
    g = testing.randn(9, 2, 16)
    out, lse = torch.ops.fastenc.attention.default(q.detach(), k.detach(), v.detach(), cu, 5, 2, -1, 0.25, backend,
                                                   P, 12, 34)
    for need in ((True, True), (False, True), (True, False)):
        torch.library.opcheck(torch.ops.fastenc.attention_bwd.default,
                              (g, q.detach(), k.detach(), v.detach(), out, lse, cu, 5, 2, -1, 0.25, backend, P, 12,
                               34, *need))


@pytest.mark.parametrize("backend", testing.backend_cases("attention_bwd", lambda b: {
    "q": testing.fake(13, 2, 16, device=testing.device_for(b)), "dropout_p": P}))
def test_backward_computes_only_needed_gradients(backend):
    """The backward op skips dq (or dk, dv) when not asked: an empty tensor comes back, the other gradients are the
    full computation's."""
    device = testing.device_for(backend)
    cu = _cu((9, 4), device)
    q, k, v, g = (testing.randn(13, 2, 16, device=device) for _ in range(4))
    out, lse = torch.ops.fastenc.attention.default(q, k, v, cu, 9, 2, -1, 0.25, "reference", P, 1, 2)
    bwd = torch.ops.fastenc.attention_bwd.default
    args = (g, q, k, v, out, lse, cu, 9, 2, -1, 0.25, backend, P, 1, 2)
    full = attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, (2, -1), 0.25, dropout_p=P, seed=1, offset=2)
    dq, dk, dv = bwd(*args, True, False)
    assert dk.numel() == 0 and dv.numel() == 0
    testing.assert_close(dq, full[0], name="dq")
    dq, dk, dv = bwd(*args, False, True)
    assert dq.numel() == 0
    testing.assert_close(dk, full[1], name="dk")
    testing.assert_close(dv, full[2], name="dv")
    for need in ("q", "kv"):  # through autograd
        leaves = [t.detach().clone().requires_grad_(n in need) for n, t in zip("qkv", (q, k, v))]
        ops.attention(*leaves, cu_seqlens=cu, backend=backend).backward(g)
        assert [leaf.grad is not None for leaf in leaves] == [n in need for n in "qkv"]


def test_zero_dropout_draws_nothing_and_cuda_declines_dropout():
    q = testing.randn(1, 9, 2, 16)
    state = torch.get_rng_state()
    ops.attention(q, q, q, dropout_p=0.0, backend="reference")
    assert torch.equal(torch.get_rng_state(), state), "dropout_p=0 must not draw from the generator"
    ops.attention(q, q, q, dropout_p=0.1, backend="reference")
    assert not torch.equal(torch.get_rng_state(), state)
    reasons = testing.cannot_serve(OP, "cuda", {"q": testing.fake(9, 2, 64, dtype=torch.float16, device="cuda"),
                                                "dropout_p": 0.1})
    assert "dropout_p > 0 not supported" in reasons, reasons
    assert not testing.cannot_serve(OP, "cuda", {"q": testing.fake(9, 2, 64, dtype=torch.float16, device="cuda"),
                                                 "dropout_p": 0.0})


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), float("inf"), True, "0.1", None])
def test_bad_dropout_p_raises(bad):
    q = testing.randn(1, 5, 2, 16)
    with pytest.raises(ValueError, match=r"dropout_p must be a float with 0 <= dropout_p < 1, got"):
        ops.attention(q, q, q, dropout_p=bad)


def test_bad_generator_raises():
    q = testing.randn(1, 5, 2, 16)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        ops.attention(q, q, q, dropout_p=0.1, generator=3)
