"""The per-forward CPU inference plan of BERT's and ModernBERT's blocks (fastenc.ops.direct.Plan) and the panel GEMM
(fastenc.layers.prepack.use_panels, csrc/cpu/gemm.cpp): outputs held to transformers and to the public ops, the
plan taken only where it applies, cu_seqlens checked once by the plan and still by the public op."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import extension, ops, testing
from fastenc.layers import Linear, prepack
from _layers import random_linear as _linear
from fastenc.layers import MLP, SelfAttention
from fastenc.ops.direct import Plan
import _models_hf as _hf


@pytest.fixture
def planned(monkeypatch):
    """Counts the blocks run through a plan (one attention call each: the tokens it ran on)."""
    calls = []
    real = Plan.attention

    def spy(self, q, k, v, window=None):
        calls.append(q.shape[0])
        return real(self, q, k, v, window)

    monkeypatch.setattr(Plan, "attention", spy)
    return calls


@pytest.fixture
def embed_norms(monkeypatch):
    """Counts the embeddings' LayerNorms run through a plan (the only ones with a residual)."""
    calls = []
    real = Plan.layer_norm

    def spy(self, norm, x, residual=None, input_bias=None):
        if residual is not None:
            calls.append(x.shape[0])
        return real(self, norm, x, residual, input_bias)

    monkeypatch.setattr(Plan, "layer_norm", spy)
    return calls


@pytest.mark.parametrize("lengths", [[16], [5], [17, 1, 40]], ids=["1x16", "1x5", "mixed"])
def test_planned_forward_matches_transformers(planned, embed_norms, lengths):
    hf = _hf.bert("base", hidden=72, heads=3, layers=2)  # head_dim 24, intermediate 152 (a partial GEMM panel)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch(lengths, seed=len(lengths))
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        out = fe(ids, attention_mask=mask, token_type_ids=types)
    assert planned == [sum(lengths)] * 2
    assert embed_norms == [sum(lengths)]
    err = float((out - ref)[mask.bool()].abs().max())
    assert err <= 1e-4, err
    planned.clear()
    with torch.no_grad(), fastenc.use_backend("reference"):  # the backend choice still decides: no plan
        out_ref = fe(ids, attention_mask=mask, token_type_ids=types)
    assert planned == []
    testing.assert_close(out[mask.bool()], out_ref[mask.bool()].double())


def test_no_plan_with_grad_or_in_training(planned):
    hf = _hf.bert("base", hidden=64, heads=4, layers=1)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([9, 4])
    fe.requires_grad_(False)
    with torch.enable_grad():
        fe(ids, attention_mask=mask)
    fe.train()
    with torch.no_grad():
        fe(ids, attention_mask=mask)
    assert planned == []
    fe.eval()
    with torch.inference_mode():
        fe(ids, attention_mask=mask)
    assert planned == [13]


