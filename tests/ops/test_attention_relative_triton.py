"""Triton attention with relative-position terms (per-token positions, DeBERTa-v2/v3's disentangled c2p / p2c, with
and without the distance bias): the kernels forward and backward against a materializing formula under the tolerance
rule (fp32 forward and gradients, fp16 forward) over lengths 1, 17 and 129, head dims 16 and 64, packed batches,
a padded batch with holes, a window and log-bucketed slots; then through fastenc.ops.attention / attention_qkv
against the reference backend; positions and slots out of their tables read clamped; bad arguments named; the new
kernel variants compile for Hopper."""
import os
import subprocess
import sys

import pytest
import torch

from fastenc import ops, testing

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run under TRITON_INTERPRET=1

from fastenc.kernels.attention import attention_fwd  # noqa: E402
from fastenc.kernels.attention_bwd import attention_bwd  # noqa: E402


@pytest.fixture(autouse=True)
def _backend_selected(request):
    """Each test runs where its backend does (cuda: a GPU; triton: a GPU or the interpreter) and is selected
    (FASTENC_TEST_BACKENDS)."""
    need = "cuda" if "cuda" in request.node.name else "triton"
    if need not in testing.backends_for("attention"):
        pytest.skip(f"the {need} backend of attention does not run here or is not selected")


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)


def _log_bucket(rel, bucket_size, max_position):
    """transformers' deberta_v2 make_log_bucket_position, on float64 distances."""
    sign = torch.sign(rel)
    mid = bucket_size // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1).type_as(rel), torch.abs(rel))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign)


def _slot_lut(n, rel_span, buckets=0, max_pos=512):
    """slot(d) = clamp(bucket(d) + rel_span, 0, 2 rel_span - 1) for d = -(n-1)..n-1: int32 (2n - 1,)."""
    d = torch.arange(-(n - 1), n, dtype=torch.float64)
    if buckets > 0:
        d = _log_bucket(d, buckets, max_pos)
    return (d.long() + rel_span).clamp(0, 2 * rel_span - 1).to(torch.int32)


