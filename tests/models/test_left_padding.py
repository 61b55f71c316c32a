"""Left-padded batches and masks with holes: fastenc.accelerate gives transformers' result (transformers pools column
0, padding or not); native models pool each row's first real token everywhere; ModernBERT's local window is
measured in padded columns, as transformers measures it."""
from __future__ import annotations

import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models.hf import FallbackWarning

TOL = 1e-4


def _left(lengths, seed):
    ids, mask, types = _hf.text_batch(lengths, seed=seed)
    return ids.flip(1), mask.flip(1), types.flip(1)


def _close(out, ref, tol=TOL):
    assert out.shape == ref.shape and torch.isfinite(out).all()
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e}"


HEADS = [("bert", "base", "cls"), ("bert", "sequence_classification", "cls"), ("bert", "token_classification", "cls"),
         ("modernbert", "base", "cls"), ("modernbert", "sequence_classification", "cls"),
         ("modernbert", "sequence_classification", "mean"), ("modernbert", "token_classification", "cls")]


@pytest.mark.parametrize("arch,task,pooling", HEADS, ids=[f"{a}-{t}-{p}" for a, t, p in HEADS])
def test_accelerate_left_padding_matches_transformers(arch, task, pooling):
    if arch == "bert":
        hf = _hf.bert(task, hidden=64, heads=4)
        ids, mask, types = _left([17, 1, 40, 29], seed=3)
        kw = {"attention_mask": mask, "token_type_ids": types}
    else:  # 3 layers: global, local (window 16 each side), local; padding within the window
        hf = _hf.modernbert(task, layers=3, pooling=pooling, local_attention=32)
        ids, mask, _ = _left([40, 30, 26, 33], seed=4)
        kw = {"attention_mask": mask}
    acc = fastenc.accelerate(hf)
    with torch.no_grad():
        ref = hf(ids, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out, fast = _hf.ran_fastenc(lambda: acc(ids, **kw))
    assert fast
    m = mask.bool()
    if task == "base":
        _close(out.last_hidden_state[m], ref.last_hidden_state[m])
        _close(out.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])  # the padded column 0, as transformers
        if arch == "bert":
            _close(out.pooler_output, ref.pooler_output)
    elif task == "token_classification":
        _close(out.logits[m], ref.logits[m])
    else:
        _close(out.logits, ref.logits)


def test_accelerate_left_padding_beyond_the_window_falls_back():
    # Column 0 of a row padded past the local half-window sees no key there: transformers' masked softmax is then
    # uniform over padding, which fastenc does not compute; the call says so and gives transformers' result.
    hf = _hf.modernbert("sequence_classification", layers=2, local_attention=32)
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _left([40, 20], seed=5)
    with torch.no_grad():
        with pytest.warns(FallbackWarning, match=r"left padding longer than half the local window \(16 columns\)"):
            out, fast = _hf.ran_fastenc(lambda: acc(ids, attention_mask=mask))
        ref = hf(ids, attention_mask=mask)
    assert not fast and torch.equal(out.logits, ref.logits)


def test_native_pooling_reads_the_first_real_token():
    hf = _hf.bert("sequence_classification")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _left([17, 5, 9], seed=6)
    hidden = fastenc.from_hf(_hf.bert("base"))(ids, mask, types)  # same weights (seed 0) without the head
    first = hidden[torch.arange(3), mask.int().argmax(1)]
    pooled = torch.tanh(fe.pooler(first))
    _close(fe.pool(hidden, mask), pooled, tol=1e-6)
    _close(fe(ids, mask, types), fe.classifier(pooled), tol=1e-5)
    assert float((fe.pool(hidden) - pooled).abs().max()) > 1e-3  # column 0 is padding (zeros) here
    _close(fe.pool(hidden, torch.ones_like(mask)), fe.pool(hidden), tol=0)
    mb = fastenc.from_hf(_hf.modernbert("sequence_classification", layers=2))
    ids, mask, _ = _left([30, 12], seed=7)
    with torch.no_grad():  # (as encode runs: the same inference path, the cpu backend's plan included)
        x, batch = mb._encode(ids, mask)
    h = batch.pad(x)
    first = h[torch.arange(2), mask.int().argmax(1)]
    _close(mb(ids, mask), mb.classifier(mb.head(first)), tol=1e-5)
    _close(mb.encode(ids, mask, pooling="cls"), first, tol=1e-6)


@pytest.mark.parametrize("task", ["base", "token_classification"])
def test_modernbert_window_over_a_mask_with_holes(task):
    # Holes inside a row: transformers measures the local window in padded columns (not in real tokens).
    hf = _hf.modernbert(task, layers=3, local_attention=32)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([60, 40, 50, 1], seed=8)
    mask[0, 10:25] = 0
    mask[2, 3:5] = 0
    mask[2, 30:31] = 0
    ids = ids * mask
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
    ref = ref.last_hidden_state if task == "base" else ref.logits
    out = fe(ids, mask)
    m = mask.bool()
    _close(out[m], ref[m])
    assert torch.all(out[~m] == 0)
    acc = fastenc.accelerate(hf)
    with torch.no_grad():
        got = acc(ids, attention_mask=mask)
    _close((got.last_hidden_state if task == "base" else got.logits)[m], ref[m])
