"""rope: rotate-half rotary embedding of q and k, every backend against the fp32 reference and transformers."""
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.ops.rope import positions_from_cu_seqlens
from fastenc.reference import rope_cache, rope_ref

OP = "rope"
BACKENDS = testing.backends_for(OP)
# (batch, seq, heads_q, heads_k, head_dim, rotary_dim): ModernBERT heads (64), GQA, odd lengths, head dim 80
# (not a power of two), partial rotary.
SHAPES = [(1, 1, 3, 3, 64, 64), (2, 17, 4, 2, 64, 64), (1, 33, 2, 2, 80, 80), (2, 9, 3, 1, 64, 32)]


def _rope_id(s):
    b, n, hq, hk, d, r = s
    return f"{b}x{n}x{hq}/{hk}x{d}" + (f"r{r}" if r != d else "")


def _flat_positions(q, position_ids, cu_seqlens):
    if cu_seqlens is not None:
        return positions_from_cu_seqlens(cu_seqlens, q.shape[0])
    if position_ids is not None:
        if q.dim() == 4 and position_ids.dim() == 1:
            position_ids = position_ids.expand(q.shape[0], -1)
        return position_ids.reshape(-1)
    seq = q.shape[1] if q.dim() == 4 else q.shape[0]
    return torch.arange(seq, device=q.device).repeat(q.shape[0] if q.dim() == 4 else 1)


def _check(backend, q, k, cos, sin, position_ids=None, cu_seqlens=None):
    qo, ko = fastenc.ops.rope(q, k, cos, sin, position_ids=position_ids, cu_seqlens=cu_seqlens, backend=backend)
    pos = _flat_positions(q, position_ids, cu_seqlens)
    d = q.shape[-1]
    q3, k3 = q.reshape(-1, q.shape[-2], d), k.reshape(-1, k.shape[-2], d)
    ref = rope_ref(q3, k3, cos, sin, pos)
    lowp = rope_ref(q3, k3, cos, sin, pos, upcast=False) if q.dtype != torch.float32 else (None, None)
    for name, o, x, r, lp in zip(("q", "k"), (qo, ko), (q, k), ref, lowp):
        assert o.shape == x.shape and o.dtype == x.dtype
        testing.assert_close(o.reshape(r.shape), r, lp, extra=testing.interpreter_extra(backend, x.dtype, r), name=name)


