"""attention with per-token positions and DeBERTa-v2/v3's disentangled c2p / p2c terms: the slot function bit-exact
against transformers' make_log_bucket_position / build_relative_position / build_rpos, the op against transformers'
DisentangledSelfAttention, every backend that serves the terms against the reference under the tolerance rule
(forward and gradients of q, k, v, c2p, p2c and the distance table) over odd lengths, head dims, windows, packed,
padded (with holes) batches and a cu_seqlens changed between calls; gradcheck (fp64) of the reference; gradients
deterministic across thread counts; positions and slots out of range refused; backends without the terms declaring
them; bad arguments."""
import pytest
import torch

from fastenc import extension, ops, registry, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.attention_bias import distance_bias
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref, attention_lse_varlen_ref
from fastenc.reference.attention_relative import make_log_bucket_position, relative_slot, slot_lookup

OP = "attention"
INTERP = registry.interpreter_on() and not torch.cuda.is_available()


def _rel_inputs(backend, dtype=torch.float32, head_dim=64, positions=True):
    """What the op passes the registry with the terms (fake tensors on the backend's test device)."""
    dev = testing.device_for(backend)
    q = testing.fake(17, 2, head_dim, dtype=dtype, device=dev)
    return {"q": q, "positions": testing.fake(17, dtype=torch.int32, device=dev) if positions else None,
            "c2p": testing.fake(17, 2, 8, dtype=dtype, device=dev), "p2c": testing.fake(17, 2, 8, dtype=dtype, device=dev),
            "slot": testing.fake(33, dtype=torch.int32, device=dev), "bias": testing.fake(2, 33, device=dev)}


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


# ---- the slot function against transformers -----------------------------------------------------------------------

def test_slot_function_matches_transformers_bit_exactly():
    deb = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    rel = torch.arange(-1500, 1501)
    for buckets, maxpos in ((256, 512), (32, 64), (8, 20), (6, 9)):
        assert torch.equal(make_log_bucket_position(rel, buckets, maxpos),
                           deb.make_log_bucket_position(rel, buckets, maxpos))
    for n, buckets, maxpos, span in ((37, 8, 20, 8), (300, 256, 512, 256), (25, -1, 16, 16), (9, 0, 24, 3)):
        x = torch.zeros(1, n, 4)
        built = deb.build_relative_position(x, x, bucket_size=buckets, max_position=maxpos)  # (1, n, n): q - k
        assert torch.equal(deb.build_rpos(x, x, built, maxpos, buckets), built)
        want_c2p = torch.clamp(built[0] + span, 0, 2 * span - 1)            # transformers' c2p index [i, j]
        want_p2c = torch.clamp(-built[0] + span, 0, 2 * span - 1).t()       # its p2c index [j, i], transposed
        lut = slot_lookup(n, span, buckets, maxpos)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        got = lut.long()[i - j + n - 1]
        assert lut.dtype == torch.int32 and lut.shape == (2 * n - 1,)
        assert torch.equal(got, want_c2p) and torch.equal(got, want_p2c)
        assert torch.equal(relative_slot(i - j, span, buckets, maxpos), want_c2p)


