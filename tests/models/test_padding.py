"""Unpadded execution: padded vs unpadded equivalence, a batch equals its sequences one by one, packed output."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.padding import PackedBatch, pad_input, unpad_input


def test_unpad_pad_round_trip():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    idx, cu, longest = unpad_input(mask)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 6, 6, 7] and longest == 4
    x = torch.randn(4, 4, 3)
    packed = x.reshape(16, 3)[idx]
    back = pad_input(packed, idx, 4, 4)
    assert torch.equal(back[mask], x[mask]) and torch.all(back[~mask] == 0)
    b = PackedBatch(mask, 4, 4, "cpu")
    assert torch.equal(b.first_tokens(packed)[2], torch.zeros(3))  # empty sequence pools to zeros
    assert torch.allclose(b.mean(packed)[1], x[1].mean(0))


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_batch_equals_one_by_one(arch):
    hf = _hf.bert() if arch == "bert" else _hf.modernbert(layers=3)
    fe = fastenc.from_hf(hf)
    lengths = [5, 150, 1, 64] if arch == "modernbert" else [5, 100, 1, 64]
    ids, mask, _ = _hf.text_batch(lengths, seed=5)
    out = fe(ids, mask)
    for i, n in enumerate(lengths):
        alone = fe(ids[i:i + 1, :n])
        assert float((out[i, :n] - alone[0]).abs().max()) <= 1e-5
        assert torch.all(out[i, n:] == 0)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_padded_equals_unpadded(arch):
    hf = _hf.bert() if arch == "bert" else _hf.modernbert(layers=2)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([30, 30, 30], seed=6)
    full = fe(ids)  # no mask: nothing to unpad
    extra = torch.cat([ids, torch.zeros(3, 9, dtype=ids.dtype)], 1)
    emask = torch.cat([mask, torch.zeros(3, 9, dtype=mask.dtype)], 1)
    padded = fe(extra, emask)
    assert float((padded[:, :30] - full).abs().max()) <= 1e-5
    x, batch = fe(extra, emask, return_packed=True)
    assert x.shape == (90, fe.config.hidden_size)
    assert batch.cu_seqlens.tolist() == [0, 30, 60, 90] and batch.max_seqlen == 30
    assert torch.equal(batch.pad(x), padded)


def test_encode_pooling_and_normalize():
    fe = fastenc.from_hf(_hf.bert())
    ids, mask, _ = _hf.text_batch([7, 20, 3], seed=7)
    hidden = fe(ids, mask)
    m = mask.unsqueeze(-1).float()
    mean = (hidden * m).sum(1) / m.sum(1)
    seqs = [ids[i, :n].tolist() for i, n in enumerate([7, 20, 3])]
    got = fe.encode(seqs, pooling="mean", batch_size=2)
    assert float((got - mean).abs().max()) <= 1e-5
    cls = fe.encode(ids, mask, pooling="cls", normalize=True)
    assert float((cls - torch.nn.functional.normalize(hidden[:, 0], dim=-1)).abs().max()) <= 1e-5
    with pytest.raises(ValueError, match="tokenizer"):
        fe.encode(["no tokenizer here"])
    with pytest.raises(ValueError, match="pooling"):
        fe.encode(seqs, pooling="max")
