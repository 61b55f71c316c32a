"""gradient_checkpointing_enable() on a model from fastenc.accelerate: honoured where fastenc's layers recompute
themselves (BERT family: each checkpointed layer is run again in the backward, fewer saved activations, the same
gradients), refused with a FallbackWarning naming it elsewhere (ModernBERT), never ignored."""
from __future__ import annotations

import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from _train import base_loss, batch, hf_model
from fastenc.models import bert
from fastenc.models.hf import FallbackWarning


def _step(model, inputs):
    """(loss, {name: grad}, bytes of the tensors autograd saved in the forward, BertLayer forwards run)."""
    saved = []
    calls = []
    real = bert.BertLayer.forward

    def counted(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    model.zero_grad(set_to_none=True)
    bert.BertLayer.forward = counted
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel() * t.element_size()), t)[1],
                                                      lambda t: t):
            out = model(**inputs)
        loss = base_loss(out.last_hidden_state, inputs["attention_mask"])
        loss.backward()
    finally:
        bert.BertLayer.forward = real
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, sum(saved), len(calls)


@pytest.mark.parametrize("every", [1, 2])
def test_bert_checkpointing_is_honoured(every):
    hf = _hf.bert("base", hidden=48, heads=3, layers=4, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0).train()
    model = fastenc.accelerate(hf)
    inputs = batch("bert", "base", lengths=[13, 70, 1, 37])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loss0, g0, saved0, calls0 = _step(model, inputs)
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False},
                                         **({"every_n_layers": every} if every > 1 else {}))
        assert hf.is_activation_checkpointing if hasattr(hf, "is_activation_checkpointing") else True
        (loss1, g1, saved1, calls1), ran = _hf.ran_fastenc(lambda: _step(model, inputs))
    assert ran, "the checkpointed call did not run fastenc"
    assert calls0 == 4 and calls1 == 4 + 4 // every  # each checkpointed layer ran again in the backward
    assert saved1 < saved0 * (0.5 if every == 1 else 0.8), (saved1, saved0)
    print(f"\nsaved-tensor bytes with checkpointing (every {every}): {saved1} / {saved0} = {saved1 / saved0:.3f}")
    assert torch.equal(loss0, loss1)
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-5, atol=1e-7), n
    hf.gradient_checkpointing_disable()
    _, _, saved2, calls2 = _step(model, inputs)
    assert calls2 == 4 and saved2 == saved0


def test_modernbert_checkpointing_is_refused_with_a_warning():
    hf = hf_model("modernbert", "base")
    model = fastenc.accelerate(hf)
    hf.gradient_checkpointing_enable()
    inputs = batch("modernbert", "base", lengths=[9, 4])
    with pytest.warns(FallbackWarning, match="gradient checkpointing"):
        out, ran = _hf.ran_fastenc(lambda: model(**inputs))
    assert not ran  # transformers' forward, which checkpoints
    model.eval()
    with warnings.catch_warnings():  # (eval mode: nothing is checkpointed, fastenc serves it)
        warnings.simplefilter("error", FallbackWarning)
        with torch.no_grad():
            _, ran = _hf.ran_fastenc(lambda: model(**inputs))
    assert ran
