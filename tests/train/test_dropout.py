"""Dropout in training mode where transformers has it: over many seeds, the loss of fastenc and of transformers
(same weights, same batch, dropout on everywhere) has the same mean and spread; eval mode turns dropout off."""
from __future__ import annotations

import math

import pytest
import torch

import fastenc
from _train import batch, hf_model

DROP = {"bert": dict(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2, classifier_dropout=0.3),
        "modernbert": dict(embedding_dropout=0.2, attention_dropout=0.2, mlp_dropout=0.2, classifier_dropout=0.3),
        "vit": dict(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)}
CASES = [("bert", "sequence_classification"), ("modernbert", "token_classification"),
         ("vit", "image_classification")]
DRAWS = 32


def _losses(model, inputs: dict, seed: int) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i in range(DRAWS):
            torch.manual_seed(seed + i)
            out.append(model(**inputs).loss)
    return torch.stack(out).double()


@pytest.mark.parametrize("arch,task", CASES, ids=[a for a, _ in CASES])
def test_dropout_loss_statistics_match_transformers(arch, task):
    hf = hf_model(arch, task, **DROP[arch])
    fe = fastenc.from_hf(hf).train()
    inputs = batch(arch, task, lengths=[9, 23, 1, 14])
    ref, got = _losses(hf, inputs, 0), _losses(fe, inputs, 10_000)
    assert float(ref.std()) > 0 and float(got.std()) > 0  # (dropout is on)
    se = math.sqrt(float(ref.var()) / DRAWS + float(got.var()) / DRAWS)
    assert abs(float(got.mean() - ref.mean())) <= 4 * se, (float(got.mean()), float(ref.mean()), se)
    ratio = float(got.std() / ref.std())
    assert 0.6 <= ratio <= 1.0 / 0.6, ratio
    hf.eval()
    fe.eval()
    with torch.no_grad():
        a, b = fe(**inputs).loss, fe(**inputs).loss
        assert torch.equal(a, b)
        assert abs(float(a - hf(**inputs).loss)) <= 1e-5 * abs(float(a))


SITES = [("bert", "sequence_classification", k) for k in DROP["bert"]] + \
        [("modernbert", "token_classification", k) for k in DROP["modernbert"]] + \
        [("vit", "image_classification", k) for k in DROP["vit"]]


@pytest.mark.parametrize("arch,task,knob", SITES, ids=[f"{a}-{k}" for a, _, k in SITES])
def test_each_dropout_knob_acts_in_training_only(arch, task, knob):
    # Only this knob on: two training forwards draw different masks (the knob reaches a dropout), eval is exact.
    off = {"bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0),
           "modernbert": {}, "vit": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}[arch]
    hf = hf_model(arch, task, **{**off, knob: 0.3})
    fe = fastenc.from_hf(hf).train()
    inputs = batch(arch, task, lengths=[9, 17, 1])
    with torch.no_grad():
        a, b = (fe(**inputs).loss for _ in range(2))
        assert not torch.equal(a, b)
        fe.eval()
        assert torch.equal(fe(**inputs).loss, fe(**inputs).loss)
