"""attention with a distance-indexed bias (MPNet's relative-position buckets, ALiBi): the buckets and the sign
convention against transformers' MPNet, every backend that serves it against the reference under the tolerance
rule (forward and gradients of q, k, v, the table and the slopes) over odd lengths, head dims, windows, packed and
padded batches and a cu_seqlens changed between calls; gradcheck (fp64) of the reference formulas; a deterministic
table gradient; a lookup too short for cu_seqlens refused by the kernels; backends without the bias declaring it;
bad arguments."""
import pytest
import torch

from fastenc import extension, ops, registry, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.attention_bias import bias_matrix, distance_bias, relative_position_bucket
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref, attention_lse_varlen_ref

OP = "attention"
INTERP = registry.interpreter_on() and not torch.cuda.is_available()


def _bias_inputs(backend, dtype=torch.float32, head_dim=64):
    dev = testing.device_for(backend)
    return {"q": testing.fake(17, 2, head_dim, dtype=dtype, device=dev),
            "bias": testing.fake(2, 33, device=dev)}


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _params(heads):
    """(relative_bias, alibi_slopes) for a kind: 'table', 'alibi' or 'both' (fresh random values)."""
    def make(kind):
        table = testing.randn(32, heads) if kind in ("table", "both") else None
        slopes = testing.randn(heads).abs() * 0.2 if kind in ("alibi", "both") else None
        return table, slopes
    return make


def test_buckets_match_transformers_mpnet():
    mpnet = pytest.importorskip("transformers.models.mpnet.modeling_mpnet")
    rel = torch.arange(-700, 701)[None, :] - torch.arange(0, 3)[:, None]
    for nb, md in ((32, 128), (16, 20), (8, 9)):
        want = mpnet.MPNetEncoder.relative_position_bucket(rel, num_buckets=nb, max_distance=md)
        assert torch.equal(relative_position_bucket(rel, nb, md), want)


def test_reference_matches_mpnet_position_bias():
    """The bias of transformers' MPNetEncoder.compute_position_bias (memory - context), added to the scaled scores."""
    mpnet = pytest.importorskip("transformers.models.mpnet.modeling_mpnet")
    from transformers import MPNetConfig
    b, s, h, d = 2, 37, 3, 16
    enc = mpnet.MPNetEncoder(MPNetConfig(hidden_size=h * d, num_attention_heads=h, num_hidden_layers=1,
                                         intermediate_size=8))
    table = testing.randn(32, h)
    enc.relative_attention_bias.weight.data.copy_(table)
    x = testing.randn(b, s, h * d)
    with torch.no_grad():
        hf_bias = enc.compute_position_bias(x)  # (b, h, s, s)
    assert torch.equal(bias_matrix(distance_bias(s, table), s)[None].expand_as(hf_bias), hf_bias)
    q, k, v = (testing.randn(b, s, h, d) for _ in range(3))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d ** 0.5 + hf_bias
    want = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
    for backend in testing.backends_for(OP, device="cpu"):
        if testing.cannot_serve(OP, backend, _bias_inputs(backend, head_dim=d)):
            continue
        testing.assert_close(ops.attention(q, k, v, relative_bias=table, backend=backend), want, name=backend)


# (id, lengths, heads, head_dim, window, kind)
CASES = [
    ("s1", (1,), 2, 16, None, "table"),
    ("s17", (17,), 3, 64, None, "both"),
    ("s129-varlen", (129, 1, 0, 5), 2, 32, None, "table"),
    ("s513", (513,), 2, 8, None, "alibi"),
    ("s513-win", (513, 17), 2, 16, (64, 64), "table"),
    ("win-asym-d125", (40, 33, 1), 3, 125, (7, 0), "both"),
    ("win-0-d33", (20, 0, 3), 2, 33, (0, 0), "alibi"),
    ("s129-d128", (129,), 2, 128, (20, 4), "table"),
]