def _materialized(q, k, v, cu, window, scale, bias, pos, c2p, p2c, slot):
    """softmax(scale q.k + bias[pos_i - pos_j] + c2p[i, slot] + p2c[j, slot]) v per sequence, in q's dtype, with
    the (seq, seq) scores materialized; positions clamped to [0, L) as the kernels read them."""
    n = ((bias if bias is not None else slot).shape[-1] + 1) // 2
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        s = b - a
        idx = torch.arange(s, device=q.device)
        p = idx if pos is None else pos[a:b].long().clamp(0, n - 1)
        dist = p[:, None] - p[None, :]
        sc = torch.einsum("ihd,jhd->hij", q[a:b], k[a:b]) * scale
        if bias is not None:
            sc = sc + bias[:, dist + n - 1].to(sc.dtype)
        if slot is not None:
            sl = slot.long()[dist + n - 1].clamp(0, (c2p if c2p is not None else p2c).shape[-1] - 1)
            hh = torch.arange(q.shape[1], device=q.device)[:, None, None]
            if c2p is not None:
                sc = sc + c2p[a:b].transpose(0, 1)[hh, idx[:, None], sl[None]]
            if p2c is not None:
                sc = sc + p2c[a:b].transpose(0, 1)[hh, idx[None, :], sl[None]]
        i, j = idx[:, None], idx[None, :]
        keep = torch.ones(s, s, dtype=torch.bool, device=q.device)
        if window is not None:
            keep = (j >= i - window[0]) & (j <= i + window[1])
        sc = sc.masked_fill(~keep, float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", sc.softmax(-1), v[a:b]))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


def _inputs(lens, heads, d, terms, with_pos, rel_span=5, buckets=0, dtype=torch.float32, extra_len=3):
    """q, k, v, g, cu, bias, positions, c2p, p2c, slot of fresh random values; terms: 'b' bias, 'c' c2p, 'q' p2c.
    The lookups cover L = longest + extra_len (positions reach past the longest sequence)."""
    total = sum(lens)
    q, k, v, g = (testing.randn(total, heads, d, dtype=dtype, device=DEV) for _ in range(4))
    n = max(lens) + extra_len
    bias = testing.randn(heads, 2 * n - 1, device=DEV) if "b" in terms else None
    slots = 2 * rel_span
    c2p = testing.randn(total, heads, slots, dtype=dtype, device=DEV) if "c" in terms else None
    p2c = testing.randn(total, heads, slots, dtype=dtype, device=DEV) if "q" in terms else None
    slot = _slot_lut(n, rel_span, buckets).to(DEV) if c2p is not None or p2c is not None else None
    pos = None
    if with_pos:
        gen = testing.generator()
        pos = torch.randint(0, n, (total,), generator=gen, dtype=torch.int32).to(DEV)
    return q, k, v, g, _cu(lens), bias, pos, c2p, p2c, slot


# (id, lengths, heads, head_dim, window, terms, positions, log buckets)
CASES = [
    ("s1-c2p", (1,), 2, 16, None, "c", False, 0),
    ("s17-p2c-d64", (17,), 2, 64, None, "q", False, 0),
    ("varlen-both", (17, 1, 0, 5), 3, 16, None, "cq", False, 0),
    ("s129-both-bias", (129, 3), 2, 16, None, "bcq", False, 0),
    ("win-both-pos", (40, 9), 2, 16, (5, 3), "cq", True, 0),
    ("pos-bias-d64", (23, 7), 2, 64, None, "b", True, 0),
    ("pos-all-buckets", (33, 20), 2, 16, None, "bcq", True, 8),
]


def _run(lens, heads, d, window, terms, with_pos, buckets, dtype, backward=True):
    q, k, v, g, cu, bias, pos, c2p, p2c, slot = _inputs(lens, heads, d, terms, with_pos, buckets=buckets,
                                                        dtype=dtype)
    wl, wr = window or (-1, -1)
    scale = d ** -0.5
    out, lse = attention_fwd(q, k, v, cu, max(lens), wl, wr, scale, 0.0, 0, 0, bias, pos, c2p, p2c, slot)
    leaves = [None if t is None else t.detach().double().requires_grad_(True) for t in (q, k, v, bias, c2p, p2c)]
    ref = _materialized(*leaves[:3], cu, window, scale, leaves[3], pos, leaves[4], leaves[5], slot)
    lowp = None
    if dtype != torch.float32:
        lowp = _materialized(q, k, v, cu, window, scale, bias, pos, c2p, p2c, slot)
    testing.assert_close(out, ref, lowp, dtype=dtype, name="out")
    if not backward:
        return
    grads = attention_bwd(g, q, k, v, out, lse, cu, max(lens), wl, wr, scale, 0.0, 0, 0, True, True, bias, pos,
                          c2p, p2c, slot)
    ref.backward(g.double())
    assert len(grads) == 6
    for name, got, leaf in zip(("dq", "dk", "dv", "dbias", "dc2p", "dp2c"), grads, leaves):
        if leaf is None:
            assert got.numel() == 0, name
            continue
        assert got.dtype == (dtype if name in ("dq", "dk", "dv") else torch.float32) and got.shape == leaf.shape, name
        testing.assert_close(got, leaf.grad, name=name)


@pytest.mark.parametrize("name,lens,heads,head_dim,window,terms,with_pos,buckets", CASES, ids=[c[0] for c in CASES])
def test_fp32_forward_backward_match_materialized(name, lens, heads, head_dim, window, terms, with_pos, buckets):
    _run(lens, heads, head_dim, window, terms, with_pos, buckets, torch.float32)


FP16 = [c for c in CASES if c[0] in ("s17-p2c-d64", "s129-both-bias", "win-both-pos")]


@pytest.mark.parametrize("name,lens,heads,head_dim,window,terms,with_pos,buckets", FP16, ids=[c[0] for c in FP16])
def test_fp16_forward_matches_materialized(name, lens, heads, head_dim, window, terms, with_pos, buckets):
    _run(lens, heads, head_dim, window, terms, with_pos, buckets, torch.float16, backward=False)


def test_padded_batch_with_holes_uses_padded_positions():
    """A padded batch whose mask has holes, packed with each token's padded index as its position, equals the padded
    attention over the real keys with relative terms of the padded distances (what MPNet and DeBERTa compute)."""
    b, s, h, d, span = 3, 21, 2, 16, 4
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, 3:6] = False
    mask[1, 0] = mask[1, 10] = mask[1, 20] = False
    mask[2, 7:] = False
    q, k, v = (testing.randn(b, s, h, d, device=DEV) for _ in range(3))
    c2p, p2c = (testing.randn(b, s, h, 2 * span, device=DEV) for _ in range(2))
    bias = testing.randn(h, 2 * s - 1, device=DEV)
    slot = _slot_lut(s, span).to(DEV)
    m = mask.to(DEV).reshape(-1)
    pos = torch.arange(s, dtype=torch.int32, device=DEV).repeat(b)[m]
    cu = _cu(mask.sum(1).tolist())
    packed = [t.reshape(b * s, *t.shape[2:])[m].contiguous() for t in (q, k, v, c2p, p2c)]
    out, _ = attention_fwd(*packed[:3], cu, s, -1, -1, d ** -0.5, 0.0, 0, 0, bias, pos, packed[3], packed[4], slot)
    # padded reference: full (s, s) scores per sequence, padded keys masked out
    idx = torch.arange(s, device=DEV)
    dist = idx[:, None] - idx[None, :] + s - 1
    sl = slot.long()[dist]
    hh = torch.arange(h, device=DEV)[:, None, None]
    want = []
    for r in range(b):
        sc = torch.einsum("ihd,jhd->hij", q[r], k[r]) * d ** -0.5 + bias[:, dist]
        sc = sc + c2p[r].transpose(0, 1)[hh, idx[:, None], sl[None]]
        sc = sc + p2c[r].transpose(0, 1)[hh, idx[None, :], sl[None]]
        sc = sc.masked_fill(~mask[r].to(DEV)[None, None, :], float("-inf"))
        want.append(torch.einsum("hij,jhd->ihd", sc.softmax(-1), v[r])[mask[r].to(DEV)])
    testing.assert_close(out, torch.cat(want))


