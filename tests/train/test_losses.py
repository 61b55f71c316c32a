"""Losses of the heads (labels=) against transformers': problem types given and inferred, -100 ignored, the
output types; bad labels rejected with a ValueError naming labels before any work."""
from __future__ import annotations

import pytest
import torch
from transformers import modeling_outputs as mo

import fastenc
import _models_hf as _hf
from _train import batch, hf_model

transformers = _hf.transformers


def _seqcls(arch: str, num_labels: int, problem_type=None):
    """A transformers sequence/image classification model with num_labels, eval mode."""
    base = hf_model(arch, "image_classification" if arch == "vit" else "sequence_classification")
    cfg = base.config
    cfg.num_labels, cfg.problem_type = num_labels, problem_type
    return _hf._init(type(base)(cfg), 3)


def _labels(kind: str, n: int, b: int, g: torch.Generator) -> torch.Tensor:
    if kind == "single_label_classification":
        lab = torch.randint(0, n, (b,), generator=g)
        lab[1] = -100  # ignored, as by transformers' cross-entropy
        return lab
    if kind == "regression":
        return torch.randn(b, generator=g)
    return (torch.rand(b, n, generator=g) > 0.5).float()


@pytest.mark.parametrize("arch", ["bert", "modernbert", "vit"])
@pytest.mark.parametrize("kind,n,given", [("single_label_classification", 3, False), ("regression", 1, False),
                                          ("multi_label_classification", 3, False),
                                          ("multi_label_classification", 3, True)],
                         ids=["single", "regression", "multi-inferred", "multi-given"])
def test_sequence_losses_match_transformers(arch, kind, n, given):
    hf = _seqcls(arch, n, kind if given else None)
    fe = fastenc.from_hf(hf)
    inputs = batch(arch, "base")
    b = next(iter(inputs.values())).shape[0]
    labels = _labels(kind, n, b, torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = hf(**inputs, labels=labels)
        out = fe(**inputs, labels=labels)
    assert type(out).__name__ == type(ref).__name__
    assert isinstance(out, (mo.SequenceClassifierOutput, mo.ImageClassifierOutput))
    assert fe.config.problem_type == hf.config.problem_type == kind
    assert torch.isfinite(out.loss)
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item()) + 1e-7
    assert float((out.logits - ref.logits).abs().max()) <= 1e-4


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_token_loss_ignores_minus_100(arch):
    hf = hf_model(arch, "token_classification").eval()
    fe = fastenc.from_hf(hf)
    inputs = batch(arch, "token_classification")
    inputs["labels"][0, :4] = -100  # real tokens ignored too
    with torch.no_grad():
        ref = hf(**inputs)
        out = fe(**inputs)
    assert isinstance(out, mo.TokenClassifierOutput)
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    mask = inputs["attention_mask"].bool()
    assert float((out.logits[mask] - ref.logits[mask]).abs().max()) <= 1e-4


def _no_work(model):
    def fail(*a, **k):
        raise AssertionError("the model ran before the labels were checked")
    model._encode = fail
    return model


@pytest.mark.parametrize("labels,match", [
    (torch.zeros(3, dtype=torch.long), r"labels must have shape \(4,\)"),
    (torch.zeros(4), r"labels must be an integer tensor"),  # a float tensor with the single-label problem type
    (torch.tensor([0, 1, 5, -100]), r"labels must be class indices in \[0, 5\)"),
    (torch.tensor([0, -1, 2, 3]), r"labels must be class indices"),
    ([0, 1, 2, 3], r"labels must be a tensor"),
], ids=["shape", "dtype", "range", "negative", "list"])
def test_bad_sequence_labels(labels, match):
    hf = hf_model("bert", "sequence_classification")
    hf.config.problem_type = "single_label_classification"
    fe = _no_work(fastenc.from_hf(hf))
    inputs = batch("bert", "base")
    with pytest.raises(ValueError, match=match):
        fe(**inputs, labels=labels)


@pytest.mark.parametrize("make,match", [
    (lambda s: torch.zeros(s[0], s[1] - 1, dtype=torch.long), r"labels must have input_ids' shape"),
    (lambda s: torch.zeros(s), r"labels must be an integer tensor"),
    (lambda s: torch.full(s, 3), r"labels must be class indices in \[0, 3\)"),
], ids=["shape", "dtype", "range"])
def test_bad_token_labels(make, match):
    fe = _no_work(fastenc.from_hf(hf_model("modernbert", "token_classification")))
    inputs = batch("modernbert", "base")
    with pytest.raises(ValueError, match=match):
        fe(**inputs, labels=make(tuple(inputs["input_ids"].shape)))


def test_bad_image_labels():
    fe = _no_work(fastenc.from_hf(_seqcls("vit", 3, None)))
    with pytest.raises(ValueError, match=r"labels must have shape \(3, 3\) for multi_label_classification"):
        fe(**batch("vit", "base"), labels=torch.zeros(3))


def _token_model(arch: str):
    make = {"bert": _hf.bert, "modernbert": _hf.modernbert, "distilbert": _hf.distilbert, "electra": _hf.electra,
            "roberta": _hf.roberta, "albert": _hf.albert}[arch]
    return make("token_classification", hidden=48, heads=3, layers=2).eval()


@pytest.mark.parametrize("accelerated", [False, True], ids=["from_hf", "accelerate"])
@pytest.mark.parametrize("arch", ["bert", "modernbert", "distilbert", "electra", "roberta", "albert"])
def test_token_label_on_padding_refused(arch, accelerated):
    # a label on a padded position is refused (as masked-LM labels are), before any work; -100 there is fine
    hf = _token_model(arch)
    fe = fastenc.accelerate(hf) if accelerated else _no_work(fastenc.from_hf(hf))
    ids, mask = (_hf.roberta_batch if arch == "roberta" else _hf.text_batch)([5, 9, 2])[:2]
    n = hf.config.num_labels
    labels = torch.randint(0, n, ids.shape).masked_fill(mask == 0, -100)
    row, col = 2, 4  # row 2 has 2 real tokens
    assert mask[row, col] == 0
    bad = labels.clone()
    bad[row, col] = 1
    with pytest.raises(ValueError, match=rf"labels must be -100 at padded positions.* got 1 at \({row}, {col}\)"):
        fe(input_ids=ids, attention_mask=mask, labels=bad)
    if accelerated:  # -100 on padding: transformers' loss
        with torch.no_grad():
            got, ref = fe(input_ids=ids, attention_mask=mask, labels=labels), hf(input_ids=ids, attention_mask=mask,
                                                                                  labels=labels)
        assert abs(got.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