def _deberta_layer(h, d, buckets, maxrel, pos_att_type, share):
    deb = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    from transformers import DebertaV2Config
    cfg = DebertaV2Config(hidden_size=h * d, num_attention_heads=h, num_hidden_layers=1, intermediate_size=8,
                          relative_attention=True, position_buckets=buckets, max_relative_positions=maxrel,
                          max_position_embeddings=64, pos_att_type=pos_att_type, share_att_key=share,
                          attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    cfg._attn_implementation = "eager"
    layer = deb.DisentangledSelfAttention(cfg).eval()
    for p in layer.parameters():
        p.data.copy_(testing.randn(*p.shape, scale=0.3))
    return layer


@pytest.mark.parametrize("buckets,maxrel,pos_att_type,share", [
    (8, 20, ["c2p", "p2c"], True), (-1, 6, ["p2c"], False), (16, 40, ["c2p"], False)],
    ids=["both-buckets-shared", "p2c-nobuckets", "c2p-buckets"])
def test_op_matches_transformers_disentangled_self_attention(buckets, maxrel, pos_att_type, share):
    """transformers' DisentangledSelfAttention (eager) against the op given c2p = (q . pos_key) * scale and
    p2c = (k . pos_query) * scale: the contract's transpose claim, padded with holes in the mask included."""
    b, s, h, d = 3, 23, 2, 8
    layer = _deberta_layer(h, d, buckets, maxrel, pos_att_type, share)
    span = buckets if buckets > 0 else maxrel
    x = testing.randn(b, s, h * d)
    rel_emb = testing.randn(2 * span, h * d)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[1, 17:] = False
    mask[2, 4] = mask[2, 9] = False  # holes: transformers' positions stay arange(seq)
    with torch.no_grad():
        want = layer(x, (mask[:, None, :, None] & mask[:, None, None, :]), rel_embeddings=rel_emb)[0]
        q, k, v = (proj(x).view(b, s, h, d) for proj in (layer.query_proj, layer.key_proj, layer.value_proj))
        pk = layer.key_proj if share else getattr(layer, "pos_key_proj", None)
        pq = layer.query_proj if share else getattr(layer, "pos_query_proj", None)
        scale = (d * (1 + len(pos_att_type))) ** -0.5
        c2p = torch.einsum("bshd,rhd->bshr", q, pk(rel_emb).view(2 * span, h, d)) * scale if "c2p" in pos_att_type else None
        p2c = torch.einsum("bshd,rhd->bshr", k, pq(rel_emb).view(2 * span, h, d)) * scale if "p2c" in pos_att_type else None
        for backend in testing.backends_for(OP, device="cpu"):
            if testing.cannot_serve(OP, backend, _rel_inputs(backend, head_dim=d)):
                continue
            got = ops.attention(q, k, v, key_padding_mask=mask, scale=scale, c2p=c2p, p2c=p2c, rel_span=span,
                                position_buckets=buckets, max_relative_positions=maxrel, backend=backend)
            testing.assert_close(got.reshape(b, s, h * d)[mask], want[mask], name=backend)


# ---- every backend against the reference --------------------------------------------------------------------------

# (id, lengths, heads, head_dim, window, terms, (position_buckets, max_relative_positions) or None, positions)
CASES = [
    ("s1-c2p", (1,), 2, 8, None, "c2p", None, False),
    ("s17-p2c-buckets", (17,), 3, 64, None, "p2c", (8, 20), False),
    ("s17-both-pos-d40", (17, 4), 2, 40, None, "both", None, True),
    ("s129-varlen-bias-buckets-pos", (129, 1, 0, 5), 2, 8, None, "both+bias", (16, 64), True),
    ("s129-win-both-pos-d40", (129, 33), 2, 40, (7, 3), "both", (8, 20), True),
    ("s129-win-asym-c2p-d64", (129,), 1, 64, (0, 5), "c2p", None, False),
    ("s513-win-both-bias-pos", (513,), 2, 8, (64, 64), "both+bias", (32, 256), True),
]


def _cases():
    out = []
    for be in testing.backends_for(OP):
        small = be == "triton" and INTERP  # interpreter time: short sequences; its bf16 tl.dot is wrong
        for dt in ((torch.float32, torch.float16) if small else testing.DTYPES):
            for c in CASES:
                if max(c[1]) > 129 and (small or be == "reference" or dt == torch.float16):
                    continue  # the 513 case: the kernels only, fp32 and bf16 (test time)
                out.append((be, dt) + c)
    return testing.cases(OP, out, lambda be, dt, *c: _rel_inputs(be, dt, c[3], c[7]),
                         ids=lambda be, dt, name, *c: f"{be}-{testing.dtype_id(dt)}-{name}")


def _terms(total, heads, lens, terms, buckets, with_positions, dtype, dev):
    """Fresh inputs of one case: a dict of op keywords (c2p / p2c in `dtype`), the table (or None), and the
    lookups' L."""
    span = buckets[0] if buckets else 6
    kw = dict(rel_span=span)
    if buckets:
        kw.update(position_buckets=buckets[0], max_relative_positions=buckets[1])
    n = max(lens)
    if with_positions:  # beyond the longest sequence: lookups longer than it, repeated positions
        n = max(lens) + 9
        kw["positions"] = torch.randint(0, n, (total,), generator=testing.generator(), dtype=torch.int64).to(dev)
        kw["positions"][0] = n - 1
    if terms in ("c2p", "both", "both+bias"):
        kw["c2p"] = testing.randn(total, heads, 2 * span, dtype=dtype, device=dev)
    if terms in ("p2c", "both", "both+bias"):
        kw["p2c"] = testing.randn(total, heads, 2 * span, dtype=dtype, device=dev)
    table = testing.randn(32, heads, device=dev) if terms == "both+bias" else None
    return kw, table, n


def _grads(backend, q, k, v, g, kw, table, **extra):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    kw = dict(kw)
    rel = {}
    for name in ("c2p", "p2c"):
        if kw.get(name) is not None:
            rel[name] = kw[name] = kw[name].detach().clone().requires_grad_(True)
    tb = None if table is None else table.detach().clone().requires_grad_(True)
    out = ops.attention(*leaves, relative_bias=tb, backend=backend, **kw, **extra)
    out.backward(g)
    return out, [t.grad for t in leaves] + [rel[n].grad if n in rel else None for n in ("c2p", "p2c")] + \
        [None if tb is None else tb.grad]


def _lowp_refs(g, q, k, v, cu, window, kw, table, n):
    """The reference in the inputs' low precision: out, dq, dk, dv, dc2p, dp2c, dtable (explicit formulas)."""
    leaf = None if table is None else table.clone().requires_grad_(True)
    lut = None if leaf is None else distance_bias(n, leaf)
    slot = slot_lookup(n, kw["rel_span"], kw.get("position_buckets", 0), kw.get("max_relative_positions", -1))
    pos = kw.get("positions")
    rel = dict(bias=None if lut is None else lut.detach(), positions=pos, c2p=kw.get("c2p"), p2c=kw.get("p2c"),
               slot=slot)
    scale = q.shape[-1] ** -0.5
    out = attention_varlen_ref(q, k, v, cu, window, scale, upcast=False, **rel)
    f32 = {key: (t.float() if key in ("c2p", "p2c") and t is not None else t) for key, t in rel.items()}
    lse = attention_lse_varlen_ref(q.float(), k.float(), cu, window, scale, **f32)
    dq, dk, dv, dbias, dc2p, dp2c = attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, window, scale, upcast=False,
                                                             **rel)
    if lut is not None:
        lut.backward(dbias.float())
    return out, dq, dk, dv, dc2p, dp2c, None if leaf is None else leaf.grad