def test_positions_and_slots_outside_their_tables_read_clamped():
    """Kernels clamp what they read from positions and slot: values outside [0, L) and [0, slots) never reach memory
    outside the tables (the result is the formula's with the clamped values)."""
    lens, h, d, span = (19, 6), 2, 16, 3
    q, k, v, g, cu, bias, _, c2p, p2c, _ = _inputs(lens, h, d, "bcq", False, rel_span=span)
    n = (bias.shape[1] + 1) // 2
    gen = testing.generator()
    pos = torch.randint(-2 * n, 3 * n, (sum(lens),), generator=gen, dtype=torch.int32).to(DEV)
    slot = torch.randint(-5, 2 * span + 5, (2 * n - 1,), generator=gen, dtype=torch.int32).to(DEV)
    out, lse = attention_fwd(q, k, v, cu, max(lens), -1, -1, 0.25, 0.0, 0, 0, bias, pos, c2p, p2c, slot)
    testing.assert_close(out, _materialized(q, k, v, cu, None, 0.25, bias, pos, c2p, p2c, slot))
    grads = attention_bwd(g, q, k, v, out, lse, cu, max(lens), -1, -1, 0.25, 0.0, 0, 0, True, True, bias, pos,
                          c2p, p2c, slot)
    assert all(torch.isfinite(t).all() for t in grads)


def test_gradients_of_the_terms_alone():
    """need_dq / need_dkdv false: the dQ kernel still runs for dc2p and the dK/dV kernel for dp2c, and the unneeded
    gradients come back empty."""
    q, k, v, g, cu, _, pos, c2p, p2c, slot = _inputs((17, 4), 2, 16, "cq", True)
    out, lse = attention_fwd(q, k, v, cu, 17, -1, -1, 0.25, 0.0, 0, 0, None, pos, c2p, p2c, slot)
    full = attention_bwd(g, q, k, v, out, lse, cu, 17, -1, -1, 0.25, 0.0, 0, 0, True, True, None, pos, c2p, p2c,
                         slot)
    part = attention_bwd(g, q, k, v, out, lse, cu, 17, -1, -1, 0.25, 0.0, 0, 0, False, False, None, pos, c2p, p2c,
                         slot)
    assert [t.numel() for t in part[:4]] == [0, 0, 0, 0]
    testing.assert_close(part[4], full[4], name="dc2p")
    testing.assert_close(part[5], full[5], name="dp2c")


def test_bad_arguments_are_named():
    q, k, v, g, cu, bias, pos, c2p, p2c, slot = _inputs((9,), 2, 16, "bcq", True)
    args = (q, k, v, cu, 9, -1, -1, 0.25, 0.0, 0, 0)
    with pytest.raises(ValueError, match="slot must be given exactly when c2p or p2c is"):
        attention_fwd(*args, bias, pos, c2p, p2c, None)
    with pytest.raises(ValueError, match="positions must be int32"):
        attention_fwd(*args, bias, pos.long(), c2p, p2c, slot)
    with pytest.raises(ValueError, match="positions needs a relative term"):
        attention_fwd(*args, None, pos, None, None, None)
    with pytest.raises(ValueError, match="c2p must be"):
        attention_fwd(*args, bias, pos, c2p[:, :1], p2c, slot)
    with pytest.raises(ValueError, match="c2p and p2c must have one number of slots"):
        attention_fwd(*args, bias, pos, c2p, p2c[..., :4], slot)
    with pytest.raises(ValueError, match="slot and bias must have one length"):
        attention_fwd(*args, bias, pos, c2p, p2c, _slot_lut(10, 5).to(DEV))
    with pytest.raises(ValueError, match="cover sequences up to 5 tokens"):
        attention_fwd(*args, None, None, c2p, p2c, _slot_lut(5, 5).to(DEV))