def _cases():
    out = []
    for be in testing.backends_for(OP):
        small = be == "triton" and INTERP  # interpreter time: short sequences; its bf16 tl.dot is wrong
        for dt in ((torch.float32, torch.float16) if small else testing.DTYPES):
            for c in CASES:
                if not small or max(c[1]) <= 129:
                    out.append((be, dt) + c)
    return testing.cases(OP, out, lambda be, dt, *c: _bias_inputs(be, dt, c[3]),
                         ids=lambda be, dt, name, *c: f"{be}-{testing.dtype_id(dt)}-{name}")


def _grads(backend, q, k, v, g, table, slopes, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    extra = [None if t is None else t.detach().clone().requires_grad_(True) for t in (table, slopes)]
    out = ops.attention(*leaves, relative_bias=extra[0], alibi_slopes=extra[1], backend=backend, **kw)
    out.backward(g)
    return out, [t.grad for t in leaves], [None if t is None else t.grad for t in extra]


def _lowp_refs(g, q, k, v, cu, window, scale, lut):
    """The reference in the inputs' low precision: out, dq, dk, dv, dlut (explicit formulas, upcast=False)."""
    out = attention_varlen_ref(q, k, v, cu, window, scale, upcast=False, bias=lut)
    lse = attention_lse_varlen_ref(q.float(), k.float(), cu, window, scale, bias=lut)
    return out, attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, window, scale, upcast=False, bias=lut)


@pytest.mark.parametrize("backend,dtype,name,lens,heads,head_dim,window,kind", _cases())
def test_forward_backward_match_reference(backend, dtype, name, lens, heads, head_dim, window, kind):
    dev = testing.device_for(backend)
    total = sum(lens)
    q, k, v, g = (testing.randn(total, heads, head_dim, dtype=dtype, device=dev) for _ in range(4))
    cu = _cu(lens).to(dev)
    table, slopes = (None if t is None else t.to(dev) for t in _params(heads)(kind))
    out, dqkv, dext = _grads(backend, q, k, v, g, table, slopes, cu_seqlens=cu, window=window)
    f32 = [t.float() for t in (q, k, v, g)]
    r_out, r_dqkv, r_dext = _grads("reference", *f32, table, slopes, cu_seqlens=cu, window=window)
    lowp = (None,) * 6
    if dtype != torch.float32:
        w = (-1, -1) if window is None else window
        leaves = [None if t is None else t.clone().requires_grad_(True) for t in (table, slopes)]
        lut = distance_bias(max(lens), leaves[0], 128, leaves[1])
        lo_out, (ldq, ldk, ldv, dlut) = _lowp_refs(g, q, k, v, cu, w, head_dim ** -0.5, lut.detach())
        lut.backward(dlut.float())
        lowp = (lo_out, ldq, ldk, ldv) + tuple(None if t is None else t.grad for t in leaves)
    got_all, ref_all = [out] + dqkv + dext, [r_out] + r_dqkv + r_dext
    for nm, got, ref, lp in zip(("out", "dq", "dk", "dv", "dtable", "dslopes"), got_all, ref_all, lowp):
        if ref is None:
            continue
        assert got.dtype == (dtype if nm in ("out", "dq", "dk", "dv") else torch.float32)
        testing.assert_close(got, ref, lp, dtype=dtype, name=nm)