def test_plan_checks_cu_seqlens_once_and_the_op_still_does():
    x = testing.randn(10, 32)
    norm = fastenc.layers.LayerNorm(32)
    bad = torch.tensor([0, 7, 5, 10], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            Plan.make(x, bad, 4, norm)
        with pytest.raises(ValueError, match="cu_seqlens must end at total_tokens=10"):
            Plan.make(x, torch.tensor([0, 4, 9], dtype=torch.int32), 4, norm)
        q = x.view(10, 4, 8)
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            ops.attention(q, q, q, cu_seqlens=bad)
        assert Plan.make(x.double(), torch.tensor([0, 10], dtype=torch.int32), 4, norm) is None  # fp32 only
    assert Plan.make(x, torch.tensor([0, 10], dtype=torch.int32), 4, norm) is None  # grad mode on


@pytest.mark.parametrize("rows,path", [(5, "panels"), (33, "plain"), (140, "panels")],
                         ids=["panel-gemm", "plain-gemm", "tall-panel-gemm"])
def test_qkv_attention_reads_q_k_v_in_place(monkeypatch, rows, path):
    if path == "plain":
        monkeypatch.setattr(prepack, "use_panels", lambda x, w: False)
        monkeypatch.setattr(prepack, "use_packed", lambda x, w: False)
    hidden, heads = 48, 3
    attn = SelfAttention(hidden, heads)
    lin = attn.Wqkv
    with torch.no_grad():
        lin.weight.copy_(testing.randn(3 * hidden, hidden, scale=hidden ** -0.5))
        lin.bias.copy_(testing.randn(3 * hidden))
    x = testing.randn(rows, hidden)
    cu = torch.tensor([0, 2, rows], dtype=torch.int32)
    with torch.no_grad():
        plan = Plan.make(x, cu, heads, fastenc.layers.LayerNorm(hidden))
        assert plan is not None
        out = attn.attend(x, cu, rows, plan=plan)
        q, k, v = F.linear(x, lin.weight, lin.bias).view(rows, 3, heads, hidden // heads).unbind(1)
        ref = ops.attention(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens=cu, backend="reference")
        # the kernel on strided q, k, v gives exactly what it gives on contiguous copies
        same = extension.load().attention(q, k, v, cu, rows, -1, -1, 0.25, 0.0, 0, 0)[0]
        dense = extension.load().attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, rows, -1, -1, 0.25,
                                           0.0, 0, 0)[0]
    testing.assert_close(out, ref.reshape(rows, hidden).double())
    assert torch.equal(same, dense)


@pytest.fixture
def panels_only(monkeypatch):
    """The panel GEMM at every row count (FASTENC_GEMM=panels): the measured choice of prepack.panels_chosen may
    give torch's GEMM from CHOICE_MIN_ROWS rows (tests/models/test_gemm_choice.py)."""
    monkeypatch.setattr(prepack, "_MODE", ["panels"])


def _panels(lin: Linear) -> int:
    cache = lin.__dict__.get("_panels")
    return len(cache.packed) if cache is not None else 0


@pytest.mark.parametrize("m,k,n", [(1, 7, 3), (16, 33, 41), (13, 384, 1152), (6, 1000, 16)],
                         ids=["1x7x3", "16x33x41", "13x384x1152", "6x1000x16"])
def test_few_row_gemm_matches_plain(panels_only, m, k, n):
    extension.load()
    lin = _linear(k, n)
    x = testing.randn(m, k)
    acc = testing.randn(m, n)
    ref = F.linear(x.double(), lin.weight.double(), lin.bias.double())
    nob = F.linear(x.double(), lin.weight.double())
    with torch.inference_mode():
        testing.assert_close(lin(x), ref)
        assert _panels(lin) == 1, "the few-row GEMM must have run"
        testing.assert_close(lin(x, with_bias=False), nob)
        testing.assert_close(lin.accumulate_(x, acc.clone()), acc.double() + nob)
        wide = testing.randn(m, 2 * k)[:, :k].copy_(x)  # rows k apart inside a wider buffer
        testing.assert_close(lin(wide), ref)
        testing.assert_close(lin(x.t().contiguous().t()) if m > 1 else lin(x), ref)  # column-major x: plain GEMM


def test_planes_on_panels(panels_only):
    # Linear.planes (the inference QKV outside a plan): one panel GEMM per block of the weight, each plane contiguous
    extension.load()
    lin = _linear(96, 150)
    x = testing.randn(140, 96)
    with torch.inference_mode():
        parts = lin.planes(x, 3)
        assert _panels(lin) == 3 and "_pack" not in lin.__dict__
    testing.assert_close(torch.cat(parts, 1), F.linear(x.double(), lin.weight.double(), lin.bias.double()))
    assert all(p.is_contiguous() and p.shape == (140, 50) for p in parts)


def test_panel_rule_both_sides(panels_only):
    extension.load()
    w = torch.empty(64, 32)
    with torch.no_grad():
        for rows in (1, 128, 129, 5000):  # every row count: the few-row loop up to 128, the blocked one above
            assert prepack.use_panels(torch.empty(rows, 32), w)
        assert not prepack.use_panels(torch.empty(0, 32), w)
        assert not prepack.use_panels(torch.empty(4, 32).double(), w.double())
        assert not prepack.use_panels(torch.empty(32, 4).t(), w)          # column-major x
        with fastenc.use_backend("reference"):
            assert not prepack.use_panels(torch.empty(4, 32), w)
    assert not prepack.use_panels(torch.empty(4, 32), w)                  # grad mode on
    lin = _linear(32, 64)
    with torch.inference_mode():
        lin(testing.randn(300, 32))
        assert _panels(lin) == 1
        assert "_pack" not in lin.__dict__  # oneDNN's pack only without the extension: no second copy


def test_few_row_panels_follow_weight_changes(panels_only):
    extension.load()
    lin = _linear(40, 56)
    x = testing.randn(3, 40)
    with torch.inference_mode():
        lin(x)
    first = lin.__dict__["_panels"].packed
    with torch.no_grad():
        lin.weight.mul_(-2.0)                                    # in place (LoRA merge writes like this)
    with torch.inference_mode():
        testing.assert_close(lin(x), F.linear(x.double(), lin.weight.double(), lin.bias.double()))
        assert lin.__dict__["_panels"].packed is not first
    lin.weight = torch.nn.Parameter(testing.randn(56, 40), requires_grad=False)       # replaced
    with torch.inference_mode():
        testing.assert_close(lin(x), F.linear(x.double(), lin.weight.double(), lin.bias.double()))
    lin.double()
    assert "_panels" not in lin.__dict__
    with torch.inference_mode():
        testing.assert_close(lin(x.double()), F.linear(x.double(), lin.weight, lin.bias))  # fp64: plain path


def test_few_row_gemm_bad_input_is_named():
    ext = extension.load()
    w = testing.randn(20, 8)
    packed = ext.gemm_pack(w)
    with pytest.raises(RuntimeError, match="gemm_packed: packed must be"):
        ext.gemm_packed(testing.randn(2, 9), packed, 20, None, None, False, None)
    with pytest.raises(RuntimeError, match="gemm_packed: bias must be"):
        ext.gemm_packed(testing.randn(2, 8), packed, 20, testing.randn(19), None, False, None)
    with pytest.raises(RuntimeError, match="gemm_packed: out must be"):
        ext.gemm_packed(testing.randn(2, 8), packed, 20, None, testing.randn(3, 20), True, None)
    with pytest.raises(RuntimeError, match="gemm_pack: weight must be 2-D float32"):
        ext.gemm_pack(w.double())


def _gemm_case(m: int, k: int, n: int):
    """The extension, a random (n, k) weight's panels, bias (n,), x (m, k), a residual (m, n) and x W^T + b in fp64."""
    ext = extension.load()
    w, bias = testing.randn(n, k), testing.randn(n)
    x, acc = testing.randn(m, k), testing.randn(m, n)
    return ext, ext.gemm_pack(w), bias, x, acc, F.linear(x.double(), w.double(), bias.double())


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [1, 5, 7, 16, 24, 25, 61, 127, 128])
@pytest.mark.parametrize("k,n", [(67, 151), (1031, 4005)], ids=["67x151", "1031x4005"])
def test_few_row_gemm_thread_ranges_and_prefetch(k, n, m, threads):
    # Every panel written once whatever the split of panels over the team (1031 x 4005 is past the parallel
    # threshold from 1 row) and whatever the row blocks' prefetch of the next panel (the first 4 row blocks, the
    # whole next panel over 1-4 of them): odd k, a partial last panel, 1-4 and more row blocks (a partial last one
    # at 25, 61 and 127 rows), into a poisoned strided output, with bias and residual.
    ext, packed, bias, x, acc, ref = _gemm_case(m, k, n)
    with _threads(threads):
        out = testing.randn(m, n + 3)[:, :n].fill_(float("nan"))
        testing.assert_close(ext.gemm_packed(x, packed, n, bias, out, False, None), ref)
        testing.assert_close(ext.gemm_packed(x, packed, n, bias, acc.clone(), True, None), ref + acc.double())


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m,k,n", [(129, 67, 151), (300, 2100, 300), (1000, 1031, 40), (257, 5000, 70)],
                         ids=["129x67x151", "300x2100x300", "1000x1031x40", "257x5000x70"])
