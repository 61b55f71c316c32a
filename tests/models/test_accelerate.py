"""fastenc.accelerate: same forward signature and output type as the transformers module, no global patching,
fallback to transformers for what the fast path does not serve."""
from __future__ import annotations

import inspect

import pytest
import torch

import fastenc
import _models_hf as _hf

CASES = [("bert", "base", "BaseModelOutputWithPoolingAndCrossAttentions"),
         ("bert", "sequence_classification", "SequenceClassifierOutput"),
         ("bert", "token_classification", "TokenClassifierOutput"),
         ("modernbert", "base", "BaseModelOutput"),
         ("modernbert", "sequence_classification", "SequenceClassifierOutput"),
         ("vit", "base", "BaseModelOutputWithPooling"),
         ("vit", "image_classification", "ImageClassifierOutput")]


def _inputs(arch):
    if arch == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32)}
    ids, mask, _ = _hf.text_batch([9, 4], seed=11)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("arch,task,out_type", CASES, ids=[f"{a}-{t}" for a, t, _ in CASES])
def test_same_signature_and_output_type(arch, task, out_type):
    small = dict(layers=1, image=32, patch=8) if arch == "vit" else dict(layers=2)
    hf = getattr(_hf, arch)(task, **small)
    original_forward = type(hf).forward
    acc = fastenc.accelerate(hf)
    assert type(hf).forward is original_forward  # nothing patched
    assert type(acc).__name__ == type(hf).__name__ and isinstance(acc, type(hf))
    assert inspect.signature(acc.forward) == inspect.signature(hf.forward)
    inp = _inputs(arch)
    with torch.no_grad():
        ref = hf(**inp)
        out = acc(**inp)
    assert type(out).__name__ == out_type == type(ref).__name__
    key = "logits" if task != "base" else "last_hidden_state"
    a, b = getattr(out, key), getattr(ref, key)
    if a.dim() == 3 and "attention_mask" in inp:
        m = inp["attention_mask"].bool()
        a, b = a[m], b[m]
    assert float((a - b).abs().max()) <= 1e-4
    tup = acc(**inp, return_dict=False)
    assert isinstance(tup, tuple) and torch.equal(tup[0], getattr(out, key))


def test_fallback_to_transformers_for_unserved_options():
    hf = _hf.bert("base")
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([6, 3], seed=12)
    with torch.no_grad():
        out = acc(ids, attention_mask=mask, output_hidden_states=True)
    assert out.hidden_states is not None and len(out.hidden_states) == 3
    acc.train()
    try:
        assert acc.training and not hf.training
    finally:
        acc.eval()


def test_accelerate_rejects_unsupported():
    with pytest.raises(ValueError, match="unsupported architecture 'Linear'; supported: BertModel"):
        fastenc.accelerate(torch.nn.Linear(2, 2))


def test_labels_go_to_transformers_for_the_loss():
    hf = _hf.bert("sequence_classification")
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([6, 3], seed=13)
    with torch.no_grad():
        out = acc(ids, attention_mask=mask, labels=torch.tensor([1, 4]))
        ref = hf(ids, attention_mask=mask, labels=torch.tensor([1, 4]))
    assert out.loss is not None and float((out.loss - ref.loss).abs()) < 1e-5