@pytest.mark.parametrize("backend", testing.backend_cases(OP, _bias_inputs))
def test_padded_with_mask_and_changed_cu_seqlens(backend):
    """Padded rows (right-, left-padded, one token, empty) against the padded reference; then the packed layout with
    one cu_seqlens buffer rewritten between calls."""
    dev = testing.device_for(backend)
    b, s, h, d = 4, 33, 2, 24
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i, (a, e) in enumerate([(0, 33), (5, 33), (7, 8), (0, 0)]):
        mask[i, a:e] = True
    mask = mask.to(dev)
    q, k, v = (testing.randn(b, s, h, d, device=dev) for _ in range(3))
    table, slopes = _params(h)("both")
    out = ops.attention(q, k, v, key_padding_mask=mask, relative_bias=table, alibi_slopes=slopes, backend=backend)
    ref = attention_ref(q, k, v, mask, bias=distance_bias(s, table, 128, slopes))
    testing.assert_close(out, ref)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    holes = mask.clone()
    holes[0, 10] = False
    holes[1, 20:23] = False
    # A mask with holes: distances stay padded positions (transformers' MPNet builds them from arange(seq)), passed
    # to the kernels as per-token positions; a backend without them says so.
    if testing.cannot_serve(OP, backend, dict(_bias_inputs(backend), positions=torch.zeros(17, dtype=torch.int32))):
        with pytest.raises(ValueError, match="no positions"):
            ops.attention(q, k, v, key_padding_mask=holes, relative_bias=table, backend=backend)
    else:
        got = ops.attention(q, k, v, key_padding_mask=holes, relative_bias=table, backend=backend)
        testing.assert_close(got, attention_ref(q, k, v, holes, bias=distance_bias(s, table)))
    with pytest.raises(ValueError, match="contiguous run of real tokens"):
        ops.attention(q, k, v, key_padding_mask=holes, relative_bias=table, window=4, backend=backend)

    t = 150
    qp, kp, vp = (testing.randn(t, h, d, device=dev) for _ in range(3))
    cu = _cu((100, 50)).to(dev)
    for lens in ((100, 50), (3, 147), (150, 0)):
        cu.copy_(_cu(lens).to(dev))
        got = ops.attention(qp, kp, vp, cu_seqlens=cu, relative_bias=table, backend=backend)
        testing.assert_close(got, attention_varlen_ref(qp, kp, vp, cu, bias=distance_bias(max(lens), table)))


def _ext():
    if testing.cannot_serve(OP, "cpu", _bias_inputs("cpu")) or "cpu" not in testing.backends_for(OP, "cpu"):
        pytest.skip("the cpu backend is not available")
    return extension.load()


def test_cpu_kernels_refuse_a_lookup_shorter_than_cu_seqlens():
    """The lengths come from cu_seqlens: a lookup that does not reach the longest one is refused, never overread."""
    ext = _ext()
    q, k, v, g = (testing.randn(20, 2, 8) for _ in range(4))
    cu = _cu((5, 15))
    short = testing.randn(2, 2 * 10 - 1)
    with pytest.raises((ValueError, RuntimeError), match="covers sequences up to 10 tokens"):
        ext.attention(q, k, v, cu, 15, -1, -1, 0.3, 0.0, 0, 0, short)
    out, lse = ext.attention(q, k, v, cu, 15, -1, -1, 0.3, 0.0, 0, 0, testing.randn(2, 29))
    with pytest.raises((ValueError, RuntimeError), match="covers sequences up to 10 tokens"):
        ext.attention_bwd(g, q, k, v, out, lse, cu, 15, -1, -1, 0.3, bias=short)
    with pytest.raises(RuntimeError, match="bias must be float32"):
        ext.attention(q, k, v, cu, 15, -1, -1, 0.3, 0.0, 0, 0, testing.randn(2, 30))


def test_cpu_table_gradient_is_deterministic_across_thread_counts():
    _ext()
    lens, h, d = (513, 129, 40), 2, 64
    q, k, v, g = (testing.randn(sum(lens), h, d) for _ in range(4))
    table = testing.randn(32, h)
    before = torch.get_num_threads()
    grads = []
    try:
        for n in (1, 2, 2):
            torch.set_num_threads(n)
            grads.append(_grads("cpu", q, k, v, g, table, None, cu_seqlens=_cu(lens))[2][0])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[1], grads[2])


