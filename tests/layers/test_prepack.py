"""Prepacked CPU weights (fastenc.layers.prepack): the packed GEMM is held to the plain one by the tolerance rule,
the rule that picks it is tested, and a weight changed in place, replaced, moved or trained after packing is
seen (the model-level checks, with LoRA merge and save/reload: tests/lora/test_prepack_merge.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import testing
from fastenc.layers import Linear, prepack
from _layers import random_linear as _linear

pytest.importorskip("transformers")
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def onednn(monkeypatch):
    """oneDNN's packed GEMM as a call takes it with fastenc's extension not loaded (prepack.use_panels False)."""
    monkeypatch.setattr(prepack, "use_panels", lambda x, w: False)


def _packed_parts(lin: Linear) -> int:
    cache = lin.__dict__.get("_pack")
    return len(cache.packed) if cache is not None else 0


def _ref(x, lin, bias=True):
    b = lin.bias.double() if bias and lin.bias is not None else None
    return F.linear(x.double(), lin.weight.double(), b)


@needs_onednn
@pytest.mark.parametrize("m,k,n", [(129, 1024, 1026), (200, 1000, 141), (131, 384, 1152)],
                         ids=["129x1024x1026", "200x1000x141", "131x384x1152"])
def test_packed_matches_plain(onednn, m, k, n):
    lin = _linear(k, n)
    x = testing.randn(m, k)
    acc = testing.randn(m, n)
    with torch.inference_mode():
        y = lin(x)
        assert _packed_parts(lin) == 1, "the packed path must have run"
        testing.assert_close(y, _ref(x, lin))
        assert y.shape == (m, n) and y.is_contiguous()  # the first m rows of a GEMM run on packed_rows(m) rows
        testing.assert_close(lin(x, with_bias=False), _ref(x, lin, bias=False))
        testing.assert_close(lin.accumulate_(x, acc.clone()), acc.double() + _ref(x, lin, bias=False))
        testing.assert_close(lin(x.t().contiguous().t()), _ref(x, lin))  # a column-major x
        parts = lin.planes(x, 3)
        assert _packed_parts(lin) == 3
        testing.assert_close(torch.cat(parts, 1), _ref(x, lin))
        assert all(p.is_contiguous() and p.shape == (m, n // 3) for p in parts)


def test_packed_rows_are_few_and_waste_under_a_sixteenth():
    """The packed GEMM's row counts: never fewer rows than x, under 1/16 extra, exact below 32 and at powers of two,
    and 16 values per octave, so the row counts oneDNN keeps state for stay few however many sizes a job sees."""
    seen = set()
    for m in range(1, 20000):
        mp = prepack.packed_rows(m)
        assert m <= mp and (mp - m) * 16 < mp, (m, mp)
        seen.add(mp)
    assert all(prepack.packed_rows(m) == m for m in list(range(1, 33)) + [2 ** j for j in range(5, 15)])
    assert len([mp for mp in seen if 2 ** 10 <= mp < 2 ** 11]) == 16 and len(seen) < 32 + 16 * 10


def test_rule():
    lin = _linear(256, prepack.MIN_WEIGHT // 256)
    big, small = testing.randn(prepack.MIN_TOKENS_SMALL, 256), testing.randn(prepack.MIN_TOKENS_SMALL - 1, 256)
    with torch.no_grad():
        assert prepack.use_packed(big, lin.weight) == torch.backends.mkldnn.is_available()
        assert not prepack.use_packed(small, lin.weight)                 # too few rows to repay the call
        assert not prepack.use_packed(big, lin.weight[:-1])              # too small a weight
        assert not prepack.use_packed(big.double(), lin.weight.double())  # fp32 only
        assert not prepack.use_packed(big.unsqueeze(0), lin.weight)       # 2-D x only
        with fastenc.use_backend("reference"):
            assert not prepack.use_packed(big, lin.weight)
        lin.weight.requires_grad_(True)  # a trainable weight in a no-grad call: nothing recorded, packed
        assert prepack.use_packed(big, lin.weight) == torch.backends.mkldnn.is_available()
    assert not prepack.use_packed(big, lin.weight)                        # grad enabled: training
    lin.weight.requires_grad_(False)
    assert not prepack.use_packed(big, lin.weight)                        # grad enabled, frozen weight
    with torch.inference_mode():
        inf_w = lin.weight.clone()                                         # its in-place writes are untracked
        assert not prepack.use_packed(big, inf_w)
        lin(small)
        assert _packed_parts(lin) == 0


def test_rule_rows_by_weight_size():
    """A weight of LARGE_WEIGHT elements or more packs from MIN_TOKENS rows, a smaller one from MIN_TOKENS_SMALL:
    each side of both row thresholds, and of the size that separates them."""
    assert prepack.MIN_WEIGHT < prepack.LARGE_WEIGHT and prepack.MIN_TOKENS < prepack.MIN_TOKENS_SMALL
    on = torch.backends.mkldnn.is_available()
    large = torch.empty(prepack.LARGE_WEIGHT // 1024, 1024)
    below = large[:-1]                                   # one row under LARGE_WEIGHT elements
    x = {m: torch.empty(m, 1024) for m in (prepack.MIN_TOKENS - 1, prepack.MIN_TOKENS, prepack.MIN_TOKENS_SMALL - 1,
                                            prepack.MIN_TOKENS_SMALL)}
    assert prepack.min_rows(large) == prepack.MIN_TOKENS and prepack.min_rows(below) == prepack.MIN_TOKENS_SMALL
    with torch.no_grad():
        assert not prepack.use_packed(x[prepack.MIN_TOKENS - 1], large)
        assert prepack.use_packed(x[prepack.MIN_TOKENS], large) == on
        assert not prepack.use_packed(x[prepack.MIN_TOKENS], below)
        assert not prepack.use_packed(x[prepack.MIN_TOKENS_SMALL - 1], below)
        assert prepack.use_packed(x[prepack.MIN_TOKENS_SMALL], below) == on


@needs_onednn
def test_pack_follows_weight_changes(onednn):
    lin = _linear(400, 560)
    x = testing.randn(129, 400)  # (fastenc's own panels: tests/models/test_inference_plan.py)
    with torch.inference_mode():
        lin(x)
    first = lin.__dict__["_pack"].packed
    with torch.no_grad():
        lin.weight.mul_(-2.0)                                  # in place (LoRA merge writes like this)
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))
        assert lin.__dict__["_pack"].packed is not first
    lin.weight = torch.nn.Parameter(testing.randn(560, 400), requires_grad=False)       # replaced
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))
    lin.weight.data = testing.randn(560, 400)                    # storage swapped under the same object
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))
    lin.double()
    with torch.inference_mode():
        testing.assert_close(lin(x.double()), _ref(x, lin))  # fp64: plain path
    lin.float()
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))


@needs_onednn
def test_training_after_packing_sees_plain_weights(onednn):
    lin = _linear(240, 600)
    x = testing.randn(129, 240)
    with torch.inference_mode():
        lin(x)
    assert _packed_parts(lin) == 1
    lin.weight.requires_grad_(True)
    lin.bias.requires_grad_(True)
    xg = x.clone().requires_grad_(True)
    y = lin(xg)
    dy = testing.randn(*y.shape)
    y.backward(dy)
    testing.assert_close(y, _ref(x, lin))
    testing.assert_close(xg.grad, dy.double() @ lin.weight.double())
    testing.assert_close(lin.weight.grad, dy.double().t() @ x.double())
    with torch.no_grad():
        lin.weight.sub_(0.5 * lin.weight.grad)                # an optimizer step
    lin.requires_grad_(False)
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))