def test_tall_gemm_blocks_bit_for_bit(m, k, n, threads):
    # Above 128 rows the GEMM runs in row blocks and k blocks of at most 1024 steps (2100: three blocks, 5000:
    # five), the team splitting the panels or, for a narrow weight (40, 70 columns: under 4 panels a thread), the
    # row blocks. The sum keeps its order, so the tall result equals the few-row loop's on slices of <= 128 rows
    # bit for bit, with bias, residual and GELU; and both hold to fp64.
    ext, packed, bias, x, acc, ref = _gemm_case(m, k, n)
    with _threads(threads):
        for gelu in (None, "tanh"):
            out = testing.randn(m, n + 3)[:, :n].fill_(float("nan"))
            tall = ext.gemm_packed(x, packed, n, bias, out, False, gelu)
            tall_acc = ext.gemm_packed(x, packed, n, bias, acc.clone(), True, gelu)
            rows = [slice(i, min(i + 128, m)) for i in range(0, m, 128)]
            sliced = torch.cat([ext.gemm_packed(x[r], packed, n, bias, None, False, gelu) for r in rows])
            sliced_acc = torch.cat([ext.gemm_packed(x[r], packed, n, bias, acc[r].clone(), True, gelu) for r in rows])
            assert torch.equal(tall, sliced) and torch.equal(tall_acc, sliced_acc)
            want = ref if gelu is None else F.gelu(ref, approximate="tanh")
            want_acc = ref + acc.double() if gelu is None else F.gelu(ref + acc.double(), approximate="tanh")
            testing.assert_close(tall, want)
            testing.assert_close(tall_acc, want_acc)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("m,k,n", [(1, 7, 3), (16, 33, 41), (7, 96, 152)], ids=["1x7x3", "16x33x41", "7x96x152"])