class _ExplicitBiasedAttention(torch.autograd.Function):
    """The reference forward with the reference's explicit backward (dq, dk, dv, dlut) as its derivative."""

    @staticmethod
    def forward(ctx, q, k, v, lut, cu, window, scale):
        out = attention_varlen_ref(q, k, v, cu, window, scale, upcast=False, bias=lut)
        lse = attention_lse_varlen_ref(q, k, cu, window, scale, bias=lut)
        ctx.save_for_backward(q, k, v, lut, out, lse, cu)
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, lut, out, lse, cu = ctx.saved_tensors
        grads = attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, ctx.window, ctx.scale, bias=lut)
        return (*grads, None, None, None)


@pytest.mark.parametrize("window", [(-1, -1), (1, 2)])
def test_reference_backward_gradcheck_fp64(window):
    cu = _cu((5, 0, 1, 4))
    q, k, v = (testing.randn(10, 2, 4, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    table = testing.randn(8, 2, dtype=torch.float64).requires_grad_(True)
    slopes = testing.randn(2, dtype=torch.float64).abs().requires_grad_(True)

    def f(a, b, c, t, s):
        return _ExplicitBiasedAttention.apply(a, b, c, distance_bias(5, t, 6, s), cu, window, 0.7)
    assert torch.autograd.gradcheck(f, (q, k, v, table, slopes))


@pytest.mark.parametrize("op", [OP, "attention_bwd"])
def test_a_backend_without_the_bias_declares_it(monkeypatch, op):
    """Every backend serves the bias today; one that does not adds no_bias to its check: an explicit forward choice
    then raises naming the reason, automatic selection (and the backward's choice) passes it over, saying why:
    never a silent drop of the bias."""
    import dataclasses

    from fastenc.ops._attention_bwd import no_bias
    assert no_bias({"bias": None}) == []
    for backend in registry.impls(op):
        assert "a distance bias" not in " ".join(testing.cannot_serve(op, backend, _bias_inputs(backend, torch.float16)))
    impl = registry.impl(op, "reference")
    old = impl.check
    monkeypatch.setitem(registry._REGISTRY[op], "reference", dataclasses.replace(
        impl, check=lambda inputs: (old(inputs) if old else []) + no_bias(inputs)))
    q = testing.randn(9, 2, 8, seed=3).requires_grad_(op == "attention_bwd")
    kw = dict(cu_seqlens=_cu((9,)), relative_bias=testing.randn(32, 2))
    if op == OP:
        with pytest.raises(ValueError, match="reference: a distance bias .* is not supported"):
            ops.attention(q, q, q, backend="reference", **kw)
        assert ops.attention(q, q, q, **kw).shape == q.shape
    elif [b for b in testing.backends_for(op, "cpu") if b != "reference"]:
        # the backward of an explicit forward backend goes to one that serves the bias, saying why
        with pytest.warns(RuntimeWarning, match="not reference: a distance bias .* is not supported"):
            ops.attention(q, q, q, backend="reference", **kw).sum().backward()
        assert q.grad is not None


def test_bad_bias_arguments_name_the_argument():
    q = testing.randn(2, 9, 3, 8)
    bad = [
        (dict(relative_bias=testing.randn(32, 3).double()), TypeError, "relative_bias must be a float32 tensor"),
        (dict(relative_bias=testing.randn(32, 2)), ValueError, r"relative_bias must be \(num_buckets, heads=3\)"),
        (dict(relative_bias=testing.randn(7, 3)), ValueError, "even number of buckets >= 4, got 7"),
        (dict(relative_bias=testing.randn(32, 3), relative_max_distance=8), ValueError,
         "relative_max_distance must be an int > num_buckets // 4 = 8"),
        (dict(alibi_slopes=testing.randn(3, 1)), ValueError, r"alibi_slopes must be \(heads=3,\)"),
        (dict(alibi_slopes=[1.0, 2.0, 3.0]), TypeError, "alibi_slopes must be a float32 tensor"),
    ]
    for kw, err, match in bad:
        with pytest.raises(err, match=match):
            ops.attention(q, q, q, backend="reference", **kw)


def test_bias_under_opcheck():
    """The biased forward and its backward op pass torch.library's checks (schema, fake, autograd registration)."""
    q, k, v = (testing.randn(11, 2, 8).requires_grad_(True) for _ in range(3))
    lut = distance_bias(7, testing.randn(32, 2)).requires_grad_(True)
    cu = _cu((7, 4))
    backend = "cpu" if "cpu" in testing.backends_for(OP, "cpu") else "reference"
    torch.library.opcheck(torch.ops.fastenc.attention.default,
                          (q, k, v, cu, 7, -1, -1, 0.3, backend, 0.0, 0, 0, lut))
    out, lse = torch.ops.fastenc.attention.default(q, k, v, cu, 7, -1, -1, 0.3, backend, 0.0, 0, 0, lut)
    g = testing.randn(11, 2, 8)
    for need_dq, need_dkdv in ((True, True), (False, True), (True, False)):
        torch.library.opcheck(torch.ops.fastenc.attention_bwd_bias.default,
                              (g, q.detach(), k.detach(), v.detach(), out.detach(), lse, cu, 7, -1, -1, 0.3, backend,
                               0.0, 0, 0, need_dq, need_dkdv, lut.detach()))


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _bias_inputs(b, head_dim=24)))
@pytest.mark.parametrize("window", [None, (5, 9)], ids=["nowindow", "w5_9"])
def test_attention_qkv_with_bias_matches_attention(backend, window):
    """attention_qkv reads q, k, v from one buffer: the same output and gradients (d qkv, the table's, the
    slopes') as fastenc.ops.attention on its three column blocks."""
    dev = testing.device_for(backend)
    lens, h, d = (17, 1, 40), 3, 24
    t = sum(lens)
    cu = _cu(lens).to(dev)
    qkv, g = testing.randn(t, 3 * h * d, device=dev), testing.randn(t, h, d, device=dev)
    table, slopes = (x.to(dev) for x in _params(h)("both"))
    res = []
    for fused in (True, False):
        x = qkv.clone().requires_grad_(True)
        tb, sl = table.clone().requires_grad_(True), slopes.clone().requires_grad_(True)
        kw = dict(cu_seqlens=cu, window=window, relative_bias=tb, alibi_slopes=sl)
        if fused:
            out = ops.attention_qkv(x, h, backend=backend, **kw)
        else:
            out = ops.attention(*x.view(t, 3, h, d).unbind(1), backend=backend, **kw)
        out.backward(g)
        res.append((out, x.grad, tb.grad, sl.grad))
    for name, a, b in zip(("out", "dqkv", "dtable", "dslopes"), *res):
        testing.assert_close(a, b, name=name)


def test_bias_under_torch_compile_fullgraph():
    """The lookup is built inside the traced graph; a cu_seqlens with a longer sequence on the second call is
    served (the lookup follows it), and the table / slopes get their gradients."""
    backend = "cpu" if "cpu" in testing.backends_for(OP, "cpu") else "reference"
    q, k, v = (testing.randn(30, 2, 16).requires_grad_(True) for _ in range(3))
    table, slopes = testing.randn(32, 2).requires_grad_(True), testing.randn(2).abs().requires_grad_(True)

    def f(q, k, v, t, s, cu):
        return ops.attention(q, k, v, cu_seqlens=cu, relative_bias=t, alibi_slopes=s, backend=backend)
    compiled = torch.compile(f, fullgraph=True)
    for lens in ((13, 17), (29, 1)):
        cu = _cu(lens)
        got = compiled(q, k, v, table, slopes, cu)
        want = f(q, k, v, table, slopes, cu)
        testing.assert_close(got, want)
        g = testing.randn(30, 2, 16)
        grads = torch.autograd.grad(got, (q, table, slopes), g)
        wants = torch.autograd.grad(want, (q, table, slopes), g)
        for a, b in zip(grads, wants):
            testing.assert_close(a, b)