@pytest.mark.parametrize("backend,dtype,name,lens,heads,head_dim,window,terms,buckets,with_positions", _cases())
def test_forward_backward_match_reference(backend, dtype, name, lens, heads, head_dim, window, terms, buckets,
                                          with_positions):
    dev = testing.device_for(backend)
    total = sum(lens)
    q, k, v, g = (testing.randn(total, heads, head_dim, dtype=dtype, device=dev) for _ in range(4))
    cu = _cu(lens).to(dev)
    kw, table, n = _terms(total, heads, lens, terms, buckets, with_positions, dtype, dev)
    out, grads = _grads(backend, q, k, v, g, kw, table, cu_seqlens=cu, window=window)
    kw32 = {key: (t.float() if key in ("c2p", "p2c") else t) for key, t in kw.items()}
    r_out, r_grads = _grads("reference", *(t.float() for t in (q, k, v, g)), kw32, table, cu_seqlens=cu,
                            window=window)
    lowp = (None,) * 7
    if dtype != torch.float32:
        lowp = _lowp_refs(g, q, k, v, cu, (-1, -1) if window is None else window, kw, table, n)
    names = ("out", "dq", "dk", "dv", "dc2p", "dp2c", "dtable")
    for nm, got, ref, lp in zip(names, [out] + grads, [r_out] + r_grads, lowp):
        if ref is None:
            assert got is None, nm
            continue
        assert got.dtype == (torch.float32 if nm == "dtable" else dtype), nm
        testing.assert_close(got, ref, lp, dtype=dtype, name=nm)


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _rel_inputs(b, head_dim=24)))
def test_padded_with_holes_positions_and_changed_cu_seqlens(backend):
    """Padded rows (full, left-padded, with holes, one token, empty) against the padded reference (padded indices as
    positions), gradients of c2p / p2c included; caller positions in the padded layout; then the packed layout with
    one cu_seqlens buffer rewritten between calls."""
    dev = testing.device_for(backend)
    b, s, h, d, span = 5, 33, 2, 24, 5
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i, (a, e) in enumerate([(0, 33), (5, 33), (0, 30), (7, 8), (0, 0)]):
        mask[i, a:e] = True
    mask[2, 3] = mask[2, 11:14] = False
    mask = mask.to(dev)
    q, k, v, g = (testing.randn(b, s, h, d, device=dev) for _ in range(4))
    c2p, p2c = (testing.randn(b, s, h, 2 * span, device=dev) for _ in range(2))
    table = testing.randn(32, h, device=dev)
    kw = dict(rel_span=span, position_buckets=6, max_relative_positions=14)
    res = []
    for be in (backend, "reference"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, c2p, p2c, table)]
        out = ops.attention(*leaves[:3], key_padding_mask=mask, c2p=leaves[3], p2c=leaves[4],
                            relative_bias=leaves[5], backend=be, **kw)
        out.backward(g)
        res.append([out] + [t.grad for t in leaves])
    slot = slot_lookup(s, span, 6, 14)
    want = attention_ref(q, k, v, mask, bias=distance_bias(s, table), c2p=c2p, p2c=p2c, slot=slot)
    testing.assert_close(res[0][0], want)
    assert torch.equal(res[0][0][~mask], torch.zeros_like(res[0][0][~mask]))
    for nm, got, ref in zip(("out", "dq", "dk", "dv", "dc2p", "dp2c", "dtable"), *res):
        testing.assert_close(got, ref, name=nm)
    assert torch.equal(res[0][4][~mask], torch.zeros_like(res[0][4][~mask]))  # padded tokens get no gradient

    pos = torch.randint(0, 50, (b, s), generator=testing.generator()).to(dev)
    got = ops.attention(q, k, v, c2p=c2p, p2c=p2c, positions=pos, backend=backend, **kw)
    testing.assert_close(got, attention_ref(q, k, v, c2p=c2p, p2c=p2c, positions=pos, slot=slot_lookup(50, span, 6, 14)))
    with pytest.raises(ValueError, match="contiguous run of real tokens"):
        ops.attention(q, k, v, key_padding_mask=mask, c2p=c2p, window=3, backend=backend, **kw)

    t = 150
    qp, kp, vp = (testing.randn(t, h, d, device=dev) for _ in range(3))
    cp, pp = (testing.randn(t, h, 2 * span, device=dev) for _ in range(2))
    cu = _cu((100, 50)).to(dev)
    for lens in ((100, 50), (3, 147), (150, 0)):
        cu.copy_(_cu(lens).to(dev))
        got = ops.attention(qp, kp, vp, cu_seqlens=cu, c2p=cp, p2c=pp, backend=backend, **kw)
        testing.assert_close(got, attention_varlen_ref(qp, kp, vp, cu, c2p=cp, p2c=pp,
                                                       slot=slot_lookup(max(lens), span, 6, 14)))


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _rel_inputs(b, head_dim=24)))
def test_attention_qkv_with_relative_terms_matches_attention(backend):
    """attention_qkv with positions, c2p, p2c and a table: the same output and gradients (d qkv, d c2p, d p2c,
    d table) as fastenc.ops.attention on its three column blocks."""
    dev = testing.device_for(backend)
    lens, h, d, span = (17, 1, 40), 3, 24, 4
    t = sum(lens)
    cu = _cu(lens).to(dev)
    qkv, g = testing.randn(t, 3 * h * d, device=dev), testing.randn(t, h, d, device=dev)
    c2p, p2c = (testing.randn(t, h, 2 * span, device=dev) for _ in range(2))
    pos = torch.randint(0, 60, (t,), generator=testing.generator(), dtype=torch.int32).to(dev)
    table = testing.randn(32, h, device=dev)
    res = []
    for fused in (True, False):
        leaves = [x.clone().requires_grad_(True) for x in (qkv, c2p, p2c, table)]
        kw = dict(cu_seqlens=cu, window=(5, 9), c2p=leaves[1], p2c=leaves[2], relative_bias=leaves[3],
                  positions=pos, rel_span=span, backend=backend)
        if fused:
            out = ops.attention_qkv(leaves[0], h, **kw)
        else:
            out = ops.attention(*leaves[0].view(t, 3, h, d).unbind(1), **kw)
        out.backward(g)
        res.append([out] + [x.grad for x in leaves])
    for name, a, b in zip(("out", "dqkv", "dc2p", "dp2c", "dtable"), *res):
        testing.assert_close(a, b, name=name)


