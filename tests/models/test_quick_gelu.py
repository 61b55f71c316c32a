"""A config's hidden_act = "quick_gelu" (CLIP's x * sigmoid(1.702 x)) runs fastenc's GELU op with
approximate="quick" in every place a model applies its activation: BERT's MLP (planned CPU forward, the op with the
fused bias, and its backward), ModernBERT's GeGLU and their heads, held to transformers."""
from __future__ import annotations

import pytest
import torch

import fastenc
from fastenc import ops, testing
from fastenc.layers.mlp import activation
import _models_hf as _hf


def test_activation_name_maps_to_quick():
    x, b = testing.randn(7, 383, scale=3.0), testing.randn(383)
    t = x + b
    testing.assert_close(activation("quick_gelu", x, b), t * torch.sigmoid(1.702 * t))


def _asked_quick(monkeypatch):
    """Records the approximate= of every fastenc gelu / geglu call."""
    seen = []
    for name in ("gelu", "geglu"):
        real = getattr(ops, name)

        def spy(*a, _real=real, **kw):
            seen.append(kw.get("approximate"))
            return _real(*a, **kw)

        monkeypatch.setattr(ops, name, spy)
    return seen


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "with-grad"])
def test_bert_quick_gelu_matches_transformers(grad):
    hf = _hf.bert("base", hidden=72, heads=3, layers=2, hidden_act="quick_gelu")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([17, 5, 9], seed=3)
    with torch.set_grad_enabled(grad):
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        out = fe(ids, attention_mask=mask, token_type_ids=types)
    err = float((out - ref).detach()[mask.bool()].abs().max())
    assert err <= 1e-4, err
    if grad:  # through the quick GELU's backward: the first MLP weight's gradient as transformers'
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        (out * w)[mask.bool()].sum().backward()
        (ref * w)[mask.bool()].sum().backward()
        hf_fc1 = hf.encoder.layer[0].intermediate.dense.weight.grad
        fe_fc1 = [p.grad for n, p in fe.named_parameters() if n.endswith("fc1.weight")][0]
        testing.assert_close(fe_fc1, hf_fc1.double(), name="fc1.weight grad")


def test_bert_quick_gelu_runs_the_quick_op(monkeypatch):
    seen = _asked_quick(monkeypatch)
    hf = _hf.bert("base", hidden=64, heads=4, layers=1, hidden_act="quick_gelu")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([9, 4], seed=1)
    with torch.no_grad(), fastenc.use_backend("reference"):
        fe(ids, attention_mask=mask, token_type_ids=types)
    assert seen and set(seen) == {"quick"}


def test_modernbert_quick_gelu_matches_transformers():
    hf = _hf.modernbert("base", hidden=48, heads=3, layers=2, hidden_activation="quick_gelu")
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([23, 9], seed=2)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
        out = fe(ids, attention_mask=mask)
    err = float((out - ref)[mask.bool()].abs().max())
    assert err <= 1e-4, err