def test_few_row_gemm_gelu_epilogue(m, k, n, approximate):
    # bias + GELU in the GEMM's epilogue against fp64, partial panels (n not a multiple of the panel width), partial
    # row blocks, into a wider buffer; the MLP's first projection through the plan takes it
    extension.load()
    lin = _linear(k, n)
    x = testing.randn(m, k, scale=2.0)
    ref = F.gelu(F.linear(x.double(), lin.weight.double(), lin.bias.double()), approximate=approximate)
    out = testing.randn(m, n + 5)[:, :n].fill_(float("nan"))  # poisoned, rows n + 5 apart
    with torch.inference_mode():
        packed = lin._packed(lin.weight, panels=True)[0]
        got = prepack.panel_gemm(x, packed, n, lin.bias, out, gelu=approximate)
        testing.assert_close(got, ref)
        assert got.data_ptr() == out.data_ptr()
        plan = Plan(extension.load(), torch.tensor([0, m], dtype=torch.int32), m, False)
        mlp = MLP(k, n, "gelu" if approximate == "none" else "gelu_new")
        mlp.fc1 = lin
        testing.assert_close(mlp.hidden(x, plan), ref)
        big = testing.randn(300, k)  # a tall x: the blocked loop, the GELU after the last k block
        big_ref = F.gelu(F.linear(big.double(), lin.weight.double(), lin.bias.double()), approximate=approximate)
        testing.assert_close(mlp.hidden(big, plan), big_ref)
        with pytest.MonkeyPatch.context() as mp:  # the plain GEMM, then the GELU kernel
            mp.setattr(prepack, "use_panels", lambda x, w: False)
            testing.assert_close(mlp.hidden(big, plan), big_ref)
    with pytest.raises(RuntimeError, match="gemm_packed: gelu must be None, 'none' or 'tanh', got 'erf'"):
        extension.load().gemm_packed(x, packed, n, None, None, False, "erf")


def test_position_check_reads_the_mask_only_past_the_table():
    fe = fastenc.from_hf(_hf.bert("base", hidden=64, heads=4, layers=1))  # a 160-row position table
    ids, mask, types = _hf.text_batch([150, 7], seq=170)  # padding past the table: allowed
    with torch.no_grad():
        out = fe(ids, attention_mask=mask, token_type_ids=types)
        testing.assert_close(out[:, :160][mask[:, :160].bool()],
                             fe(ids[:, :160], attention_mask=mask[:, :160],
                                token_type_ids=types[:, :160])[mask[:, :160].bool()].double())
        mask[1, 165] = 1
        with pytest.raises(ValueError, match=r"sequence length 166 exceeds the position table"):
            fe(ids, attention_mask=mask)


@pytest.mark.parametrize("lengths,bias", [([16], False), ([40, 13, 1], False), ([23, 9], True)],
                         ids=["1x16", "mixed", "mixed-bias"])
def test_modernbert_planned_forward_matches_transformers(planned, lengths, bias):
    # pre-norm GeGLU blocks with RoPE through the plan: a global layer and a local one whose 8-token window is
    # shorter than the longest row; biases on every linear and norm in one case
    calls = planned
    hf = _hf.modernbert("base", hidden=48, heads=3, layers=2, local_attention=8, attention_bias=bias,
                        mlp_bias=bias, norm_bias=bias)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch(lengths, seed=len(lengths))
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
        out = fe(ids, attention_mask=mask)
    assert calls == [sum(lengths)] * 2
    err = float((out - ref)[mask.bool()].abs().max())
    assert err <= 1e-4, err
    calls.clear()
    with torch.no_grad(), fastenc.use_backend("reference"):  # the backend choice still decides: no plan
        out_ref = fe(ids, attention_mask=mask)
    with torch.no_grad():
        fe.train()
        fe(ids, attention_mask=mask)
    assert calls == []
    testing.assert_close(out[mask.bool()], out_ref[mask.bool()].double())