# ---- the cpu kernels ----------------------------------------------------------------------------------------------

def _ext():
    if "cpu" not in testing.backends_for(OP, "cpu") or testing.cannot_serve(OP, "cpu", _rel_inputs("cpu")):
        pytest.skip("the cpu backend is not available")
    return extension.load()


def test_cpu_relative_gradients_are_deterministic_across_thread_counts():
    _ext()
    lens, h, d, span = (513, 129, 40), 2, 64, 8
    total = sum(lens)
    q, k, v, g = (testing.randn(total, h, d) for _ in range(4))
    kw = dict(rel_span=span, position_buckets=span, max_relative_positions=64,
              positions=torch.randint(0, 600, (total,), generator=testing.generator()),
              c2p=testing.randn(total, h, 2 * span), p2c=testing.randn(total, h, 2 * span))
    table = testing.randn(32, h)
    before = torch.get_num_threads()
    grads = []
    try:
        for n in (1, 2, 2):
            torch.set_num_threads(n)
            grads.append(_grads("cpu", q, k, v, g, kw, table, cu_seqlens=_cu(lens))[1][4:])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(grads[0], grads[1]):
        assert torch.equal(a, b)
    for a, b in zip(grads[1], grads[2]):
        assert torch.equal(a, b)


def test_cpu_kernels_refuse_positions_and_slots_out_of_range():
    """The kernels read positions and the slot lookup themselves: values outside [0, L) / [0, slots) are refused
    before any row is touched, never used as indices."""
    ext = _ext()
    q, k, v, g = (testing.randn(9, 2, 8) for _ in range(4))
    cu = _cu((4, 5))
    c2p = testing.randn(9, 2, 4)
    slot = slot_lookup(6, 2)  # L = 6
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 5], dtype=torch.int32)
    out, lse = ext.attention(q, k, v, cu, 5, -1, -1, 0.3, 0.0, 0, 0, None, pos, c2p, None, slot)
    bad = pos.clone()
    bad[8] = 6
    with pytest.raises((ValueError, RuntimeError), match=r"positions must lie in \[0, 6\).*positions\[8\] = 6"):
        ext.attention(q, k, v, cu, 5, -1, -1, 0.3, 0.0, 0, 0, None, bad, c2p, None, slot)
    bad[8] = -1
    with pytest.raises((ValueError, RuntimeError), match=r"positions must lie in \[0, 6\)"):
        ext.attention_bwd(g, q, k, v, out, lse, cu, 5, -1, -1, 0.3, 0.0, 0, 0, True, True, None, bad, c2p, None,
                          slot)
    with pytest.raises((ValueError, RuntimeError), match=r"slot lookup must lie in \[0, slots=4\)"):
        ext.attention(q, k, v, cu, 5, -1, -1, 0.3, 0.0, 0, 0, None, pos, c2p, None, slot + 1)
    with pytest.raises((ValueError, RuntimeError), match="covers sequences up to 3 tokens"):
        ext.attention(q, k, v, cu, 5, -1, -1, 0.3, 0.0, 0, 0, None, None, c2p, None, slot_lookup(3, 2))
    with pytest.raises(RuntimeError, match="slot must be given exactly when c2p or p2c is"):
        ext.attention(q, k, v, cu, 5, -1, -1, 0.3, 0.0, 0, 0, None, pos, c2p, None, None)
    res = ext.attention_bwd(g, q, k, v, out, lse, cu, 5, -1, -1, 0.3, 0.0, 0, 0, True, True, None, pos, c2p, None,
                            slot)
    assert len(res) == 6 and res[3].numel() == 0 and res[5].numel() == 0 and res[4].shape == c2p.shape


