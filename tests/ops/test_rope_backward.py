"""rope backward: dq and dk (the inverse rotation), with default positions, position_ids, cu_seqlens and partial
rotary dims, every backend against the reference, which is held to torch.autograd and to gradcheck in float64."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.ops.rope import positions_from_cu_seqlens
from fastenc.reference import rope_bwd_ref, rope_cache, rope_ref

OP = "rope_bwd"
BACKENDS = testing.backends_for(OP)
# (tokens as lengths, heads_q, heads_k, head_dim, rotary_dim): ModernBERT heads, GQA, odd lengths, partial rotary,
# an odd head dim past the rotary part
SHAPES = [((1,), 3, 3, 64, 64), ((17, 9), 4, 2, 64, 64), ((129,), 2, 1, 80, 48), ((5, 1, 3), 2, 2, 65, 64)]


def _sid(s):
    lengths, hq, hk, d, r = s
    return "+".join(map(str, lengths)) + f"x{hq}/{hk}x{d}" + (f"r{r}" if r != d else "")


def _run(backend, q, k, cos, sin, grads, need=(True, True), **kw):
    qq = q.detach().requires_grad_(need[0])
    kk = k.detach().requires_grad_(need[1])
    qo, ko = fastenc.ops.rope(qq, kk, cos, sin, backend=backend, **kw)
    torch.autograd.backward([qo, ko], list(grads))
    return qq.grad, kk.grad


def _check(backend, q, k, cos, sin, grads, pos, need=(True, True), **kw):
    dq, dk = _run(backend, q, k, cos, sin, grads, need, **kw)
    d = q.shape[-1]
    g3 = [g.expand(x.shape).reshape(-1, x.shape[-2], d) for g, x in zip(grads, (q, k))]
    ref32 = rope_bwd_ref(g3[0].float(), g3[1].float(), cos, sin, pos)
    lowp = rope_bwd_ref(*g3, cos, sin, pos, upcast=False) if q.dtype != torch.float32 else (None, None)
    for name, got, x, r, lp, wanted in zip(("dq", "dk"), (dq, dk), (q, k), ref32, lowp, need):
        if not wanted:
            assert got is None, name
            continue
        assert got.shape == x.shape and got.dtype == x.dtype
        testing.assert_close(got.reshape(r.shape), r, lp, extra=testing.interpreter_extra(backend, x.dtype, r),
                             name=name)


CASES = [pytest.param(be, dt, sh, id=f"{be}-{testing.dtype_id(dt)}-{_sid(sh)}")
         for be, dt, sh in itertools.product(BACKENDS, testing.DTYPES, SHAPES)]


@pytest.mark.parametrize("backend,dtype,shape", CASES)
def test_rope_backward_packed(backend, dtype, shape):
    """Packed tokens with cu_seqlens (positions restart per sequence)."""
    dev = testing.device_for(backend)
    lengths, hq, hk, d, rot = shape
    cos, sin = rope_cache(rot, 256, 160000.0, device=dev)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
    t = int(cu[-1])
    q, k = testing.randn(t, hq, d, dtype=dtype, device=dev), testing.randn(t, hk, d, dtype=dtype, device=dev)
    grads = (testing.randn(t, hq, d, dtype=dtype, device=dev), testing.randn(t, hk, d, dtype=dtype, device=dev))
    _check(backend, q, k, cos, sin, grads, positions_from_cu_seqlens(cu, t), cu_seqlens=cu)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=testing.dtype_id)
def test_rope_backward_position_ids(backend, dtype):
    """4-D layout with per-row position_ids, and the (1, seq) form broadcast over the batch."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 512, 10000.0, device=dev)
    q, k = testing.randn(2, 7, 3, 64, dtype=dtype, device=dev), testing.randn(2, 7, 1, 64, dtype=dtype, device=dev)
    grads = (testing.randn(*q.shape, dtype=dtype, device=dev), testing.randn(*k.shape, dtype=dtype, device=dev))
    pid = torch.randint(0, 512, (2, 7), device=dev)
    _check(backend, q, k, cos, sin, grads, pid.reshape(-1), position_ids=pid)
    pid1 = torch.randint(0, 512, (1, 7), device=dev)
    _check(backend, q, k, cos, sin, grads, pid1.expand(2, -1).reshape(-1), position_ids=pid1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_backward_strided_broadcast_and_partial_needs(backend):
    """Zero-stride and transposed upstream gradients; only q or only k requiring grad (the other gets None)."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 64, device=dev)
    q, k = testing.randn(2, 9, 4, 64, device=dev), testing.randn(2, 9, 2, 64, device=dev)
    pos = torch.arange(9, device=dev).repeat(2)
    ones = (torch.ones((), device=dev).expand(q.shape), torch.ones((), device=dev).expand(k.shape))
    _check(backend, q, k, cos, sin, ones, pos)
    gq = testing.randn(64, 4, 9, 2, device=dev).permute(3, 2, 1, 0)
    assert gq.shape == q.shape and not gq.is_contiguous()
    gk = testing.randn(*k.shape, device=dev)
    _check(backend, q, k, cos, sin, (gq, gk), pos, need=(True, False))
    _check(backend, q, k, cos, sin, (gq, gk), pos, need=(False, True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_backward_one_output_used(backend):
    """Only q's output reaches the loss: k still gets a (zero) gradient, q the right one."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 64, device=dev)
    q = testing.randn(5, 2, 64, device=dev).requires_grad_(True)
    k = testing.randn(5, 2, 64, device=dev).requires_grad_(True)
    qo, _ = fastenc.ops.rope(q, k, cos, sin, backend=backend)
    g = testing.randn(5, 2, 64, device=dev)
    qo.backward(g)
    pos = torch.arange(5, device=dev)
    testing.assert_close(q.grad, rope_bwd_ref(g, g[:, :0], cos, sin, pos)[0], name="dq")
    assert k.grad is None or bool((k.grad == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_backward_misaligned(backend):
    """Head dim 1001 (rotary 1000) on storage-offset-1 views: no vector path may assume alignment."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(1000, 8, device=dev)
    q = testing.randn(3 * 2 * 1001 + 1, device=dev)[1:].view(3, 2, 1001)
    k = testing.randn(3 * 1001 + 1, device=dev)[1:].view(3, 1, 1001)
    assert q.storage_offset() == 1 and k.storage_offset() == 1
    grads = (testing.randn(3, 2, 1001, device=dev), testing.randn(3, 1, 1001, device=dev))
    _check(backend, q, k, cos, sin, grads, torch.arange(3, device=dev))


def test_rope_bwd_reference_matches_autograd():
    cos, sin = rope_cache(48, 32, 10000.0)
    cos, sin = cos.double(), sin.double()
    pos = torch.tensor([3, 0, 31, 7, 7])
    q = testing.randn(5, 3, 64).double().requires_grad_(True)
    k = testing.randn(5, 1, 64).double().requires_grad_(True)
    gq, gk = testing.randn(5, 3, 64).double(), testing.randn(5, 1, 64).double()
    qo, ko = rope_ref(q, k, cos, sin, pos, upcast=False)
    torch.autograd.backward([qo, ko], [gq, gk])
    dq, dk = rope_bwd_ref(gq, gk, cos, sin, pos, upcast=False)
    torch.testing.assert_close(dq, q.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dk, k.grad, rtol=1e-12, atol=1e-12)


class _RopeRef(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, pos):
        ctx.save_for_backward(cos, sin, pos)
        return rope_ref(q, k, cos, sin, pos, upcast=False)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin, pos = ctx.saved_tensors
        dq, dk = rope_bwd_ref(gq, gk, cos, sin, pos, upcast=False)
        return dq, dk, None, None, None


def test_rope_bwd_reference_gradcheck():
    cos, sin = rope_cache(8, 6, 10000.0)
    cos, sin = cos.double(), sin.double()
    pos = torch.tensor([5, 0, 2, 2])
    q = testing.randn(4, 2, 10).double().requires_grad_(True)
    k = testing.randn(4, 1, 10).double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, k: _RopeRef.apply(q, k, cos, sin, pos), (q, k))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("reference", "cpu")])
def test_rope_opcheck_autograd(backend):
    cos, sin = rope_cache(64, 32, 160000.0)
    pos = torch.tensor([4, 0, 31, 2, 2], dtype=torch.int32)
    q = testing.randn(5, 3, 64).requires_grad_(True)
    k = testing.randn(5, 1, 64).requires_grad_(True)
    torch.library.opcheck(torch.ops.fastenc.rope.default, (q, k, cos, sin, pos, backend))
    torch.library.opcheck(torch.ops.fastenc.rope_bwd.default,
                          (testing.randn(5, 3, 64), testing.randn(5, 1, 64), cos, sin, pos, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_backward_bad_gradient(backend):
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 32, device=dev)
    q = testing.randn(5, 3, 64, device=dev).requires_grad_(True)
    qo, ko = fastenc.ops.rope(q, testing.randn(5, 1, 64, device=dev), cos, sin, backend=backend)
    with pytest.raises(RuntimeError, match="shape"):
        qo.backward(testing.randn(5, 3, 63, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_bwd_op_bad_gradients(backend):
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 32, device=dev)
    pos = torch.arange(5, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=r"rope: grad_q and grad_k must be .*\(5, 3, 64\).*\(5, 1, 63\)"):
        torch.ops.fastenc.rope_bwd(testing.randn(5, 3, 64, device=dev), testing.randn(5, 1, 63, device=dev), cos, sin,
                                   pos, backend)
    with pytest.raises(ValueError, match="torch.float16"):
        torch.ops.fastenc.rope_bwd(testing.randn(5, 3, 64, device=dev),
                                   testing.randn(5, 1, 64, dtype=torch.float16, device=dev), cos, sin, pos, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_backward_fused_qkv_views(backend):
    """q and k sliced out of one fused (tokens, 3, heads, dim) projection, and their output gradients out of one
    (tokens, 3, heads, dim) buffer (attention's fused gradient): token-strided views (the cpu kernel reads them in
    place); odd head dim 65 with rotary 64, 19 tokens in two sequences. The gradient reaches the fused buffer."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 32, device=dev)
    cu = torch.tensor([0, 7, 19], dtype=torch.int32, device=dev)
    qkv = testing.randn(19, 3, 3, 65, device=dev).requires_grad_(True)
    q, k, v = qkv.unbind(1)
    assert not (q.is_contiguous() or k.is_contiguous())
    qo, ko = fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu, backend=backend)
    pos = positions_from_cu_seqlens(cu, 19)
    ref = rope_ref(q.detach().contiguous(), k.detach().contiguous(), cos, sin, pos)
    testing.assert_close(qo, ref[0], name="q")
    testing.assert_close(ko, ref[1], name="k")
    fused = testing.randn(19, 3, 3, 65, device=dev)
    gq, gk, gv = fused.unbind(1)
    torch.autograd.backward([qo, ko, v], [gq, gk, gv])
    want = rope_bwd_ref(gq.contiguous(), gk.contiguous(), cos, sin, pos)
    testing.assert_close(qkv.grad[:, 0], want[0], name="dq")
    testing.assert_close(qkv.grad[:, 1], want[1], name="dk")
    assert torch.equal(qkv.grad[:, 2], gv)