def test_new_variants_in_the_compile_check_and_compile_for_hopper():
    """The relative variants are in compile_specs (tests/build/test_triton_compile.py compiles them all, forward and
    backward, for sm_90 and sm_80 without spills); the fullest forward variant compiles for sm_90 here too."""
    from fastenc.kernels import attention, attention_bwd as bwd

    names = [s["name"] for s in attention.compile_specs() + bwd.compile_specs()]
    rel = [n for n in names if "_rel" in n]
    for part in ("relp_", "relc_", "relq_", "relcq_", "relpcq_"):
        assert any(part in n for n in rel), part
    fwd = "attention_bf16_d64_window_dropout_bias_relpcq_cfg80"
    dq = "attention_bwd_dq_bf16_d64_window_dropout_bias_relpcq_cfg90"
    assert fwd in names and dq in names
    code = ("import sys\nfrom fastenc.kernels import attention, attention_bwd\nfrom fastenc.kernels._compile import "
            "compile_for\nspecs = {s['name']: s for s in attention.compile_specs() + attention_bwd.compile_specs()}\n"
            "for n in sys.argv[1:]:\n    r = compile_for(specs[n], 90)\n"
            "    print(n, r['registers'], r['spill_stores'] + r['spill_loads'])\n")
    env = {k: val for k, val in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    p = subprocess.run([sys.executable, "-c", code, fwd], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.split("\n") if ln.startswith(fwd + " "))
    assert line.split()[2] == "0", f"{line}: spills on sm_90"


# Through the public ops, against the reference backend: (id, layout, lengths | (batch, seq), heads, head_dim,
# window, terms ('b' relative_bias, 'c' c2p, 'q' p2c), positions given, position_buckets)
OP_CASES = [
    ("packed-pos-bias-both", "packed", (17, 1, 5), 2, 16, None, "bcq", True, 0),
    ("packed-win-c2p-d64", "packed", (40, 9), 2, 64, (6, 2), "c", False, 0),
    ("padded-holes-both-buckets", "holes", (3, 19), 2, 16, None, "cq", False, 8),
    ("padded-pos-p2c-bias", "padded", (2, 17), 3, 16, None, "bq", True, 0),
]


def _op_inputs(layout, shape, heads, d, terms, with_pos, dtype):
    lead = (sum(shape),) if layout == "packed" else shape
    q, k, v, g = (testing.randn(*lead, heads, d, dtype=dtype, device=DEV) for _ in range(4))
    span = 3
    kw = {"rel_span": span}
    if "b" in terms:
        kw["relative_bias"] = testing.randn(16, heads, device=DEV)
        kw["relative_max_distance"] = 40
    for name, letter in (("c2p", "c"), ("p2c", "q")):
        if letter in terms:
            kw[name] = testing.randn(*lead, heads, 2 * span, dtype=dtype, device=DEV)
    if layout == "packed":
        kw["cu_seqlens"] = _cu(shape)
    else:
        mask = torch.ones(shape, dtype=torch.bool)
        if layout == "holes":
            mask[0, 4:7] = False
            mask[1, 0] = mask[1, 12] = False
            mask[2, 9:] = False
        kw["key_padding_mask"] = mask.to(DEV)
    if with_pos:
        gen = testing.generator()
        kw["positions"] = torch.randint(0, max(shape) + 4, lead, generator=gen).to(DEV)
    return q, k, v, g, kw


def _op_grads(backend, q, k, v, g, kw, window, buckets):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in
              dict(q=q, k=k, v=v, **{n: kw[n] for n in ("c2p", "p2c", "relative_bias") if n in kw}).items()}
    args = _with_buckets(dict(kw, **{n: t for n, t in leaves.items() if n not in "qkv"}), buckets)
    out = ops.attention(leaves["q"], leaves["k"], leaves["v"], window=window, backend=backend, **args)
    out.backward(g)
    return out, {n: t.grad for n, t in leaves.items()}


# fp32 every case; fp16 (forward) the first three (interpreter time)
OP_PARAMS = [(dt,) + c for dt in (torch.float32, torch.float16) for c in OP_CASES[:4 if dt == torch.float32 else 3]]


@pytest.mark.parametrize("dtype,name,layout,shape,heads,head_dim,window,terms,with_pos,buckets", OP_PARAMS,
                         ids=[f"{testing.dtype_id(c[0])}-{c[1]}" for c in OP_PARAMS])