def test_positions_out_of_range_rejected_by_the_op():
    q = testing.randn(11, 2, 8)
    cu = _cu((6, 5))
    c2p = testing.randn(11, 2, 4)
    pos = torch.arange(11)
    pos[3] = -2
    with pytest.raises(ValueError, match=r"attention: positions must lie in \[0, .*got values in \[-2, 10\]"):
        ops.attention(q, q, q, cu_seqlens=cu, positions=pos, c2p=c2p, rel_span=2)
    pos[3] = 2 ** 40
    with pytest.raises(ValueError, match="positions must lie in"):
        ops.attention_qkv(testing.randn(11, 48), 2, cu_seqlens=cu, positions=pos, c2p=c2p, rel_span=2)


# ---- the reference ------------------------------------------------------------------------------------------------

class _ExplicitRelativeAttention(torch.autograd.Function):
    """The reference forward with the reference's explicit backward (dq, dk, dv, dlut, dc2p, dp2c) as derivative."""

    @staticmethod
    def forward(ctx, q, k, v, lut, c2p, p2c, cu, window, scale, positions, slot):
        rel = dict(bias=lut, positions=positions, c2p=c2p, p2c=p2c, slot=slot)
        out = attention_varlen_ref(q, k, v, cu, window, scale, upcast=False, **rel)
        lse = attention_lse_varlen_ref(q, k, cu, window, scale, **rel)
        ctx.save_for_backward(q, k, v, lut, c2p, p2c, out, lse, cu, positions, slot)
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, lut, c2p, p2c, out, lse, cu, positions, slot = ctx.saved_tensors
        grads = attention_bwd_varlen_ref(g, q, k, v, out, lse, cu, ctx.window, ctx.scale, bias=lut,
                                         positions=positions, c2p=c2p, p2c=p2c, slot=slot)
        return (*grads, None, None, None, None, None)