# ModernBERT's two thetas: 10000 (local layers) with the 4-D layout, 160000 (global) with packed tokens; the
# position_ids and transformers tests below cover the other pairings.
def _qk(backend, dtype=torch.float32, heads=2, head_dim=64):
    """The call a case makes, described for the registry: packed q (tokens, heads, head_dim) on the test device."""
    return {"q": testing.fake(9, heads, head_dim, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, ((be, dt, sh, theta, layout) for be, dt, sh, (theta, layout) in itertools.product(
                          BACKENDS, testing.DTYPES, SHAPES, ((10000.0, "bshd"), (160000.0, "packed")))),
                      lambda be, dt, sh, theta, layout: _qk(be, dt, sh[2], sh[4]),
                      ids=lambda be, dt, sh, theta, layout: f"{be}-{testing.dtype_id(dt)}-{_rope_id(sh)}-"
                                                            f"theta{int(theta)}-{layout}")
FP32 = testing.backend_cases(OP, _qk)
FP32_FP16 = testing.dtype_cases(OP, (torch.float32, torch.float16), _qk)


@pytest.mark.parametrize("backend,dtype,shape,theta,layout", CASES)
def test_rope(backend, dtype, shape, theta, layout):
    """4-D layout with default positions (0..seq-1 per row) or packed tokens with cu_seqlens."""
    dev = testing.device_for(backend)
    b, n, hq, hk, d, rot = shape
    cos, sin = rope_cache(rot, 256, theta, device=dev)
    q = testing.randn(b, n, hq, d, dtype=dtype, device=dev)
    k = testing.randn(b, n, hk, d, dtype=dtype, device=dev)
    if layout == "bshd":
        _check(backend, q, k, cos, sin)
    else:
        lengths = [n, max(1, n // 2), 1][: b + 1]
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
        total = int(cu[-1])
        _check(backend, testing.randn(total, hq, d, dtype=dtype, device=dev),
               testing.randn(total, hk, d, dtype=dtype, device=dev), cos, sin, cu_seqlens=cu)


@pytest.mark.parametrize("backend,dtype", FP32_FP16)
def test_rope_position_ids(backend, dtype):
    """Explicit positions: per-row (batch, seq), shared (seq,), packed (tokens,), int32 and int64, up to P-1."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 512, 160000.0, device=dev)
    q, k = testing.randn(2, 7, 3, 64, dtype=dtype, device=dev), testing.randn(2, 7, 1, 64, dtype=dtype, device=dev)
    pid = torch.randint(0, 512, (2, 7), device=dev)
    pid[0, 0] = 511
    _check(backend, q, k, cos, sin, position_ids=pid)
    _check(backend, q, k, cos, sin, position_ids=torch.arange(100, 107, dtype=torch.int32, device=dev))
    _check(backend, q[0], k[0], cos, sin, position_ids=pid[1].to(torch.int32))


@pytest.mark.parametrize("backend", FP32)
def test_rope_non_contiguous(backend):
    """q and k as views into a fused QKV projection (strided, not contiguous)."""
    dev = testing.device_for(backend)
    qkv = testing.randn(2, 9, 3, 4, 64, device=dev)
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    assert not (q.is_contiguous() or k.is_contiguous())
    cos, sin = rope_cache(64, 64, 10000.0, device=dev)
    _check(backend, q, k, cos, sin)
    _check(backend, q.reshape(18, 4, 64)[::2], k.reshape(18, 4, 64)[::2], cos, sin)


@pytest.mark.parametrize("backend", FP32)
def test_rope_empty(backend):
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 16, device=dev)
    for shape in [(0, 4, 64), (2, 0, 4, 64)]:
        qo, ko = fastenc.ops.rope(torch.empty(shape, device=dev), torch.empty(shape, device=dev), cos, sin,
                                  backend=backend)
        assert qo.shape == shape and ko.shape == shape


@pytest.mark.parametrize("backend,dtype", FP32_FP16)
@pytest.mark.parametrize("theta,layer_type", [(160000.0, "full_attention"), (10000.0, "sliding_attention")])
def test_rope_matches_transformers(backend, theta, layer_type, dtype):
    """Same result as ModernBERT's rotary embedding + transformers' apply_rotary_pos_emb (global and local theta)."""
    from transformers import ModernBertConfig
    from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding, apply_rotary_pos_emb

    cfg = ModernBertConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=3, intermediate_size=64)
    assert cfg.rope_parameters[layer_type]["rope_theta"] == theta
    b, n, h, d = 2, 19, 4, 64
    q, k = testing.randn(b, n, h, d, dtype=dtype), testing.randn(b, n, h, d, dtype=dtype)
    pid = torch.arange(n)[None].expand(b, -1)
    hf_cos, hf_sin = ModernBertRotaryEmbedding(cfg)(q.float(), pid, layer_type)  # fp32 tables
    # transformers' layout is (batch, heads, seq, dim); unsqueeze_dim=1 broadcasts cos over heads.
    hq, hk = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), hf_cos, hf_sin, unsqueeze_dim=1)
    cos, sin = rope_cache(d, 64, theta)
    torch.testing.assert_close(cos[:n], hf_cos[0, :, : d // 2].float(), rtol=0, atol=1e-6)
    dev = testing.device_for(backend)
    qo, ko = fastenc.ops.rope(q.to(dev), k.to(dev), cos.to(dev), sin.to(dev), position_ids=pid.to(dev),
                              backend=backend)
    ref = rope_ref(q.reshape(-1, h, d), k.reshape(-1, h, d), cos, sin, pid.reshape(-1))
    for o, hf, r in ((qo, hq, ref[0]), (ko, hk, ref[1])):
        hf = hf.transpose(1, 2)
        # both round once from fp32: equal up to one rounding of the output dtype (+ fp32 noise)
        testing.assert_close(o.cpu(), hf.float(), None, dtype=torch.float32,
                             extra=0.0 if dtype == torch.float32 else 2 * float(hf.float().abs().max()) * 2.0 ** -11
                             + testing.interpreter_extra(backend, dtype, r))


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
@pytest.mark.parametrize("dtype", testing.DTYPES, ids=testing.dtype_id)
def test_triton_writes_every_element(dtype):
    """Outputs poisoned with NaN before the launch (partial rotary, GQA): an unwritten element fails."""
    from fastenc.kernels.rope import rope_fwd

    dev = testing.device_for("triton")
    q, k = testing.randn(5, 3, 80, dtype=dtype, device=dev), testing.randn(5, 1, 80, dtype=dtype, device=dev)
    cos, sin = rope_cache(48, 16, device=dev)
    pos = torch.tensor([3, 0, 15, 7, 7], dtype=torch.int32, device=dev)
    qo, ko = testing.poison(torch.empty_like(q)), testing.poison(torch.empty_like(k))
    rope_fwd(q, k, cos, sin, pos, q_out=qo, k_out=ko)
    ref = rope_ref(q, k, cos, sin, pos)
    lowp = rope_ref(q, k, cos, sin, pos, upcast=False) if dtype != torch.float32 else (None, None)
    testing.assert_close(qo, ref[0], lowp[0], extra=testing.interpreter_extra("triton", dtype, ref[0]), name="q")
    testing.assert_close(ko, ref[1], lowp[1], extra=testing.interpreter_extra("triton", dtype, ref[1]), name="k")


def _count_host_reads(fn):
    """Run fn, counting tensor-to-host scalar reads (aten._local_scalar_dense: a device sync on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


@pytest.mark.parametrize("backend", [p for p in FP32 if p.values[0] in ("cpu", "cuda")])
def test_rope_reads_no_positions_on_host(backend):
    """int32 position_ids are range-checked by the kernels where they read them, not read back on every call (int64
    ones too on a GPU; on CPU they are range-checked on the host before narrowing, which costs no sync); cu_seqlens
    is read once per forward (the same tensor for every layer)."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 64, device=dev)
    q, k = testing.randn(2, 9, 2, 64, device=dev), testing.randn(2, 9, 2, 64, device=dev)
    pid = torch.randint(0, 64, (2, 9), device=dev)
    assert _count_host_reads(lambda: fastenc.ops.rope(q, k, cos, sin, position_ids=pid.int(), backend=backend)) == 0
    if dev != "cpu":
        assert _count_host_reads(lambda: fastenc.ops.rope(q, k, cos, sin, position_ids=pid, backend=backend)) == 0
    cu = torch.tensor([0, 9, 18], dtype=torch.int32, device=dev)
    q3, k3 = q.reshape(18, 2, 64), k.reshape(18, 2, 64)
    fastenc.ops.rope(q3, k3, cos, sin, cu_seqlens=cu, backend=backend)  # first layer: validated
    assert _count_host_reads(lambda: fastenc.ops.rope(q3, k3, cos, sin, cu_seqlens=cu, backend=backend)) == 0


@pytest.mark.parametrize("backend", [p for p in FP32 if p.values[0] != "cuda"])
def test_rope_positions_out_of_range_raise_on_cpu(backend):
    """On CPU a position outside [0, P) raises naming the table; int64 values past 2**31 are not narrowed into range."""
    cos, sin = rope_cache(64, 16)
    q, k = testing.randn(1, 3, 2, 64), testing.randn(1, 3, 2, 64)
    for bad in ([0, 16, 1], [0, -1, 2], [2**32 + 1, 0, 0], [2**31, 1, 1], [-(2**32) + 3, 0, 0]):
        pid = torch.tensor([bad], dtype=torch.int64)
        with pytest.raises(ValueError, match=r"rope: positions .* must be in \[0, 16\)"):
            fastenc.ops.rope(q, k, cos, sin, position_ids=pid, backend=backend)
    with pytest.raises(ValueError, match=r"must be in \[0, 16\)"):
        fastenc.ops.rope(q, k, cos, sin, position_ids=torch.tensor([[0, 16, 1]], dtype=torch.int32), backend=backend)


@pytest.mark.parametrize("backend", [p for p in FP32 if p.values[0] != "cuda"])
def test_rope_cu_seqlens_changed_in_place_after_validation(backend):
    """cu_seqlens edited through numpy (no version bump) after a call: the next call sees the new values (checked
    on the host every call, and the positions again where the kernels read them), so the table is never read
    out of bounds."""
    cos, sin = rope_cache(64, 10)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    q, k = testing.randn(16, 2, 64), testing.randn(16, 1, 64)
    fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu, backend=backend)
    cu.numpy()[1] = 0  # one sequence of 16 > the 10-row table
    with pytest.raises(ValueError, match=r"must be in \[0, 10\)|longest sequence 16 exceeds the cos/sin table"):
        fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu, backend=backend)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not available")
def test_cpu_rope_kernel_checks_positions():
    """The C++ kernel itself (called directly, no Python-side checks) rejects a position outside the table."""
    from fastenc import extension

    cos, sin = rope_cache(64, 10)
    q, k = testing.randn(3, 2, 64), testing.randn(3, 1, 64)
    for bad in (10, -1, 2**31 - 1):
        pos = torch.tensor([0, bad, 1], dtype=torch.int32)
        with pytest.raises(ValueError, match=r"must be in \[0, 10\) \(the cos/sin table\); 1 of 3 tokens are outside"):
            extension.load().rope(q, k, cos, sin, pos)
        with pytest.raises(ValueError, match=r"must be in \[0, 10\)"):
            extension.load().rope_bwd(q, k, cos, sin, pos)


@pytest.mark.parametrize("backend", FP32)
def test_rope_position_ids_broadcast_batch(backend):
    """position_ids of shape (1, seq) broadcast over the batch, as transformers does."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(64, 64, device=dev)
    q, k = testing.randn(3, 7, 2, 64, device=dev), testing.randn(3, 7, 1, 64, device=dev)
    pid = torch.randint(0, 64, (1, 7), device=dev)
    got = fastenc.ops.rope(q, k, cos, sin, position_ids=pid, backend=backend)
    want = fastenc.ops.rope(q, k, cos, sin, position_ids=pid.expand(3, -1).contiguous(), backend=backend)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    _check(backend, q, k, cos, sin, position_ids=pid.expand(3, -1))
    with pytest.raises(ValueError, match=r"position_ids must have shape \(3, 7\), \(1, seq\) or \(seq,\)"):
        fastenc.ops.rope(q, k, cos, sin, position_ids=pid.expand(2, -1), backend=backend)


def test_rope_position_ids_on_meta():
    cos, sin = rope_cache(64, 64)
    q, k = testing.randn(1, 7, 2, 64), testing.randn(1, 7, 2, 64)
    with pytest.raises(ValueError, match="rope: position_ids must be on q's device cpu, got a meta tensor"):
        fastenc.ops.rope(q, k, cos, sin, position_ids=torch.zeros(1, 7, dtype=torch.int64, device="meta"))


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _qk))
def test_rope_misaligned(backend, dtype):
    """Head dim 1001 (rotary 1000 + one passed through) on storage-offset-1 views: no aligned-vector assumption."""
    dev = testing.device_for(backend)
    cos, sin = rope_cache(1000, 8, device=dev)
    q = testing.randn(3 * 2 * 1001 + 1, dtype=dtype, device=dev)[1:].view(3, 2, 1001)
    k = testing.randn(3 * 1001 + 1, dtype=dtype, device=dev)[1:].view(3, 1, 1001)
    assert q.storage_offset() == 1 and k.storage_offset() == 1
    _check(backend, q, k, cos, sin, position_ids=torch.tensor([7, 0, 3], device=dev))
    cos2, sin2 = rope_cache(64, 16, device=dev)
    q2 = testing.randn(5 * 64 + 1, dtype=dtype, device=dev)[1:].view(5, 1, 64)
    _check(backend, q2, q2, cos2, sin2)


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not runnable here")
def test_triton_rope_kernel_masks_out_of_table_positions(monkeypatch):
    """The GPU contract, checked on the Triton kernel itself (the CPU host check bypassed): a position outside the
    table never reads it, that token's rows come out NaN, every other token is right."""
    import fastenc.reference.rope as rope_reference
    from fastenc.kernels.rope import rope_fwd

    monkeypatch.setattr(rope_reference, "check_positions", lambda positions, rows: None)
    dev = testing.device_for("triton")
    cos, sin = rope_cache(64, 8, device=dev)
    q, k = testing.randn(4, 2, 64, device=dev), testing.randn(4, 1, 64, device=dev)
    pos = torch.tensor([1, 8, -3, 7], dtype=torch.int32, device=dev)
    qo, ko = rope_fwd(q, k, cos, sin, pos)
    good = torch.tensor([0, 3])
    ref = rope_ref(q[good], k[good], cos, sin, pos[good])
    testing.assert_close(qo[good], ref[0], name="q")
    testing.assert_close(ko[good], ref[1], name="k")
    assert bool(qo[1:3].isnan().all()) and bool(ko[1:3].isnan().all())