def test_op_matches_reference_backend(dtype, name, layout, shape, heads, head_dim, window, terms, with_pos, buckets):
    """fastenc.ops.attention with backend='triton' (forward; fp32 also every gradient: q, k, v, c2p, p2c and the
    bucket table) against backend='reference' in fp32 (and in fp16 for the tolerance rule's low-precision error)."""
    q, k, v, g, kw = _op_inputs(layout, shape, heads, head_dim, terms, with_pos, dtype)
    if dtype != torch.float32:
        out = ops.attention(q, k, v, window=window, backend="triton", **_with_buckets(kw, buckets))
        f32 = {n: (t.float() if n in ("c2p", "p2c") else t) for n, t in kw.items()}
        ref = ops.attention(q.float(), k.float(), v.float(), window=window, backend="reference",
                            **_with_buckets(f32, buckets))
        lowp = ops.attention(q, k, v, window=window, backend="reference", **_with_buckets(kw, buckets))
        testing.assert_close(out, ref, lowp, dtype=dtype)
        return
    out, grads = _op_grads("triton", q, k, v, g, kw, window, buckets)
    ref, want = _op_grads("reference", q, k, v, g, kw, window, buckets)
    testing.assert_close(out, ref)
    assert set(grads) == set(want)
    for n in want:
        testing.assert_close(grads[n], want[n], name=f"d{n}")


def _with_buckets(kw, buckets):
    return dict(kw, position_buckets=buckets, max_relative_positions=24) if buckets else kw


def test_attention_qkv_with_disentangled_terms():
    """attention_qkv (one fused QKV buffer) with positions and c2p / p2c on the Triton backend: forward and the
    gradients of the buffer, c2p and p2c against the reference backend."""
    lens, h, d, span = (13, 6), 2, 16, 4
    total = sum(lens)
    qkv = testing.randn(total, 3 * h * d, device=DEV)
    c2p, p2c = (testing.randn(total, h, 2 * span, device=DEV) for _ in range(2))
    pos = torch.randint(0, 20, (total,), generator=testing.generator()).to(DEV)
    g = testing.randn(total, h, d, device=DEV)

    def run(backend):
        leaves = [t.detach().clone().requires_grad_(True) for t in (qkv, c2p, p2c)]
        out = ops.attention_qkv(leaves[0], heads=h, cu_seqlens=_cu(lens), positions=pos, c2p=leaves[1],
                                p2c=leaves[2], rel_span=span, backend=backend)
        out.reshape(g.shape).backward(g)
        return out, [t.grad for t in leaves]

    out, grads = run("triton")
    ref, want = run("reference")
    testing.assert_close(out, ref)
    for n, a, b in zip(("dqkv", "dc2p", "dp2c"), grads, want):
        testing.assert_close(a, b, name=n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=testing.dtype_id)
def test_cuda_forward_and_backward_match_reference(dtype):
    """The CUDA kernel (forward; its backward is the Triton kernel's) with positions, log-bucketed c2p / p2c and the
    bucket table, lengths 129, 17 and 1, against the reference in fp32 and in dtype (tolerance rule)."""
    lens, h, d, span = (129, 17, 1), 3, 64, 8
    total = sum(lens)
    q, k, v, g = (testing.randn(total, h, d, dtype=dtype, device=DEV) for _ in range(4))
    c2p, p2c = (testing.randn(total, h, 2 * span, dtype=dtype, device=DEV) for _ in range(2))
    table = testing.randn(32, h, device=DEV)
    pos = torch.randint(0, 200, (total,), generator=testing.generator()).to(DEV)
    kw = dict(cu_seqlens=_cu(lens), positions=pos, rel_span=span, position_buckets=span, max_relative_positions=64)

    def run(backend, cast):
        leaves = [t.detach().clone().to(cast or t.dtype).requires_grad_(True) for t in (q, k, v, c2p, p2c)]
        tab = table.detach().clone().requires_grad_(True)
        out = ops.attention(*leaves[:3], c2p=leaves[3], p2c=leaves[4], relative_bias=tab, backend=backend, **kw)
        out.backward(g.to(out.dtype))
        return [out] + [t.grad for t in leaves] + [tab.grad]

    got, ref, lowp = run("cuda", None), run("reference", torch.float32), run("reference", None)
    for name, a, r, lp in zip(("out", "dq", "dk", "dv", "dc2p", "dp2c", "dtable"), got, ref, lowp):
        testing.assert_close(a, r, lp, dtype=dtype, name=name)