@pytest.mark.parametrize("window,with_positions", [((-1, -1), True), ((1, 2), False)], ids=["pos", "win"])
def test_reference_gradcheck_fp64(window, with_positions):
    """Both the reference's autograd (through the materialized terms) and its explicit backward formulas."""
    cu = _cu((4, 0, 1, 3))
    q, k, v = (testing.randn(8, 2, 3, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    c2p, p2c = (testing.randn(8, 2, 6, dtype=torch.float64).requires_grad_(True) for _ in range(2))
    table = testing.randn(8, 2, dtype=torch.float64).requires_grad_(True)
    n = 7 if with_positions else 4
    positions = torch.tensor([0, 6, 2, 2, 5, 1, 3, 6], dtype=torch.int32) if with_positions else None
    slot = slot_lookup(n, 3, 4, 8)

    def autograd_ref(a, b, c, t, cp, pc):
        return attention_varlen_ref(a, b, c, cu, window, 0.7, upcast=False, bias=distance_bias(n, t, 6),
                                    positions=positions, c2p=cp, p2c=pc, slot=slot)

    def explicit(a, b, c, t, cp, pc):
        return _ExplicitRelativeAttention.apply(a, b, c, distance_bias(n, t, 6), cp, pc, cu, window, 0.7, positions,
                                                slot)
    for f in (autograd_ref, explicit):
        assert torch.autograd.gradcheck(f, (q, k, v, table, c2p, p2c), fast_mode=True)


# ---- declarations and arguments -----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [OP, "attention_bwd"])
def test_every_backend_serves_the_terms(op):
    """Every backend takes positions and the disentangled terms (none declines them), and automatic selection with
    them gives a finite gradient."""
    base = dict(_rel_inputs("reference", torch.float16), positions=None, c2p=None, p2c=None, slot=None)
    impls = registry.impls(op)
    assert set(impls) == {"reference", "cpu", "triton", "cuda"}
    for backend, impl in impls.items():
        with_pos = dict(base, positions=torch.zeros(17, dtype=torch.int32))
        with_dis = dict(base, c2p=testing.fake(17, 2, 8, dtype=torch.float16), slot=torch.zeros(33, dtype=torch.int32))
        why_pos, why_dis = (impl.check(x) if impl.check else [] for x in (with_pos, with_dis))
        assert "no positions" not in why_pos and "no disentangled terms" not in why_dis, backend
    q = testing.randn(9, 2, 8).requires_grad_(True)
    out = ops.attention(q, q, q, cu_seqlens=_cu((9,)), c2p=testing.randn(9, 2, 4), rel_span=2)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_bad_relative_arguments_name_the_argument():
    q = testing.randn(2, 9, 3, 8)
    c2p = testing.randn(2, 9, 3, 6)
    bad = [
        (dict(c2p=c2p), ValueError, "rel_span must be an int >= 1, got None"),
        (dict(c2p=c2p, rel_span=2), ValueError, r"c2p must have shape \(2, 9, 3, 4\)"),
        (dict(p2c=c2p.double(), rel_span=3), TypeError, "p2c must be a tensor of q's dtype float32"),
        (dict(c2p=c2p, rel_span=3, position_buckets=8), ValueError, "max_relative_positions must be an int >= 6"),
        (dict(c2p=c2p, rel_span=3, position_buckets=1, max_relative_positions=9), ValueError,
         "position_buckets must be >= 2"),
        (dict(c2p=c2p, rel_span=3, positions=torch.zeros(2, 9)), TypeError, "positions must be an int32 or int64"),
        (dict(c2p=c2p, rel_span=3, positions=torch.zeros(18, dtype=torch.int32)), ValueError,
         r"positions must have shape \(2, 9\)"),
        (dict(positions=torch.zeros(2, 9, dtype=torch.int32)), ValueError, "positions are given but no relative term"),
    ]
    for kw, err, match in bad:
        with pytest.raises(err, match=match):
            ops.attention(q, q, q, backend="reference", **kw)


def test_relative_backward_under_opcheck():
    """fastenc::attention_bwd_bias with positions, c2p, p2c and the slot lookup passes torch.library's checks."""
    backend = "cpu" if "cpu" in testing.backends_for(OP, "cpu") else "reference"
    q, k, v, g = (testing.randn(11, 2, 8) for _ in range(4))
    cu = _cu((7, 4))
    pos = torch.tensor([0, 3, 1, 7, 2, 2, 5, 1, 0, 4, 6], dtype=torch.int32)
    rel = (distance_bias(8, testing.randn(32, 2)), pos, testing.randn(11, 2, 6), testing.randn(11, 2, 6),
           slot_lookup(8, 3))
    out, lse = torch.ops.fastenc.attention.default(q, k, v, cu, 7, -1, -1, 0.3, backend, 0.0, 0, 0, *rel)
    cases = ((True, True, (0, 1, 2, 3, 4)), (False, True, (1, 2, 4)), (True, False, (0, 3, 4)))
    for need_dq, need_dkdv, keep in cases:
        args = tuple(t if i in keep else None for i, t in enumerate(rel))
        torch.library.opcheck(torch.ops.fastenc.attention_bwd_bias.default,
                              (g, q, k, v, out, lse, cu, 7, -1, -1, 0.3, backend, 0.0, 0, 0, need_dq, need_dkdv,
                               *args))


def test_relative_terms_under_torch_compile_fullgraph():
    """positions.max() is read inside the traced graph (fastenc::positions_reach): a call with larger positions is
    served, and c2p / p2c get their gradients."""
    backend = "cpu" if "cpu" in testing.backends_for(OP, "cpu") else "reference"
    q = testing.randn(30, 2, 16).requires_grad_(True)
    c2p, p2c = (testing.randn(30, 2, 8).requires_grad_(True) for _ in range(2))
    cu = _cu((13, 17))

    def f(q, c2p, p2c, pos):
        return ops.attention(q, q, q, cu_seqlens=cu, c2p=c2p, p2c=p2c, positions=pos, rel_span=4,
                             position_buckets=4, max_relative_positions=16, backend=backend)
    compiled = torch.compile(f, fullgraph=True)
    for hi in (20, 45):
        pos = torch.randint(0, hi, (30,), generator=testing.generator())
        got, want = compiled(q, c2p, p2c, pos), f(q, c2p, p2c, pos)
        testing.assert_close(got, want)
        g = testing.randn(30, 2, 16)
        for a, b in zip(torch.autograd.grad(got, (q, c2p, p2c), g), torch.autograd.grad(want, (q, c2p, p2c), g)):
            testing.assert_close(a, b)
